"""Pipeline scheduling's config: which schedule orders the micro-batches, osprey's knobs, layer re-balancing.

Schedule names are validated against the one registry (``pdml_ray.pipeline.registry``), imported
when a config is checked: the registry imports nothing from here, so there is no cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdml_ray.config.checks import MAX_REAL, check_range, require
from pdml_ray.errors import shown

MAX_STAGES = 4096
"""Most pipeline stages a config describes (``stage_costs`` entries)."""
MAX_ACTIVATIONS = 10**6
"""Largest activation count a config takes (memory limit, osprey's extra in flight), as ``simulate``'s."""


def _check_schedule(value: object, field_name: str, *, static_only: bool) -> None:
    from pdml_ray.pipeline.registry import PROJECT_SCHEDULES, STATIC_SCHEDULES

    valid = STATIC_SCHEDULES if static_only else tuple(PROJECT_SCHEDULES)
    require(isinstance(value, str) and value in valid, f"{field_name} must be one of {list(valid)}, got {shown(value)}")


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
    plans: str = "full-backward"
    """Which plans osprey may choose: 'full-backward' (F and B, one chunk per stage: what the Ray-actor
    runtime runs) or 'any' (also split backward and two to four chunks per rank: torch's zero-bubble, interleaved
    and V orders, on osprey's lanes too; for the simulator)."""
    jump_threshold: float = 0.45
    """A step's mean latency this far from the estimate (relative) replaces it outright instead of
    entering the EMA: a level shift (a replica throttled, or recovered), which the EMA would follow only
    over several steps. Every kind the replica ran must have shifted that far the same way, each by
    more than three standard errors of its step mean, so per-action noise does not trigger it. 0.45
    catches a replica at half speed and its recovery (a 50% drop) and left every seed of the noisy
    profile as it was (8x4x16 osprey/1F1B median 0.941 over 5 seeds; 0.25 or a rule per kind took it to
    0.98); drift 4x4x16 (quick, planning a step ahead) went from 0.961 and
    0.975 of the best static order to 0.890 and 0.913 (seeds 0, 1). 0 disables the jump."""
    replan_on_shift: bool = False
    """Re-plan a step when the step before it ran far from its plan's prediction: a runtime plans step
    t+1 while step t runs, on measurements through t-1; where every action kind an executor ran in step t
    took more than ``jump_threshold`` (relative) off what its plan predicted, the same way
    (``pdml_ray.pipeline.prediction``), the runtime asks for step t+1's plan again, after step t's latencies, and waits for it. Only steps after
    a shift wait for planning; the runtimes count them (``replans``)."""

    def __post_init__(self) -> None:
        check_range(self.ema_alpha, "osprey.ema_alpha", 0.0, 1.0, open_low=True, hint="e.g. 0.5")
        check_range(self.stale_relax, "osprey.stale_relax", 0.0, 1.0, hint="e.g. 0.1")
        check_range(self.momentum, "osprey.momentum", 0.0, 1.0, open_high=True, hint="e.g. 0.5")
        check_range(self.rebalance_threshold, "osprey.rebalance_threshold", 0.0, 1.0, open_high=True, hint="e.g. 0.02")
        check_range(self.extra_in_flight, "osprey.extra_in_flight", 0, MAX_ACTIVATIONS, whole=True, hint="activations")
        _check_schedule(self.warm_start, "osprey.warm_start", static_only=True)
        check_range(self.jump_threshold, "osprey.jump_threshold", 0.0, MAX_REAL, hint="e.g. 0.25 (0 disables)")
        require(isinstance(self.replan_on_shift, bool),
                f"osprey.replan_on_shift must be true or false, got {shown(self.replan_on_shift)}")
        require(self.plans in ("full-backward", "any"),
                f"osprey.plans must be 'full-backward' (the Ray-actor runtime's plans) or 'any', got {shown(self.plans)}")


@dataclass(kw_only=True, slots=True)
class RebalanceConfig:
    """Layer re-balancing (``pdml_ray.pipeline.rebalance``): moving layers off a stage that stays slower
    than the others onto its neighbours, at a step boundary. Off by default: no benchmark has yet shown
    that it pays on the default runs (``pdml-ray bench pipeline`` reports the slow-stage scenario)."""

    enabled: bool = False
    """Let the pipeline axis decide layer moves (the runtime must announce its layers and cuts)."""
    window: int = 3
    """Consecutive measured steps the same stage must be the slowest (by ``threshold``) before layers
    move: one slow step is noise, not a slow stage."""
    threshold: float = 1.2
    """A step counts as imbalanced when its slowest stage takes more than this times the mean of the
    other stages (seconds per micro-batch)."""
    min_gain: float = 0.1
    """Move only if the predicted slowest stage gets at least this much faster (a fraction: 0.1 = 10%);
    with ``window`` and ``threshold`` this is the hysteresis that keeps layers from moving back and forth."""

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), f"pipeline.rebalance.enabled must be true or false, got {shown(self.enabled)}")
        check_range(self.window, "pipeline.rebalance.window", 1, 1000, whole=True, hint="steps, e.g. 3")
        check_range(self.threshold, "pipeline.rebalance.threshold", 1.0, MAX_REAL, open_low=True,
                    hint="a ratio of stage times above 1, e.g. 1.2")
        check_range(self.min_gain, "pipeline.rebalance.min_gain", 0.0, 1.0, open_high=True, hint="a fraction, e.g. 0.1")


