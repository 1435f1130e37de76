"""Typed configuration: one dataclass per component, gathered in ``PDMLConfig``.

Every config validates itself in ``__post_init__``; a bad value raises ``ConfigError`` (a
``ValueError``) whose message names the field and says how to fix it. ``PDMLConfig.from_dict`` and
``PDMLConfig.from_yaml`` load the same dataclasses from plain data; unknown keys are errors.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pdml_ray.errors import ConfigError

# Relative training throughput by accelerator type, used as the prior before any measurement.
# Rough dense-BF16 ratios (H100 SXM = 1.0); only the ratios matter, and measurements replace them
# within the first decision interval. Users override or extend them with ``NodePriorityConfig.prior``.
DEFAULT_ACCELERATOR_PRIOR: dict[str, float] = {
    "H200": 1.15,
    "H100": 1.0,
    "A100": 0.32,
    "L40S": 0.37,
    "A10G": 0.13,
    "L4": 0.12,
    "V100": 0.13,
    "T4": 0.04,
    "CPU": 0.01,
}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(kw_only=True, slots=True)
class NodePriorityConfig:
    """Node priorities: each worker's share of a fixed global batch follows its measured throughput."""

    global_batch_size: int = 256
    """Samples per optimizer step over all workers; per-worker batch sizes always sum to it."""
    ema_alpha: float = 0.5
    """Weight of the newest throughput measurement in the EMA (1.0 = use only the newest)."""
    decision_interval: int = 5
    """Steps between node decisions; all ranks switch to a new decision at the same step."""
    warmup_steps: int = 2
    """Steps whose reports are ignored at the start (allocator and kernel warm-up distort timings)."""
    min_batch: int = 1
    """Smallest per-worker batch. Every worker keeps at least this many samples per step."""
    max_batch: int | None = None
    """Largest per-worker batch (memory cap); None means no cap."""
    hysteresis: float = 0.03
    """Keep the current batch sizes unless the new ones cut the predicted step time by more than this fraction."""
    prior: dict[str, float] = field(default_factory=dict)
    """Relative speeds by accelerator type; merged over DEFAULT_ACCELERATOR_PRIOR."""
    emulated_speeds: list[float] | None = None
    """Per-worker emulated speed factors in (0, 1] for CPU machines and tests (see pdml_ray.emulation)."""
    enabled: bool = True
    """False keeps uniform shares (the baseline) while still measuring and reporting."""

    def __post_init__(self) -> None:
        _require(isinstance(self.global_batch_size, int) and self.global_batch_size >= 1,
                 f"node_priority.global_batch_size must be a positive integer, got {self.global_batch_size!r}")
        _require(_finite(self.ema_alpha) and 0.0 < self.ema_alpha <= 1.0,
                 f"node_priority.ema_alpha must be in (0, 1] (e.g. 0.5), got {self.ema_alpha!r}")
        _require(isinstance(self.decision_interval, int) and self.decision_interval >= 1,
                 f"node_priority.decision_interval must be an integer >= 1 step, got {self.decision_interval!r}")
        _require(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
                 f"node_priority.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        _require(isinstance(self.min_batch, int) and self.min_batch >= 0,
                 f"node_priority.min_batch must be an integer >= 0, got {self.min_batch!r}")
        if self.max_batch is not None:
            _require(isinstance(self.max_batch, int) and self.max_batch >= max(1, self.min_batch),
                     f"node_priority.max_batch must be an integer >= min_batch ({self.min_batch}) or None, "
                     f"got {self.max_batch!r}")
        _require(_finite(self.hysteresis) and 0.0 <= self.hysteresis < 1.0,
                 f"node_priority.hysteresis must be in [0, 1) (a fraction of step time), got {self.hysteresis!r}")
        for name, speed in self.prior.items():
            _require(_finite(speed) and speed > 0,
                     f"node_priority.prior[{name!r}] must be a positive relative speed, got {speed!r}")
        if self.emulated_speeds is not None:
            for i, s in enumerate(self.emulated_speeds):
                _require(_finite(s) and 0.0 < s <= 1.0,
                         f"node_priority.emulated_speeds[{i}] must be in (0, 1] (the fastest worker is 1.0), got {s!r}")

    def accelerator_prior(self) -> dict[str, float]:
        """The effective prior table: defaults overridden by the user's entries."""
        return {**DEFAULT_ACCELERATOR_PRIOR, **self.prior}

    def check_workers(self, num_workers: int) -> None:
        """Check that ``num_workers`` workers can satisfy the batch bounds; say what to change if not."""
        _require(num_workers >= 1, f"need at least one worker, got {num_workers}")
        _require(self.min_batch * num_workers <= self.global_batch_size,
                 f"node_priority.min_batch={self.min_batch} x {num_workers} workers exceeds "
                 f"global_batch_size={self.global_batch_size}; lower min_batch or raise global_batch_size")
        if self.max_batch is not None:
            _require(self.max_batch * num_workers >= self.global_batch_size,
                     f"node_priority.max_batch={self.max_batch} x {num_workers} workers is below "
                     f"global_batch_size={self.global_batch_size}; raise max_batch or lower global_batch_size")
        if self.emulated_speeds is not None:
            _require(len(self.emulated_speeds) == num_workers,
                     f"node_priority.emulated_speeds has {len(self.emulated_speeds)} entries for "
                     f"{num_workers} workers; give one speed per worker")


