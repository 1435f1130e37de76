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
    unseen_score: Literal["max", "mean"] = "max"
    """Score of samples that have no loss yet: the largest score seen so far (optimistic: the first
    epoch visits every sample before exploiting), or the mean seen score (exploits high-loss samples
    as soon as they are found; the uniform mix and the mean weight still visit the rest)."""

    def __post_init__(self) -> None:
        _require(self.unseen_score in ("max", "mean"),
                 f"sample_priority.unseen_score must be 'max' or 'mean', got {self.unseen_score!r}")
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
    min_normalized_ess: float = 1e-3
    """Below this normalised effective sample size ((sum p)^2 / (N sum p^2)) the distribution is too
    peaked: it effectively covers fewer than this fraction of the items (and fewer than
    ``min_effective_items``). A healthy loss table on imbalanced data (1 positive in 200 carrying most
    of the loss) sits near 5e-3. For few items (nodes) raise it: 1/N is the minimum."""
    min_effective_items: float = 16.0
    """Too peaked also needs the distribution to cover fewer than this many items (normalised ESS x
    N), i.e. a handful. A rare class may rightly hold most of a large table's mass: 1 positive in
    1,000 among 100,000 samples covers ~100 items, a normalised ESS of 1e-3. ``math.inf`` judges by
    the fraction alone. Long vectors checked on a subsample count items of the subsample."""
    max_normalized_ess: float = 0.999
    """Too flat needs both: normalised ESS above this AND tie_fraction above max_tie_fraction."""
    max_tie_fraction: float = 0.9
    """Share of priorities tied (within relative tie_tolerance of the median) above which, with a
    normalised ESS above max_normalized_ess, the distribution counts as collapsed flat. Must be > 0.5."""
    tie_tolerance: float = 1e-3
    """Relative distance to the median within which two priorities count as tied."""
    max_check_items: int = 1 << 16
    """Vectors longer than this are measured on a random subsample of this many items (keeps a check O(1))."""
    recalibration_steps: int = 50
    """Steps the raised uniform mix is held after a recalibration."""
    recalibration_mix: float = 0.5
    """Uniform mix used while recovering from a collapse."""
    noise: float = 0.05
    """Std of the log-normal multiplicative noise injected into priorities on recalibration (breaks ties)."""
    reset_fraction: float = 0.5
    """On recalibration, priorities move this fraction of the way towards the prior (the median) in log
    space: p <- p^(1-f) * prior^f, which compresses a peak by the power (1-f)."""

    def __post_init__(self) -> None:
        _require(isinstance(self.check_interval, int) and self.check_interval >= 1,
                 f"continuity.check_interval must be an integer >= 1, got {self.check_interval!r}")
        _require(_finite(self.min_normalized_ess) and 0.0 <= self.min_normalized_ess < self.max_normalized_ess <= 1.0,
                 "continuity.min_normalized_ess must be >= 0 and below max_normalized_ess <= 1, got "
                 f"{self.min_normalized_ess!r} and {self.max_normalized_ess!r}")
        _require(isinstance(self.min_effective_items, (int, float)) and self.min_effective_items >= 0.0,
                 f"continuity.min_effective_items must be >= 0 (a number of items), got {self.min_effective_items!r}")
        _require(_finite(self.max_tie_fraction) and 0.5 < self.max_tie_fraction <= 1.0,
                 f"continuity.max_tie_fraction must be in (0.5, 1] (ties are counted around the median), "
                 f"got {self.max_tie_fraction!r}")
        _require(_finite(self.tie_tolerance) and 0.0 <= self.tie_tolerance < 1.0,
                 f"continuity.tie_tolerance must be in [0, 1) (relative, e.g. 1e-3), got {self.tie_tolerance!r}")
        _require(isinstance(self.max_check_items, int) and self.max_check_items >= 16,
                 f"continuity.max_check_items must be an integer >= 16, got {self.max_check_items!r}")
        _require(_finite(self.reset_fraction) and 0.0 <= self.reset_fraction <= 1.0,
                 f"continuity.reset_fraction must be in [0, 1] (0 = keep priorities), got {self.reset_fraction!r}")
        _require(isinstance(self.recalibration_steps, int) and self.recalibration_steps >= 1,
                 f"continuity.recalibration_steps must be an integer >= 1, got {self.recalibration_steps!r}")
        _require(_finite(self.recalibration_mix) and 0.0 < self.recalibration_mix <= 1.0,
                 f"continuity.recalibration_mix must be in (0, 1], got {self.recalibration_mix!r}")
        _require(_finite(self.noise) and 0.0 <= self.noise <= 1.0,
                 f"continuity.noise must be in [0, 1], got {self.noise!r}")


