"""``async``: bounded-staleness asynchronous updates.

Each of n workers computes its own partition, and is NOT cut short by the next step: a worker gets a
new task only when it is idle (its last gradient arrived), so a straggler keeps computing on the
parameters it was given and its gradient is applied when it arrives, at a later step. A step's update
is made as soon as n - s gradients are there (fresh or stale; ``stragglers = n - 1`` applies each
gradient as it arrives; more per update amortise the aggregator's per-update cost), with weights

    w_i = staleness_weight(s_i, S) / m        s_i = step - the step whose parameters g_i was computed at,
                                              m   = the arrivals with s_i <= S

(``pdml_ray.priority.gradient.staleness_weight``: 1 / (1 + s), the staleness-dependent step of Zhang
et al. 2016; 0 beyond S), so fresh gradients make the plain mean and stale ones are weighted down; S
is the gradient deriver's ``max_staleness`` (``adopt``; the config's until the first decision). A
gradient more than S steps stale is refused (weight 0, not counted towards n - s), and a worker whose
in-flight task is already more than S steps old gets a new one (cutting the old short): its result
could not be used any more.

Not unbiased: a stale gradient was computed at other parameters (the error is the staleness weight
times how much the partition's gradient moved since), and with persistent stragglers the fast
workers' partitions are applied more often than the slow ones' (with i.i.d. straggling every
partition is applied at the same rate on average). A worker that dies loses the gradient it was
computing (the runtime notices the death at the step it happens).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pdml_ray.config.gradient import GradientPriorityConfig
from pdml_ray.decisions import GradientDecision
from pdml_ray.priority.gradient import staleness_weight
from pdml_ray.stragglers.policy import Arrival, Combination, OnePartitionEach, make_combination


class AsyncPolicy(OnePartitionEach):
    name = "async"
    asynchronous = True

    def __init__(self, workers: int, stragglers: int, seed: int = 0, *,
                 gradient_priority: GradientPriorityConfig | None = None) -> None:
        super().__init__(workers, stragglers, seed)
        self.gradient_priority = gradient_priority or GradientPriorityConfig()
        self.max_staleness = self.gradient_priority.max_staleness

    @property
    def needed(self) -> int:
        return max(1, self.n - self.s)

    def adopt(self, decision: GradientDecision) -> None:
        self.max_staleness = decision.max_staleness

    def gives_task(self, worker: int, step: int, in_flight: int | None) -> bool:
        return in_flight is None or step - in_flight > self.max_staleness

    def usable(self, step: int, arrivals: Sequence[Arrival]) -> list[Arrival]:
        return [a for a in arrivals if staleness_weight(step - a.step, self.max_staleness) > 0]

    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        return len(self.usable(step, list(arrivals.values()))) >= min(self.needed, max(1, len(alive)))

    def feasible(self, alive: frozenset[int]) -> bool:
        return len(alive) >= 1

    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        used = self.usable(step, arrivals)
        m = len(used)
        weights = {a.worker: staleness_weight(step - a.step, self.max_staleness) / m for a in used}
        stale = sorted(step - a.step for a in used if a.step < step)
        return make_combination(step, weights, arrivals, self.num_partitions,
                                note=f"{m} of {len(arrivals)} arrived within S={self.max_staleness}, "
                                     f"stale by {stale or 'none'} weighted 1/(1+s)")

    def describe(self) -> str:
        return f"{self.name}(n={self.n}, {self.needed} per update, S={self.max_staleness})"