@dataclass(kw_only=True, slots=True)
class SamplePriorityConfig:
    """Sample priorities: loss-based importance sampling over the whole data set."""

    score: Literal["loss", "loss_ema"] = "loss"
    """Per-sample score: the last loss, or an EMA of the losses seen for that sample."""
    score_ema: float = 0.5
    """Weight of the newest loss when score == 'loss_ema'."""
    exponent: float = 1.0
    """Temperature alpha: sampling weight ~ score**alpha (0 = uniform, 1 = proportional)."""
    uniform_mix: float = 0.1
    """Probability mass spread uniformly over all samples, so every sample keeps a chance."""
    staleness_decay: float = 0.0
    """Per-step multiplicative pull of scores not refreshed for a while towards the mean (0 = off)."""
    stale_after: int = 100
    """Steps after which a score counts as stale and starts to decay."""
    is_exponent_start: float = 0.4
    """Importance-weight exponent beta at step 0 (annealed linearly to 1.0)."""
    is_anneal_steps: int = 1000
    """Steps over which beta goes from is_exponent_start to 1.0 (unbiased)."""
    replacement: bool = True
    """Draw a step's indices with replacement (exactly unbiased); False draws distinct indices."""

    def __post_init__(self) -> None:
        _require(self.score in ("loss", "loss_ema"),
                 f"sample_priority.score must be 'loss' or 'loss_ema', got {self.score!r}")
        _require(_finite(self.score_ema) and 0.0 < self.score_ema <= 1.0,
                 f"sample_priority.score_ema must be in (0, 1], got {self.score_ema!r}")
        _require(_finite(self.exponent) and 0.0 <= self.exponent <= 10.0,
                 f"sample_priority.exponent must be in [0, 10] (1.0 = proportional to loss), got {self.exponent!r}")
        _require(_finite(self.uniform_mix) and 0.0 <= self.uniform_mix <= 1.0,
                 f"sample_priority.uniform_mix must be in [0, 1] (e.g. 0.1), got {self.uniform_mix!r}")
        _require(_finite(self.staleness_decay) and 0.0 <= self.staleness_decay < 1.0,
                 f"sample_priority.staleness_decay must be in [0, 1), got {self.staleness_decay!r}")
        _require(isinstance(self.stale_after, int) and self.stale_after >= 1,
                 f"sample_priority.stale_after must be an integer >= 1 step, got {self.stale_after!r}")
        _require(_finite(self.is_exponent_start) and 0.0 <= self.is_exponent_start <= 1.0,
                 f"sample_priority.is_exponent_start must be in [0, 1], got {self.is_exponent_start!r}")
        _require(isinstance(self.is_anneal_steps, int) and self.is_anneal_steps >= 0,
                 f"sample_priority.is_anneal_steps must be an integer >= 0, got {self.is_anneal_steps!r}")


