"""Static schedules: GPipe, 1F1B, critical-path priority, and 1F1B weighted by replica speeds.

"Static" means the plan runs strictly in order (``reorder=False``); the order is fixed before the step.
GPipe, 1F1B and critical path put micro-batches on replicas round-robin; ``1f1b-weighted`` puts them
on replicas in proportion to their speeds (the baseline a careful engineer configures by hand from
measured speeds). Static schedules decide nothing at run time (``last_decision`` is None); only
critical-path (its cost estimates) and 1f1b-weighted (its speeds) keep state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

from pdml_ray.batching import round_to_batch_sizes
from pdml_ray.config import PipelineConfig
from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.listsched import list_schedule, round_robin
from pdml_ray.pipeline.plan import Action, DecisionRecord, Kind, Measurement, Plan, check_state

F, B = Kind.FORWARD, Kind.BACKWARD
# Cost model the static generators assume when nothing better is known: backward ~ 2x forward.
DEFAULT_FORWARD_S = 1.0
DEFAULT_BACKWARD_S = 2.0


class _StaticBase(ABC):
    """A plan built once (``_build``) and reused every step; ``config`` None means ``PipelineConfig()``."""

    name = "static"
    last_decision: DecisionRecord | None = None  # nothing is decided at run time (but 1f1b-weighted's speeds)

    def __init__(self, *, stages: int, replicas: Sequence[int], microbatches: int,
                 config: PipelineConfig | None = None) -> None:
        self.stages, self.replicas, self.microbatches = stages, tuple(replicas), microbatches
        self.config = config if config is not None else PipelineConfig()
        self.memory_limit = self.config.memory_limit
        self._cache: Plan | None = None

    def observe(self, measurements: Sequence[Measurement]) -> None:
        """Static schedules ignore measurements (critical-path refreshes its cost estimates)."""

    def tell_sizes(self, step: int, sizes: Sequence[float]) -> None:
        """A static order is fixed before any step: micro-batch sizes change nothing."""

    def plan(self, step: int) -> Plan:
        if self._cache is None:
            self._cache = self._build()
        return self._cache

    @abstractmethod
    def _build(self) -> Plan:
        """This schedule's plan for the configured shape and memory limit."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cache = None


class GPipeSchedule(_StaticBase):
    """All forwards, then all backwards, per replica. With a memory limit L, in rounds of
    L x min(replicas) consecutive micro-batches so no replica holds more than L activations."""

    name = "gpipe"

    def _build(self) -> Plan:
        S, M = self.stages, self.microbatches
        place = round_robin(S, self.replicas, M)
        group = M if self.memory_limit is None else self.memory_limit * min(self.replicas)
        orders: dict[tuple[int, int], list[Action]] = {(k, r): [] for k in range(S) for r in range(self.replicas[k])}
        for start in range(0, M, group):
            mbs = range(start, min(M, start + group))
            for kind in (F, B):
                for k in range(S):
                    for m in mbs:
                        orders[(k, place[(k, m)])].append(Action(k, place[(k, m)], kind, m))
        return Plan(S, self.replicas, M, {key: tuple(v) for key, v in orders.items()}, reorder=False,
                    memory_limit=self.memory_limit, schedule=self.name)


def one_f_one_b_caps(stages: int, memory_limit: int | None) -> list[int]:
    """1F1B's activation cap per replica of stage k: stages - k (fills the pipeline, no more)."""
    return [stages - k if memory_limit is None else min(stages - k, memory_limit) for k in range(stages)]


class OneFOneBSchedule(_StaticBase):
    """1F1B (PipeDream-flush): warm up with stages-k forwards, then prefer a ready backward.

    Built by greedy list scheduling on unit costs (F=1, B=2) with backward-first picks and a cap of
    stages-k activations at stage k; for one replica per stage this is exactly the textbook order.
    """

    name = "1f1b"

    def _build(self) -> Plan:
        S, M = self.stages, self.microbatches
        costs = [[(DEFAULT_FORWARD_S, DEFAULT_BACKWARD_S)] * r for r in self.replicas]
        # Rank (F, B) = (1, 0): any ready backward first, then forwards in micro-batch order.
        orders, _ = list_schedule(S, self.replicas, M, costs, [(1, 0)] * S, one_f_one_b_caps(S, self.memory_limit),
                                  placement=round_robin(S, self.replicas, M))
        return Plan(S, self.replicas, M, orders, reorder=False, memory_limit=self.memory_limit, schedule=self.name)