@dataclass(kw_only=True, slots=True)
class PipelineConfig:
    """Pipeline scheduling: which schedule orders the micro-batches, within what activation memory."""

    schedule: str = "auto"
    """A name from ``pdml_ray.pipeline.registry.PROJECT_SCHEDULES`` ('auto': static until measurements say osprey pays)."""
    memory_limit: int | None = None
    """Most forward activations a replica may hold at once (F done, B not yet); None = unbounded."""
    stage_costs: list[tuple[float, float]] | None = None
    """Prior (forward_s, backward_s) per stage before any measurement; None assumes (1, 2) everywhere."""
    transfer_s: float = 0.0
    """Seconds an activation or gradient takes between ranks, where known (link latency + bytes /
    bandwidth); osprey's predictions include it. 0: transfers are taken to be free."""
    auto_static: str = "1f1b"
    """The static schedule 'auto' uses while osprey is not warranted."""
    auto_dispersion_threshold: float = 0.05
    """'auto' switches to osprey when replicas of a stage differ in measured latency by more than this
    coefficient of variation (0.05 = 5%)."""
    auto_bubble_threshold: float = 0.30
    """'auto' switches to osprey when the static plan's predicted bubble fraction exceeds this."""
    stages: int | None = None
    """Pipeline stages of a ``PDMLTrainer`` run: its workers run as ``stages`` stages x ``num_workers /
    stages`` data-parallel replicas (``pdml_ray.train.pipeline``). None outside Ray Train: the Ray-actor
    runtime and the benchmarks take their stages as arguments."""
    osprey: OspreyConfig = field(default_factory=OspreyConfig)
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)
    """Layer re-balancing between stages (off by default)."""

    def __post_init__(self) -> None:
        _check_schedule(self.schedule, "pipeline.schedule", static_only=False)
        check_range(self.memory_limit, "pipeline.memory_limit", 1, MAX_ACTIVATIONS, whole=True, none_ok=True,
                    hint="activations per replica")
        if self.stage_costs is not None:
            require(isinstance(self.stage_costs, (list, tuple)) and len(self.stage_costs) <= MAX_STAGES,
                    f"pipeline.stage_costs must be a list of at most {MAX_STAGES} (forward_s, backward_s) pairs, one "
                    f"per stage, or None, got {shown(self.stage_costs)}")
            for i, c in enumerate(self.stage_costs):
                require(isinstance(c, (list, tuple)) and len(c) == 2,
                        f"pipeline.stage_costs[{i}] must be (forward_s, backward_s), got {shown(c)}")
                for x in c:
                    check_range(x, f"pipeline.stage_costs[{i}]", 0.0, MAX_REAL, open_low=True,
                                hint="forward_s and backward_s, seconds")
        check_range(self.stages, "pipeline.stages", 1, MAX_STAGES, whole=True, none_ok=True,
                    hint="stages per data-parallel replica of a PDMLTrainer run")
        check_range(self.transfer_s, "pipeline.transfer_s", 0.0, MAX_REAL, hint="seconds between ranks, e.g. 0.01")
        _check_schedule(self.auto_static, "pipeline.auto_static", static_only=True)
        check_range(self.auto_dispersion_threshold, "pipeline.auto_dispersion_threshold", 0.0, MAX_REAL,
                    hint="a coefficient of variation, e.g. 0.05 = 5%")
        check_range(self.auto_bubble_threshold, "pipeline.auto_bubble_threshold", 0.0, 1.0, hint="e.g. 0.3")
        require(isinstance(self.osprey, OspreyConfig),
                f"pipeline.osprey must be an OspreyConfig (a mapping of its fields in YAML), got {shown(self.osprey)}")
        require(isinstance(self.rebalance, RebalanceConfig),
                f"pipeline.rebalance must be a RebalanceConfig (a mapping of its fields in YAML), got {shown(self.rebalance)}")
