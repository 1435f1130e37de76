"""What a Ray Train run (``PDMLTrainer``) requires of a config beyond the config's own checks, in one
place: ``PDMLTrainer`` applies it before launching anything and ``pdml-ray validate-config`` applies
the same, so a file it calls valid does not fail at the start of a run."""

from __future__ import annotations

from pdml_ray.config.gradient import load_priority_fn
from pdml_ray.config.pdml import PDMLConfig


def check_ray_train(config: PDMLConfig, num_workers: int | None = None, *, import_user_code: bool = True) -> None:
    """Raise ``ConfigError`` naming the field unless ``config`` can run under ``PDMLTrainer``: node
    priorities set with a global batch size (which ``num_workers`` workers, when given, can split
    within min_batch and max_batch), and, with ``import_user_code``, a ``priority_fn`` that imports
    and takes one report (importing it runs the user's module)."""
    node = config.node
    if num_workers is None:
        node.batch  # noqa: B018 - raises when the global batch size is missing
    else:
        node.check_workers(num_workers)
    gradient = config.gradient_priority
    if import_user_code and gradient is not None and gradient.priority_fn is not None:
        load_priority_fn(gradient.priority_fn)
