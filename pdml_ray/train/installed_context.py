"""The context a Ray Train worker's loop runs with: ``PDMLTrainer``'s worker wrapper installs one per
worker process before the user's loop and clears it after, a ``PDMLContext`` (``get_context``) or, in
a run with ``PDMLConfig.pipeline``, a ``PipelineContext`` (``get_pipeline_context``). Ray-free.
"""

from __future__ import annotations

from typing import TypeVar

from pdml_ray.errors import UsageError
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.pipeline import PipelineContext

_installed: PDMLContext | PipelineContext | None = None  # this worker process's, while PDMLTrainer runs the loop

Context = TypeVar("Context", PDMLContext, PipelineContext)


def _installed_as(kind: type[Context], missing: str) -> Context:
    """The installed context if it is a ``kind``; else ``missing`` as a UsageError."""
    if not isinstance(_installed, kind):
        raise UsageError(missing)
    return _installed


def get_context() -> PDMLContext:
    """The pdml-ray context of this Ray Train worker (inside a loop run by ``PDMLTrainer``)."""
    return _installed_as(PDMLContext, "pdml_ray.train.get_context() is only available inside a training loop "
                                      "launched by pdml_ray.train.PDMLTrainer (a pipeline run's loop takes "
                                      "pdml_ray.train.get_pipeline_context())")


def get_pipeline_context() -> PipelineContext:
    """The pipeline context of this Ray Train worker (inside a loop ``PDMLTrainer`` runs with ``pipeline`` set)."""
    return _installed_as(PipelineContext, "pdml_ray.train.get_pipeline_context() is only available inside a "
                                          "training loop launched by pdml_ray.train.PDMLTrainer with "
                                          "PDMLConfig(pipeline=PipelineConfig(stages=...))")


def set_context(context: PDMLContext | PipelineContext | None) -> None:
    """Install (or clear, with None) this process's context, of either kind; ``PDMLTrainer``'s worker
    wrapper calls it."""
    global _installed
    _installed = context