def critical_path_ranks(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: float = 0.0
                        ) -> tuple[list[float], list[float]]:
    """Remaining critical-path time (seconds) from the start of F(k, .) and B(k, .) to the end of the step.

    One micro-batch's chain is F_0 -> ... -> F_{S-1} -> B_{S-1} -> ... -> B_0, so
    rank_B[k] = sum_{j<=k} b_j + k * transfer and rank_F[k] = sum_{j>=k} f_j + sum_j b_j + (2S-2-k) * transfer.
    (The longest path to the sink: the standard list-scheduling priority, in seconds, not a depth count.)
    """
    S = len(forward_s)
    rank_b = [sum(backward_s[: k + 1]) + k * transfer_s for k in range(S)]
    rank_f = [sum(forward_s[k:]) + rank_b[S - 1] + (S - 1 - k) * transfer_s for k in range(S)]
    return rank_f, rank_b


class CriticalPathSchedule(_StaticBase):
    """Greedy list scheduling by remaining critical-path time, from per-stage cost estimates.

    Estimates start at F=1, B=2 per stage (or ``config.stage_costs``) and are refreshed from measured
    means (over replicas) each step. Ties go to the lower micro-batch. Activations are capped at
    stages-k per replica (like 1F1B) or the memory limit, whichever is lower.
    """

    name = "critical-path"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        costs = self.config.stage_costs
        self.forward_s = [c[0] for c in costs] if costs else [DEFAULT_FORWARD_S] * self.stages
        self.backward_s = [c[1] for c in costs] if costs else [DEFAULT_BACKWARD_S] * self.stages

    def observe(self, measurements: Sequence[Measurement]) -> None:
        sums: dict[tuple[int, Kind], list[float]] = {}
        for x in measurements:
            sums.setdefault((x.stage, x.kind), []).append(x.latency_s)
        for (k, kind), vals in sums.items():
            (self.forward_s if kind is F else self.backward_s)[k] = sum(vals) / len(vals)
        if sums:
            self._cache = None

    def _build(self) -> Plan:
        S, M = self.stages, self.microbatches
        rank_f, rank_b = critical_path_ranks(self.forward_s, self.backward_s)
        costs = [[(self.forward_s[k], self.backward_s[k])] * self.replicas[k] for k in range(S)]
        # Longest remaining path first (smaller sort key first), ties to the lower micro-batch.
        ranks = [(-rank_f[k], -rank_b[k]) for k in range(S)]
        orders, _ = list_schedule(S, self.replicas, M, costs, ranks, one_f_one_b_caps(S, self.memory_limit),
                                  placement=round_robin(S, self.replicas, M))
        return Plan(S, self.replicas, M, orders, reorder=False, memory_limit=self.memory_limit, schedule=self.name)

    def state_dict(self) -> dict[str, Any]:
        return {"forward_s": list(self.forward_s), "backward_s": list(self.backward_s)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, ("forward_s", "backward_s"), self.name)
        self.forward_s, self.backward_s = list(state["forward_s"]), list(state["backward_s"])
        self._cache = None


