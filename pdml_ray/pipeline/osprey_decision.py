"""What osprey decided and why, as data: the frozen ``OspreyDecision`` carried in every ``MicroBatchPlan``
osprey makes (``OspreySchedule.last_decision``), with its JSON form for logs, history and replay."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class OspreyDecision:
    """What osprey last decided and why. Fields come in groups, set together and None otherwise:
    warm start (``warm_start``); after each observed step (``step`` .. ``bottleneck_stage``); with
    lanes (``lanes`` .. ``rebalanced``); after each adaptive plan (``predicted_makespan_s`` ..
    ``lane_microbatches``); ``predicted_busy_s`` with every plan issued. ``to_dict`` writes the groups
    that are set, in this order, for JSON logs."""

    kind: Literal["warm-start", "adaptive"]
    """'warm-start' until the first measurement, then 'adaptive'."""
    warm_start: str | None = None
    """The static schedule whose plan runs before any measurement (warm start only)."""
    step: int | None = None
    """Observed steps folded into the estimates so far."""
    stage_loads_s: tuple[float, ...] | None = None
    """Per stage: seconds per micro-batch with perfect balancing over its replicas, 1 / sum_r 1 / (f + b)."""
    bottleneck_stage: int | None = None
    """The stage with the largest balanced load."""
    lanes: tuple[tuple[int, ...], ...] | None = None
    """[stage][lane] -> replica: lane j holds the j-th fastest replica of every stage."""
    lane_period_s: tuple[float, ...] | None = None
    """Per lane: its slowest member's F+B seconds."""
    lane_bottleneck_stage: tuple[int, ...] | None = None
    """Per lane: the stage of its slowest member."""
    target_weights: tuple[float, ...] | None = None
    """Per lane: 1 / period, normalised; where the weights move to."""
    weights: tuple[float, ...] | None = None
    """Per lane: the micro-batch shares in use after this step (momentum, threshold applied)."""
    rebalanced: bool | None = None
    """Whether this step moved the weights (False: the move stayed under ``rebalance_threshold``)."""
    predicted_makespan_s: tuple[tuple[str, float], ...] | None = None
    """(candidate, predicted makespan s) per cap option, then each static candidate that fits the memory
    limit (by name, '<name>@lanes' on osprey's lanes), then 'warm-start', in the order tried."""
    chosen: str | None = None
    """The candidate planned: a cap option's name or 'warm-start'."""
    lane_microbatches: tuple[int, ...] | None = None
    """Micro-batches per lane in the best cap option's plan; None without lanes (set with ``chosen``)."""
    predicted_busy_s: tuple[tuple[int, int, str, float], ...] | None = None
    """(rank, replica, kind, seconds) per executor and action kind: its busy time under the plan issued
    last, predicted on the estimates it was made with (``pdml_ray.pipeline.prediction``); what a runtime
    compares the step's measured latencies with to decide whether the next plan, made a step ago, is
    made again."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form with the groups that are set; ``OspreyDecision.from_dict(d.to_dict()) == d``."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.warm_start is not None:
            out["warm_start"] = self.warm_start
        if self.step is not None:
            out.update(step=self.step, stage_loads_s=list(self.stage_loads_s or ()),
                       bottleneck_stage=self.bottleneck_stage)
        if self.lanes is not None:
            out.update(lanes=[list(m) for m in self.lanes], lane_period_s=list(self.lane_period_s or ()),
                       lane_bottleneck_stage=list(self.lane_bottleneck_stage or ()),
                       target_weights=list(self.target_weights or ()), weights=list(self.weights or ()),
                       rebalanced=self.rebalanced)
        if self.chosen is not None:
            out.update(predicted_makespan_s=dict(self.predicted_makespan_s or ()), chosen=self.chosen,
                       lane_microbatches=None if self.lane_microbatches is None else list(self.lane_microbatches))
        if self.predicted_busy_s is not None:
            out["predicted_busy_s"] = [list(x) for x in self.predicted_busy_s]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OspreyDecision":
        def floats(key: str) -> tuple[float, ...] | None:
            return None if data.get(key) is None else tuple(float(x) for x in data[key])

        def ints(key: str) -> tuple[int, ...] | None:
            return None if data.get(key) is None else tuple(int(x) for x in data[key])

        lanes, predicted = data.get("lanes"), data.get("predicted_makespan_s")
        return cls(kind=data["kind"], warm_start=data.get("warm_start"),
                   step=None if data.get("step") is None else int(data["step"]), stage_loads_s=floats("stage_loads_s"),
                   bottleneck_stage=None if data.get("bottleneck_stage") is None else int(data["bottleneck_stage"]),
                   lanes=None if lanes is None else tuple(tuple(int(r) for r in m) for m in lanes),
                   lane_period_s=floats("lane_period_s"), lane_bottleneck_stage=ints("lane_bottleneck_stage"),
                   target_weights=floats("target_weights"), weights=floats("weights"),
                   rebalanced=data.get("rebalanced"),
                   predicted_makespan_s=None if predicted is None else tuple((str(k), float(v))
                                                                             for k, v in predicted.items()),
                   chosen=data.get("chosen"), lane_microbatches=ints("lane_microbatches"),
                   predicted_busy_s=None if data.get("predicted_busy_s") is None else tuple(
                       (int(k), int(r), str(kind), float(t)) for k, r, kind, t in data["predicted_busy_s"]))
