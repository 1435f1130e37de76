"""Ray Train integration: ``PDMLTrainer`` and the in-loop context (``get_context``).

``PDMLTrainer`` (and with it Ray) is imported on first use, so the worker-side pieces
(``pdml_ray.train.context``, ``step``, ``wrappers``, ``timing``) import without Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdml_ray.train.context import PDMLContext, StepBatch, get_context

if TYPE_CHECKING:
    from pdml_ray.train.trainer import PDMLRunInfo, PDMLTrainer

__all__ = ["PDMLContext", "PDMLRunInfo", "PDMLTrainer", "StepBatch", "get_context"]


def __getattr__(name: str) -> Any:
    if name in ("PDMLTrainer", "PDMLRunInfo"):
        from pdml_ray.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'pdml_ray.train' has no attribute {name!r}")