def speed_weighted_placement(speeds: Sequence[Sequence[float]], num_microbatches: int) -> dict[tuple[int, int], int]:
    """(stage, microbatch) -> replica, with micro-batches in proportion to ``speeds[stage][replica]``.

    Per stage, the counts are the shares rounded by the batch-size rule (``round_to_batch_sizes``:
    they sum to ``num_microbatches``, ties to the lower replica), and micro-batches are dealt out in
    order to the replica furthest behind its quota (smallest (given + 0.5) / count), so each
    replica's micro-batches are spread evenly over the step rather than bunched. A stage whose
    replicas are equally fast gets exactly ``round_robin``.
    """
    place: dict[tuple[int, int], int] = {}
    for k, row in enumerate(speeds):
        if len(set(row)) == 1:  # equal speeds: plain round-robin, exactly 1F1B's placement
            place.update({(k, m): m % len(row) for m in range(num_microbatches)})
            continue
        counts = [int(c) for c in round_to_batch_sizes(row, num_microbatches)]
        given = [0] * len(row)
        for m in range(num_microbatches):
            r = min((r for r in range(len(row)) if given[r] < counts[r]), key=lambda r: ((given[r] + 0.5) / counts[r], r))
            given[r] += 1
            place[(k, m)] = r
    return place


@dataclass(frozen=True, slots=True)
class WeightedDecision:
    """The speeds 1f1b-weighted plans with and the micro-batches each replica gets from them."""

    source: str
    """'given' (hand-configured), 'measured' (over ``calibrated_steps`` steps) or 'none yet' (plain 1F1B)."""
    speeds: tuple[tuple[float, ...], ...]
    """[stage][replica] relative speed (the fastest replica of a stage 1.0 when measured)."""
    microbatch_counts: tuple[tuple[int, ...], ...]
    """[stage][replica] micro-batches placed there."""
    calibrated_steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "speeds": [list(r) for r in self.speeds],
                "microbatch_counts": [list(r) for r in self.microbatch_counts],
                "calibrated_steps": self.calibrated_steps}


