"""Pipeline scheduling: plans over stages x replicas, static schedules, osprey, simulator.

Pure python/numpy; nothing here imports ray. The Ray-actor runtime (``pdml_ray.runtime.pipeline``)
runs the same ``Plan`` objects through the same ``Dispatcher`` as the simulator.
"""

from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.plan import Action, Kind, Measurement, PipelineScheduler, Plan, format, validate
from pdml_ray.pipeline.registry import SCHEDULERS, make_scheduler

__all__ = ["Action", "Dispatcher", "Kind", "Measurement", "PipelineScheduler", "Plan", "SCHEDULERS",
           "format", "make_scheduler", "validate"]
