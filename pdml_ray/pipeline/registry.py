"""The one registry of pipeline schedules: name -> "module:Class", imported on first use.

Schedule names are written here and nowhere else: configs, the CLI and the benchmarks read them
from ``SCHEDULERS`` and ``STATIC_SCHEDULES``. This module imports nothing at load time, so configs
can validate names against it without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Sequence

from pdml_ray.errors import ConfigError

if TYPE_CHECKING:
    from pdml_ray.pipeline.plan import PipelineScheduler

SCHEDULERS: dict[str, str] = {
    "gpipe": "pdml_ray.pipeline.static:GPipeScheduler",
    "1f1b": "pdml_ray.pipeline.static:OneFOneBScheduler",
    "1f1b-weighted": "pdml_ray.pipeline.static:WeightedOneFOneBScheduler",
    "critical-path": "pdml_ray.pipeline.static:CriticalPathScheduler",
    "osprey": "pdml_ray.pipeline.osprey:OspreyScheduler",
    "auto": "pdml_ray.pipeline.auto:AutoScheduler",
}

STATIC_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "1f1b-weighted", "critical-path")
"""Schedules whose plan is fixed before the step and run strictly in order (osprey's warm start and
auto's static side are chosen from these)."""


def make_scheduler(name: str, *, stages: int, replicas: int | Sequence[int], microbatches: int,
                   config: Any = None) -> PipelineScheduler:
    """Build scheduler ``name`` for ``stages`` x ``replicas`` (an int, or one count per stage).

    ``config`` is a ``pdml_ray.config.PipelineConfig`` (or None for defaults).
    """
    if name not in SCHEDULERS:
        raise ConfigError(f"unknown pipeline schedule {name!r}; valid names: {sorted(SCHEDULERS)}")
    module_name, cls_name = SCHEDULERS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    reps = (int(replicas),) * stages if isinstance(replicas, int) else tuple(int(r) for r in replicas)
    return cls(stages=stages, replicas=reps, microbatches=microbatches, config=config)
