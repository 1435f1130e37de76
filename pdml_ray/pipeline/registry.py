"""The one registry of pipeline schedulers: name -> "module:Class", imported on first use."""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from pdml_ray.pipeline.plan import PipelineScheduler

SCHEDULERS: dict[str, str] = {
    "gpipe": "pdml_ray.pipeline.static:GPipeScheduler",
    "1f1b": "pdml_ray.pipeline.static:OneFOneBScheduler",
    "critical-path": "pdml_ray.pipeline.static:CriticalPathScheduler",
    "osprey": "pdml_ray.pipeline.osprey:OspreyScheduler",
    "auto": "pdml_ray.pipeline.auto:AutoScheduler",
}


def make_scheduler(name: str, *, stages: int, replicas: int | Sequence[int], microbatches: int,
                   config: Any = None) -> PipelineScheduler:
    """Build scheduler ``name`` for ``stages`` x ``replicas`` (an int, or one count per stage).

    ``config`` is a ``pdml_ray.config.PipelineConfig`` (or None for defaults).
    """
    if name not in SCHEDULERS:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid names: {sorted(SCHEDULERS)}")
    module_name, cls_name = SCHEDULERS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    reps = (int(replicas),) * stages if isinstance(replicas, int) else tuple(int(r) for r in replicas)
    return cls(stages=stages, replicas=reps, microbatches=microbatches, config=config)
