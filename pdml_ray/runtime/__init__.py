"""Drivers of the Ray-actor runtimes: each launches its shells in ``pdml_ray.actors`` (the same name
there), carries out the core's plans and decisions on them, and reaches the run's scheduler through
``SchedulerClient``.

    pipeline.py         ``PipelineRuntime``: stages x replicas of stage actors running each step's plan
    pipeline_plans.py   ``ScheduledPlans``: the pipeline runtime's client of the scheduler, plans a step ahead
    pipeline_faults.py  surviving stage replicas that die during a step
    stragglers.py       ``StragglerRuntime``, ``WorkerPool``: the straggler-tolerant aggregator's loop
    p3_ps.py            ``P3ParameterServer``: P3 over parameter-server shards

Each runtime imports Ray and torch, so the names here are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdml_ray.runtime.p3_ps import P3ParameterServer
    from pdml_ray.runtime.pipeline import PipelineRuntime
    from pdml_ray.runtime.pipeline_plans import ScheduledPlans
    from pdml_ray.runtime.stragglers import StragglerRuntime, StragglerStallError, WorkerPool

_MODULES = {"P3ParameterServer": "p3_ps", "PipelineRuntime": "pipeline", "ScheduledPlans": "pipeline_plans",
            "StragglerRuntime": "stragglers", "StragglerStallError": "stragglers", "WorkerPool": "stragglers"}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"pdml_ray.runtime.{_MODULES[name]}"), name)
    raise AttributeError(f"module 'pdml_ray.runtime' has no attribute {name!r}")