@dataclass(kw_only=True, slots=True)
class ContinuityConfig:
    """Continuity check: catches a priority distribution that collapsed (too flat or too peaked)."""

    check_interval: int = 10
    """Steps between checks."""
    min_normalized_ess: float = 0.05
    """Below this normalised effective sample size the distribution is too peaked."""
    max_normalized_ess: float = 0.999
    """Above this (and with max_tie_fraction exceeded) the distribution is too flat."""
    max_tie_fraction: float = 0.9
    """Fraction of priorities equal (within rel. 1e-6) to the mode above which it counts as flat."""
    recalibration_steps: int = 50
    """Steps the raised uniform mix is held after a recalibration."""
    recalibration_mix: float = 0.5
    """Uniform mix used while recovering from a collapse."""
    noise: float = 0.05
    """Relative multiplicative noise injected into priorities on recalibration."""

    def __post_init__(self) -> None:
        _require(isinstance(self.check_interval, int) and self.check_interval >= 1,
                 f"continuity.check_interval must be an integer >= 1, got {self.check_interval!r}")
        _require(_finite(self.min_normalized_ess) and 0.0 <= self.min_normalized_ess < self.max_normalized_ess <= 1.0,
                 "continuity.min_normalized_ess must be >= 0 and below max_normalized_ess <= 1, got "
                 f"{self.min_normalized_ess!r} and {self.max_normalized_ess!r}")
        _require(_finite(self.max_tie_fraction) and 0.0 < self.max_tie_fraction <= 1.0,
                 f"continuity.max_tie_fraction must be in (0, 1], got {self.max_tie_fraction!r}")
        _require(isinstance(self.recalibration_steps, int) and self.recalibration_steps >= 1,
                 f"continuity.recalibration_steps must be an integer >= 1, got {self.recalibration_steps!r}")
        _require(_finite(self.recalibration_mix) and 0.0 < self.recalibration_mix <= 1.0,
                 f"continuity.recalibration_mix must be in (0, 1], got {self.recalibration_mix!r}")
        _require(_finite(self.noise) and 0.0 <= self.noise <= 1.0,
                 f"continuity.noise must be in [0, 1], got {self.noise!r}")


@dataclass(kw_only=True, slots=True)
class PDMLConfig:
    """Everything pdml-ray needs to know, one section per component."""

    node_priority: NodePriorityConfig = field(default_factory=NodePriorityConfig)
    sample_priority: SamplePriorityConfig | None = None
    """None (the default) keeps uniform sampling: a seeded permutation per epoch."""
    continuity: ContinuityConfig = field(default_factory=ContinuityConfig)
    seed: int = 0
    """Seed of the global permutation and of every random draw the scheduler makes."""
    scheduler_name: str = "pdml-scheduler"
    """Name of the scheduler actor (found by ``pdml-ray status``)."""
    namespace: str = "pdml"
    """Ray namespace of the scheduler actor."""

    def __post_init__(self) -> None:
        _require(isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")
        _require(bool(self.scheduler_name), "scheduler_name must be a non-empty string")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PDMLConfig":
        return _from_dict(cls, data, "")

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


def _from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from ``data``, recursing into nested config dataclasses."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {unknown}; valid keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        nested = _config_class(hints[name])
        if nested is not None and isinstance(value, dict):
            value = _from_dict(nested, value, f"{where}{name}.")
        kwargs[name] = value
    return cls(**kwargs)


def _config_class(hint: Any) -> type | None:
    """The config dataclass inside a type hint like ``X`` or ``X | None``, if any."""
    candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for c in candidates:
        if dataclasses.is_dataclass(c):
            return c
    return None
