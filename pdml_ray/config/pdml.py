"""``PDMLConfig``: every component's config in one place, loadable from a dict or YAML."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdml_ray.config.checks import require
from pdml_ray.config.continuity import ContinuityConfig
from pdml_ray.config.gradient import GradientPriorityConfig
from pdml_ray.config.loading import load_dataclass
from pdml_ray.config.node import NodePriorityConfig
from pdml_ray.config.p3 import P3Config
from pdml_ray.config.pipeline import PipelineConfig
from pdml_ray.config.sample import SamplePriorityConfig
from pdml_ray.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class PDMLConfig:
    """Everything pdml-ray needs to know, one section per component."""

    node_priority: NodePriorityConfig = field(default_factory=NodePriorityConfig)
    sample_priority: SamplePriorityConfig | None = None
    """None (the default) keeps uniform sampling: a seeded permutation per epoch."""
    gradient_priority: GradientPriorityConfig | None = None
    """None (the default) derives no gradient priorities; set it for the straggler runtime's top-K and
    async policies (``pdml_ray.priority.gradient``)."""
    continuity: ContinuityConfig = field(default_factory=ContinuityConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Micro-batch scheduling for the pipeline runtime (schedule name, osprey knobs, memory limit)."""
    p3: P3Config | None = None
    """None (the default): gradients go through DDP's hook. Set it for P3 ordering: per-slice all-reduces in
    priority order with per-layer optimizer steps (``pdml_ray.train.p3_sync``), and the simulator's settings."""
    seed: int = 0
    """Seed of the global permutation and of every random draw the scheduler makes."""
    scheduler_name: str | None = None
    """Name of the run's scheduler actor (``pdml-ray status --name``). None: ``PDMLTrainer.fit()`` names
    it after the run (``RunConfig.name``) or, without one, a fresh unique name, so concurrent runs on
    one cluster get their own scheduler and metric series."""
    namespace: str = "pdml"
    """Ray namespace of the scheduler actor."""

    def __post_init__(self) -> None:
        require(isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")
        require(self.scheduler_name is None or (isinstance(self.scheduler_name, str) and bool(self.scheduler_name)),
                "scheduler_name must be a non-empty string, or None to name it after the run")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PDMLConfig":
        return load_dataclass(cls, data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "PDMLConfig":
        import yaml

        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
