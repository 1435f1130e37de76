"""pdml-ray: priorities derived online from measurements, acted on by Ray-based training runtimes."""

from pdml_ray.config import ContinuityConfig, NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.errors import ConfigError, PDMLError, PlanError
from pdml_ray.telemetry import NodeDecision, SamplePlan, WorkerReport

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ContinuityConfig",
    "NodeDecision",
    "NodePriorityConfig",
    "PDMLConfig",
    "PDMLError",
    "PlanError",
    "SamplePlan",
    "SamplePriorityConfig",
    "WorkerReport",
]
