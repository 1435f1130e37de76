"""Pipeline scheduling's config: which schedule orders the micro-batches, osprey's knobs.

Schedule names are validated against the one registry (``pdml_ray.pipeline.registry``), imported
when a config is checked: the registry imports nothing from here, so there is no cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdml_ray.config.checks import finite, integer, require


def _check_schedule(value: object, field_name: str, *, static_only: bool) -> None:
    from pdml_ray.pipeline.registry import SCHEDULERS, STATIC_SCHEDULES

    valid = STATIC_SCHEDULES if static_only else tuple(SCHEDULERS)
    require(value in valid, f"{field_name} must be one of {list(valid)}, got {value!r}")

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
    warm_start: str = "1f1b"
    """Static schedule whose plan osprey uses until it has measurements."""

    def __post_init__(self) -> None:
        require(finite(self.ema_alpha) and 0.0 < self.ema_alpha <= 1.0,
                 f"osprey.ema_alpha must be in (0, 1] (e.g. 0.5), got {self.ema_alpha!r}")
        require(finite(self.stale_relax) and 0.0 <= self.stale_relax <= 1.0,
                 f"osprey.stale_relax must be in [0, 1] (e.g. 0.1), got {self.stale_relax!r}")
        require(finite(self.momentum) and 0.0 <= self.momentum < 1.0,
                 f"osprey.momentum must be in [0, 1) (e.g. 0.5), got {self.momentum!r}")
        require(finite(self.rebalance_threshold) and 0.0 <= self.rebalance_threshold < 1.0,
                 f"osprey.rebalance_threshold must be in [0, 1) (e.g. 0.02), got {self.rebalance_threshold!r}")
        require(integer(self.extra_in_flight, 0),
                 f"osprey.extra_in_flight must be an integer >= 0 activations, got {self.extra_in_flight!r}")
        _check_schedule(self.warm_start, "osprey.warm_start", static_only=True)


@dataclass(kw_only=True, slots=True)
class PipelineConfig:
    """Pipeline scheduling: which schedule orders the micro-batches, within what activation memory."""

    schedule: str = "auto"
    """A name from ``pdml_ray.pipeline.registry.SCHEDULERS`` ('auto': static until measurements say osprey pays)."""
    memory_limit: int | None = None
    """Most forward activations a replica may hold at once (F done, B not yet); None = unbounded."""
    stage_costs: list[tuple[float, float]] | None = None
    """Prior (forward_s, backward_s) per stage before any measurement; None assumes (1, 2) everywhere."""
    auto_static: str = "1f1b"
    """The static schedule 'auto' uses while osprey is not warranted."""
    auto_dispersion_threshold: float = 0.05
    """'auto' switches to osprey when replicas of a stage differ in measured latency by more than this
    coefficient of variation (0.05 = 5%)."""
    auto_bubble_threshold: float = 0.30
    """'auto' switches to osprey when the static plan's predicted bubble fraction exceeds this."""
    osprey: OspreyConfig = field(default_factory=OspreyConfig)

    def __post_init__(self) -> None:
        _check_schedule(self.schedule, "pipeline.schedule", static_only=False)
        if self.memory_limit is not None:
            require(integer(self.memory_limit, 1),
                     f"pipeline.memory_limit must be an integer >= 1 activation or None, got {self.memory_limit!r}")
        if self.stage_costs is not None:
            require(isinstance(self.stage_costs, (list, tuple)),
                    f"pipeline.stage_costs must be a list of (forward_s, backward_s) pairs or None, got {self.stage_costs!r}")
            for i, c in enumerate(self.stage_costs):
                require(isinstance(c, (list, tuple)) and len(c) == 2 and all(finite(x) and x > 0 for x in c),
                         f"pipeline.stage_costs[{i}] must be (forward_s, backward_s), both > 0 seconds, got {c!r}")
        _check_schedule(self.auto_static, "pipeline.auto_static", static_only=True)
        require(finite(self.auto_dispersion_threshold) and self.auto_dispersion_threshold >= 0.0,
                 f"pipeline.auto_dispersion_threshold must be >= 0 (e.g. 0.05 = 5%), got {self.auto_dispersion_threshold!r}")
        require(finite(self.auto_bubble_threshold) and 0.0 <= self.auto_bubble_threshold <= 1.0,
                 f"pipeline.auto_bubble_threshold must be in [0, 1] (e.g. 0.3), got {self.auto_bubble_threshold!r}")
