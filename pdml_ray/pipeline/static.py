"""Static schedules: GPipe, 1F1B and critical-path priority. Micro-batches go to replicas round-robin.

"Static" means the plan runs strictly in order (``reorder=False``); the order is fixed before the step.
Static schedules decide nothing at run time (``last_decision`` is None); only critical-path keeps state
(its cost estimates).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

from pdml_ray.config import PipelineConfig
from pdml_ray.pipeline.listsched import list_schedule, round_robin
from pdml_ray.pipeline.plan import Action, Kind, Measurement, Plan, check_state

F, B = Kind.FORWARD, Kind.BACKWARD
# Cost model the static generators assume when nothing better is known: backward ~ 2x forward.
DEFAULT_FORWARD_S = 1.0
DEFAULT_BACKWARD_S = 2.0


class _StaticBase(ABC):
    """A plan built once (``_build``) and reused every step; ``config`` None means ``PipelineConfig()``."""

    name = "static"
    last_decision = None  # nothing is decided at run time

    def __init__(self, *, stages: int, replicas: Sequence[int], microbatches: int,
                 config: PipelineConfig | None = None) -> None:
        self.stages, self.replicas, self.microbatches = stages, tuple(replicas), microbatches
        self.config = config if config is not None else PipelineConfig()
        self.memory_limit = self.config.memory_limit
        self._cache: Plan | None = None

    def observe(self, measurements: Sequence[Measurement]) -> None:
        """Static schedules ignore measurements (critical-path refreshes its cost estimates)."""

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


class GPipeScheduler(_StaticBase):
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


class OneFOneBScheduler(_StaticBase):
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


class CriticalPathScheduler(_StaticBase):
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
