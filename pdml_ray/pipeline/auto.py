"""``auto``: a static schedule until measurements say osprey pays, then osprey.

Rule (thresholds in ``PipelineConfig``), evaluated after every observed step:
* dispersion: for each stage, the coefficient of variation (std / mean) across its replicas of the
  EMA per-micro-batch time F+B (seconds); the largest over stages. Replicas that differ by more than
  ``auto_dispersion_threshold`` (5%) are what osprey's re-balancing exploits.
* bubble: the static plan's bubble fraction predicted on the same EMA costs,
  1 - total work / (makespan x replicas); above ``auto_bubble_threshold`` (30%) reordering may help.
Static when dispersion < threshold and the bubble trigger does not fire; osprey otherwise. Before
any measurement: static. The decision and its reason are a frozen ``AutoDecision``
(``last_decision``), carried in every ``MicroBatchPlan``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

from pdml_ray.config import PipelineConfig
from pdml_ray.pipeline.listsched import in_order_makespan
from pdml_ray.pipeline.osprey import OspreySchedule
from pdml_ray.pipeline.plan import KIND_INDEX, Measurement, PipelineSchedule, Plan, check_state


@dataclass(frozen=True, slots=True)
class AutoDecision:
    """Which side auto runs and why."""

    choice: Literal["static", "osprey"]
    """'static' (the ``auto_static`` schedule) or 'osprey'."""
    schedule: str
    """Name of the schedule that plans the next step."""
    reason: str
    """The rule's verdict in words: which trigger fired, or why none did."""
    dispersion: float | None = None
    """Largest coefficient of variation of F+B seconds across a stage's replicas (None before any measurement)."""
    predicted_static_bubble: float | None = None
    """The static plan's bubble fraction predicted on the EMA costs (None before any measurement)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the measured fields only once set); ``AutoDecision.from_dict(d.to_dict()) == d``."""
        out: dict[str, Any] = {"choice": self.choice, "schedule": self.schedule, "reason": self.reason}
        if self.dispersion is not None:
            out.update(dispersion=self.dispersion, predicted_static_bubble=self.predicted_static_bubble)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AutoDecision":
        def opt(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        return cls(choice=data["choice"], schedule=str(data["schedule"]), reason=str(data["reason"]),
                   dispersion=opt("dispersion"), predicted_static_bubble=opt("predicted_static_bubble"))


def latency_dispersion(est: Sequence[Sequence[Sequence[float]]]) -> float:
    """Largest over stages of the std / mean across replicas of F+B seconds; 0 with one replica."""
    worst = 0.0
    for stage in est:
        periods = [c[0] + c[1] for c in stage]
        if len(periods) < 2:
            continue
        mean = sum(periods) / len(periods)
        std = (sum((p - mean) ** 2 for p in periods) / len(periods)) ** 0.5
        worst = max(worst, std / mean)
    return worst


class AutoSchedule:
    """Runs ``config.auto_static`` until the rule above picks osprey; both sides observe every step."""

    name = "auto"

    def __init__(self, *, stages: int, replicas: Sequence[int], microbatches: int,
                 config: PipelineConfig | None = None) -> None:
        from pdml_ray.pipeline.registry import make_schedule

        self.config = config if config is not None else PipelineConfig()
        self.stages, self.replicas, self.microbatches = stages, tuple(replicas), microbatches
        self.static: PipelineSchedule = make_schedule(self.config.auto_static, stages=stages, replicas=replicas,
                                                        microbatches=microbatches, config=self.config)
        self.osprey = OspreySchedule(stages=stages, replicas=replicas, microbatches=microbatches, config=self.config)
        self.last_decision = AutoDecision(choice="static", schedule=self.static.name, reason="no measurements yet")

    def tell_sizes(self, step: int, sizes: Sequence[float]) -> None:
        self.static.tell_sizes(step, sizes)
        self.osprey.tell_sizes(step, sizes)

    def observe(self, measurements: Sequence[Measurement]) -> None:
        self.static.observe(measurements)
        self.osprey.observe(measurements)
        if self.osprey.steps_observed:
            self.last_decision = self.decide()

    def decide(self) -> AutoDecision:
        """Which side to run and why, from the osprey EMA costs (seconds)."""
        cfg, est = self.config, self.osprey.est
        dispersion = latency_dispersion(est)
        static_plan = self.static.plan(0)
        makespan = in_order_makespan(static_plan.orders, self.stages, est)
        # Busy seconds of the plan on these costs (depends on the placement, so summed per action).
        work = sum(est[a.stage][a.replica][KIND_INDEX[a.kind]] for acts in static_plan.orders.values() for a in acts)
        bubble = 1.0 - work / (makespan * sum(self.replicas))
        reasons = []
        if dispersion >= cfg.auto_dispersion_threshold:
            reasons.append(f"replica latency dispersion {dispersion:.1%} >= {cfg.auto_dispersion_threshold:.0%}")
        if bubble > cfg.auto_bubble_threshold:
            reasons.append(f"predicted {self.static.name} bubble {bubble:.1%} > {cfg.auto_bubble_threshold:.0%}")
        choice: Literal["static", "osprey"] = "osprey" if reasons else "static"
        if not reasons:
            reasons.append(f"dispersion {dispersion:.1%} < {cfg.auto_dispersion_threshold:.0%} and predicted "
                           f"bubble {bubble:.1%} <= {cfg.auto_bubble_threshold:.0%}")
        return AutoDecision(choice=choice, schedule="osprey" if choice == "osprey" else self.static.name,
                            reason="; ".join(reasons), dispersion=dispersion, predicted_static_bubble=bubble)

    def plan(self, step: int) -> Plan:
        chosen = self.osprey if self.last_decision.choice == "osprey" else self.static
        return chosen.plan(step)

    def state_dict(self) -> dict[str, Any]:
        return {"static": self.static.state_dict(), "osprey": self.osprey.state_dict(),
                "last_decision": self.last_decision.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, ("static", "osprey", "last_decision"), self.name)
        self.static.load_state_dict(state["static"])
        self.osprey.load_state_dict(state["osprey"])
        self.last_decision = AutoDecision.from_dict(state["last_decision"])