@dataclass(kw_only=True, slots=True)
class OspreyConfig:
    """Osprey: adaptive pipeline scheduling from measured per-stage-replica latencies."""

    ema_alpha: float = 0.5
    """Weight of the newest step's mean latency in the EMA per (stage, replica, kind); 1.0 = newest only."""
    stale_relax: float = 0.1
    """Per step, a replica with no measurement moves this fraction of the way to its stage's fastest
    estimate, so a replica starved of work is eventually tried (and re-measured) again."""
    momentum: float = 0.5
    """Momentum of the lane weights (micro-batch shares): w <- momentum * w + (1 - momentum) * target."""
    rebalance_threshold: float = 0.02
    """Keep the current lane weights unless some share would change by more than this (absolute
    fraction of the micro-batches); stops noise from reshuffling the plan every step."""
    extra_in_flight: int = 0
    """Activations per replica beyond 1F1B's (stages - k) that osprey may hold to absorb noise; the
    memory limit, if set, still caps the total."""
    warm_start: Literal["gpipe", "1f1b", "critical-path"] = "1f1b"
    """Static schedule whose plan osprey uses until it has measurements."""

    def __post_init__(self) -> None:
        _require(_finite(self.ema_alpha) and 0.0 < self.ema_alpha <= 1.0,
                 f"osprey.ema_alpha must be in (0, 1] (e.g. 0.5), got {self.ema_alpha!r}")
        _require(_finite(self.stale_relax) and 0.0 <= self.stale_relax <= 1.0,
                 f"osprey.stale_relax must be in [0, 1] (e.g. 0.1), got {self.stale_relax!r}")
        _require(_finite(self.momentum) and 0.0 <= self.momentum < 1.0,
                 f"osprey.momentum must be in [0, 1) (e.g. 0.5), got {self.momentum!r}")
        _require(_finite(self.rebalance_threshold) and 0.0 <= self.rebalance_threshold < 1.0,
                 f"osprey.rebalance_threshold must be in [0, 1) (e.g. 0.02), got {self.rebalance_threshold!r}")
        _require(isinstance(self.extra_in_flight, int) and self.extra_in_flight >= 0,
                 f"osprey.extra_in_flight must be an integer >= 0 activations, got {self.extra_in_flight!r}")
        _require(self.warm_start in ("gpipe", "1f1b", "critical-path"),
                 f"osprey.warm_start must be 'gpipe', '1f1b' or 'critical-path', got {self.warm_start!r}")


@dataclass(kw_only=True, slots=True)
class PipelineConfig:
    """Pipeline scheduling: which schedule orders the micro-batches, within what activation memory."""

    schedule: str = "auto"
    """One of 'gpipe', '1f1b', 'critical-path', 'osprey', 'auto' (static until measurements say osprey pays)."""
    memory_limit: int | None = None
    """Most forward activations a replica may hold at once (F done, B not yet); None = unbounded."""
    stage_costs: list[tuple[float, float]] | None = None
    """Prior (forward_s, backward_s) per stage before any measurement; None assumes (1, 2) everywhere."""
    auto_static: Literal["gpipe", "1f1b", "critical-path"] = "1f1b"
    """The static schedule 'auto' uses while osprey is not warranted."""
    auto_dispersion_threshold: float = 0.05
    """'auto' switches to osprey when replicas of a stage differ in measured latency by more than this
    coefficient of variation (0.05 = 5%)."""
    auto_bubble_threshold: float = 0.30
    """'auto' switches to osprey when the static plan's predicted bubble fraction exceeds this."""
    osprey: OspreyConfig = field(default_factory=OspreyConfig)

    def __post_init__(self) -> None:
        _require(self.schedule in _PIPELINE_SCHEDULES,
                 f"pipeline.schedule must be one of {list(_PIPELINE_SCHEDULES)}, got {self.schedule!r}")
        if self.memory_limit is not None:
            _require(isinstance(self.memory_limit, int) and self.memory_limit >= 1,
                     f"pipeline.memory_limit must be an integer >= 1 activation or None, got {self.memory_limit!r}")
        if self.stage_costs is not None:
            for i, c in enumerate(self.stage_costs):
                _require(len(c) == 2 and all(_finite(x) and x > 0 for x in c),
                         f"pipeline.stage_costs[{i}] must be (forward_s, backward_s), both > 0 seconds, got {c!r}")
        _require(self.auto_static in ("gpipe", "1f1b", "critical-path"),
                 f"pipeline.auto_static must be 'gpipe', '1f1b' or 'critical-path', got {self.auto_static!r}")
        _require(_finite(self.auto_dispersion_threshold) and self.auto_dispersion_threshold >= 0.0,
                 f"pipeline.auto_dispersion_threshold must be >= 0 (e.g. 0.05 = 5%), got {self.auto_dispersion_threshold!r}")
        _require(_finite(self.auto_bubble_threshold) and 0.0 <= self.auto_bubble_threshold <= 1.0,
                 f"pipeline.auto_bubble_threshold must be in [0, 1] (e.g. 0.3), got {self.auto_bubble_threshold!r}")


@dataclass(kw_only=True, slots=True)
class PDMLConfig:
    """Everything pdml-ray needs to know, one section per component."""

    node_priority: NodePriorityConfig = field(default_factory=NodePriorityConfig)
    sample_priority: SamplePriorityConfig | None = None
    """None (the default) keeps uniform sampling: a seeded permutation per epoch."""
    continuity: ContinuityConfig = field(default_factory=ContinuityConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Micro-batch scheduling for the pipeline runtime (schedule name, osprey knobs, memory limit)."""
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
        elif nested is not None and value is not None and not isinstance(value, nested):
            raise ConfigError(f"{where}{name}: expected a mapping of {nested.__name__} fields, got {value!r}")
        kwargs[name] = value
    return cls(**kwargs)


def _config_class(hint: Any) -> type | None:
    """The config dataclass inside a type hint like ``X`` or ``X | None``, if any."""
    candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for c in candidates:
        if dataclasses.is_dataclass(c):
            return c
    return None


# ---- Pipeline scheduling (issue 4): appended block, owned by pdml_ray/pipeline ----

_PIPELINE_SCHEDULES = ("gpipe", "1f1b", "critical-path", "osprey", "auto")
