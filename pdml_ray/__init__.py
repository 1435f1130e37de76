"""pdml-ray: priorities derived online from measurements, acted on by Ray-based training runtimes.

The public API is what ``__all__`` lists; everything here is free of Ray. Ray-dependent pieces are
imported from their own packages: ``pdml_ray.train`` (``PDMLTrainer``, ``get_context``) and
``pdml_ray.runtime.pipeline`` (``PipelineRuntime``).

Layers (imports only point down; ``tests/unit/test_layering.py`` enforces it):

    pdml_ray/cli/, pdml_ray/bench/          entry points and benchmarks
    pdml_ray/train/, pdml_ray/runtime/      Ray Train integration (P3 ordering: train/p3_sync.py); Ray-actor
                                            runtime drivers (pipeline, stragglers, P3 parameter server)
    pdml_ray/actors/                        thin Ray actor shells around core classes
    pdml_ray/metrics.py                     ray.util.metrics export of the stats records
    ---- nothing below imports ray ----
    pdml_ray/scheduler.py, client.py        the controller (a registry of derivers; its records and report log:
                                            scheduler_stats.py); its worker-side client
    pdml_ray/priority/, pdml_ray/pipeline/  derivers (node, sample, gradient) and their estimators; pipeline plans
    pdml_ray/stragglers/, pdml_ray/p3/      straggler policies and gradient codes; P3 slicing, queues, link model
    pdml_ray/config/, decisions.py, batching.py, emulation.py, errors.py
                                            configs, frozen records, the rounding rule, emulated speeds, errors
    replay.py, state_format.py              one replay path for every axis; saved state as data (never a pickle)
"""

from pdml_ray.config import (DEFAULT_ACCELERATOR_PRIOR, ContinuityConfig, GradientPriorityConfig, NodePriorityConfig,
                             OspreyConfig, P3Config, PDMLConfig, PipelineConfig, SamplePriorityConfig, StragglerConfig)
from pdml_ray.decisions import Boundary, NodeDecision, SampleDecision, SamplePlan, StepBundle, WorkerReport
from pdml_ray.errors import (ConfigError, NonFiniteError, PDMLError, PlanError, ReportError, ResultError,
                             SchedulerUnavailableError, StateError, UsageError)
from pdml_ray.pipeline import Action, Plan, make_schedule, validate
from pdml_ray.scheduler import Scheduler, SchedulerStats

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``split_sequential`` needs torch: imported on first use, so ``import pdml_ray`` (and the CLI's
    ``--help``) stays free of it."""
    if name == "split_sequential":
        from pdml_ray.pipeline.partition import split_sequential

        return split_sequential
    raise AttributeError(f"module 'pdml_ray' has no attribute {name!r}")

__all__ = [
    "DEFAULT_ACCELERATOR_PRIOR",
    "Action",
    "Boundary",
    "ConfigError",
    "ContinuityConfig",
    "GradientPriorityConfig",
    "NodeDecision",
    "NonFiniteError",
    "NodePriorityConfig",
    "OspreyConfig",
    "P3Config",
    "PDMLConfig",
    "PDMLError",
    "PipelineConfig",
    "Plan",
    "PlanError",
    "ReportError",
    "ResultError",
    "SampleDecision",
    "SamplePlan",
    "SamplePriorityConfig",
    "Scheduler",
    "SchedulerStats",
    "SchedulerUnavailableError",
    "StateError",
    "StragglerConfig",
    "StepBundle",
    "UsageError",
    "WorkerReport",
    "make_schedule",
    "split_sequential",
    "validate",
]