class WeightedOneFOneBSchedule(_StaticBase):
    """1F1B order with micro-batches placed on replicas in proportion to their speeds.

    The static baseline osprey has to beat on a heterogeneous cluster: what an engineer would
    configure by hand after measuring each replica once. Speeds are either given (``speeds``, one
    list per stage, e.g. [[1, 0.5], [1, 1]]) or measured: the first step runs plain 1F1B, and the
    mean F and B seconds per micro-batch of each replica over the first ``calibration_steps``
    observed steps (re-planned after each) set the costs and the speeds (relative to the stage's
    fastest replica, rounded to 0.01 as one would write them down). After that the plan is fixed:
    drift is not followed (that is osprey's job). Micro-batch counts per replica follow the speeds
    (``speed_weighted_placement``); the order is 1F1B's rule (a ready backward first, stages-k
    activations at stage k) list-scheduled on the measured costs (given speeds: the default costs
    divided by the speed). When every replica of every stage is equally fast the plan is exactly 1F1B's.
    """

    name = "1f1b-weighted"

    def __init__(self, *, speeds: Sequence[Sequence[float]] | None = None, calibration_steps: int = 2,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if calibration_steps < 1:
            raise ConfigError(f"calibration_steps must be >= 1 measured step, got {calibration_steps!r}")
        self.calibration_steps = calibration_steps
        self.calibrated_steps = 0
        """Steps whose measurements went into the speeds so far (``calibration_steps``: fixed from then on)."""
        self.fixed = speeds is not None
        self.speeds: list[list[float]] = [[1.0] * r for r in self.replicas] if speeds is None else self._checked(speeds)
        self.costs: list[list[tuple[float, float]]] | None = None
        """Measured (forward_s, backward_s) per micro-batch, [stage][replica]; None until measured."""
        # (stage, replica) -> [forward s, backward s, forwards, backwards] summed over the calibration steps
        self._totals: dict[tuple[int, int], list[float]] = {}
        self.last_decision = self._decision()

    def _checked(self, speeds: Sequence[Sequence[float]]) -> list[list[float]]:
        rows = [[float(s) for s in row] for row in speeds]
        if [len(row) for row in rows] != list(self.replicas) or not all(s > 0 for row in rows for s in row):
            raise ConfigError(f"1f1b-weighted speeds need one positive speed per replica of every stage "
                              f"(replicas {list(self.replicas)}), got {[list(r) for r in speeds]}; e.g. [[1, 0.5], ...]")
        return rows

    def observe(self, measurements: Sequence[Measurement]) -> None:
        if self.fixed or self.calibrated_steps >= self.calibration_steps or not measurements:
            return
        for x in measurements:
            total = self._totals.setdefault((x.stage, x.replica), [0.0, 0.0, 0.0, 0.0])
            i = 0 if x.kind is F else 1
            total[i] += x.latency_s
            total[2 + i] += 1.0
        self.calibrated_steps += 1
        self.costs, self.speeds = measured_costs(self._totals, self.replicas)
        self.last_decision = self._decision()
        self._cache = None

    def microbatch_counts(self) -> list[list[int]]:
        """[stage][replica] -> micro-batches placed there by the current plan."""
        counts = [[0] * r for r in self.replicas]
        for (k, _), r in speed_weighted_placement(self.speeds, self.microbatches).items():
            counts[k][r] += 1
        return counts

    def _decision(self) -> WeightedDecision:
        """The speeds behind the current plan (``last_decision``): unlike the other static schedules,
        this one has measured something."""
        source = "given" if self.fixed else "measured" if self.calibrated_steps else "none yet"
        return WeightedDecision(source=source, speeds=tuple(tuple(r) for r in self.speeds),
                                microbatch_counts=tuple(tuple(r) for r in self.microbatch_counts()),
                                calibrated_steps=self.calibrated_steps)

    def _build(self) -> Plan:
        S, M = self.stages, self.microbatches
        if all(s == 1.0 for row in self.speeds for s in row) or self.costs is None:
            costs = [[(DEFAULT_FORWARD_S / s, DEFAULT_BACKWARD_S / s) for s in row] for row in self.speeds]
        else:
            costs = self.costs
        orders, _ = list_schedule(S, self.replicas, M, costs, [(1, 0)] * S, one_f_one_b_caps(S, self.memory_limit),
                                  placement=speed_weighted_placement(self.speeds, M))
        return Plan(S, self.replicas, M, orders, reorder=False, memory_limit=self.memory_limit, schedule=self.name)

    def state_dict(self) -> dict[str, Any]:
        return {"speeds": [list(row) for row in self.speeds], "calibrated_steps": self.calibrated_steps,
                "fixed": self.fixed, "totals": [[k, r, *v] for (k, r), v in sorted(self._totals.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, ("speeds", "calibrated_steps", "fixed", "totals"), self.name)
        self.speeds = self._checked(state["speeds"])
        self.calibrated_steps, self.fixed = int(state["calibrated_steps"]), bool(state["fixed"])
        self._totals = {(int(row[0]), int(row[1])): [float(v) for v in row[2:]] for row in state["totals"]}
        self.costs = measured_costs(self._totals, self.replicas)[0] if self._totals else None
        self.last_decision = self._decision()
        self._cache = None


def measured_costs(totals: dict[tuple[int, int], list[float]], replicas: Sequence[int]
                   ) -> tuple[list[list[tuple[float, float]]], list[list[float]]]:
    """Mean (forward_s, backward_s) per replica and relative speeds, from summed measurements.

    ``totals[(stage, replica)]`` = [forward s, backward s, forwards, backwards]. A replica's speed is
    its stage's fastest F+B time over its own, rounded to 0.01 (at least 0.01). A replica with nothing
    measured is taken to be as fast as its stage's fastest (its costs are that replica's).
    """
    costs: list[list[tuple[float, float]]] = []
    speeds: list[list[float]] = []
    for k, n in enumerate(replicas):
        row: list[tuple[float, float] | None] = []
        for r in range(n):
            t = totals.get((k, r))
            row.append((t[0] / t[2], t[1] / t[3]) if t is not None and t[2] > 0 and t[3] > 0 else None)
        known = [c for c in row if c is not None and c[0] + c[1] > 0]
        best = min(known, key=lambda c: c[0] + c[1]) if known else (DEFAULT_FORWARD_S, DEFAULT_BACKWARD_S)
        filled = [c if c is not None and c[0] + c[1] > 0 else best for c in row]
        costs.append(filled)
        speeds.append([max(0.01, round((best[0] + best[1]) / (c[0] + c[1]), 2)) for c in filled])
    return costs, speeds
