"""pdml-ray: priorities derived online from measurements, acted on by Ray-based training runtimes.

The public API is what ``__all__`` lists; Ray-dependent pieces live in ``pdml_ray.train``
(``PDMLTrainer``, ``get_context``) and ``pdml_ray.runtime.pipeline`` (``PipelineRuntime``,
``compare_schedules``), imported from there so ``import pdml_ray`` stays free of Ray.
"""

from pdml_ray.config import (DEFAULT_ACCELERATOR_PRIOR, ContinuityConfig, NodePriorityConfig, OspreyConfig,
                             PDMLConfig, PipelineConfig, SamplePriorityConfig)
from pdml_ray.errors import ConfigError, PDMLError, PlanError
from pdml_ray.pipeline import Action, Plan, make_scheduler, validate
from pdml_ray.pipeline.partition import split_sequential
from pdml_ray.scheduler import Scheduler
from pdml_ray.telemetry import NodeDecision, SamplePlan, WorkerReport

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ACCELERATOR_PRIOR",
    "Action",
    "ConfigError",
    "ContinuityConfig",
    "NodeDecision",
    "NodePriorityConfig",
    "OspreyConfig",
    "PDMLConfig",
    "PDMLError",
    "PipelineConfig",
    "Plan",
    "PlanError",
    "SamplePlan",
    "SamplePriorityConfig",
    "Scheduler",
    "WorkerReport",
    "make_scheduler",
    "split_sequential",
    "validate",
]
