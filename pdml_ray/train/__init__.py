"""Ray Train integration: ``PDMLTrainer`` and the in-loop context (``get_context``)."""

from pdml_ray.train.context import PDMLContext, StepBatch
from pdml_ray.train.trainer import PDMLResult, PDMLTrainer, get_context

__all__ = ["PDMLContext", "PDMLResult", "PDMLTrainer", "StepBatch", "get_context"]
