"""``ignore-stragglers``: take the first n - s results and rescale ("wait for the fastest m").

Each of n workers computes its own partition; the step completes when n - s have arrived (all that
arrived by then are used, weight 1/k each for k results). The result is the mean over the arrived
partitions: an unbiased but noisy estimate of the full gradient, missing the stragglers' data.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pdml_ray.stragglers.policy import Arrival, Combination, OnePartitionEach


class IgnoreStragglersPolicy(OnePartitionEach):
    name = "ignore-stragglers"

    @property
    def needed(self) -> int:
        return self.n - self.s

    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        return len(arrivals) >= self.needed

    def feasible(self, alive: frozenset[int]) -> bool:
        return len(alive) >= self.needed

    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        return self.average(step, arrivals, f"first {len(arrivals)} of {self.n}, rescaled")
