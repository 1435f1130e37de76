"""``backup``: n + b workers, the first n results (Chen et al. 2016, "Revisiting distributed
synchronous SGD").

The data set is cut into n + b equal partitions, one per worker (each n / (n + b) the size of the
other policies' partitions); the step completes when n have arrived, weight 1/k each for the k that
arrived by then. It uses b more workers than the other policies: compare it knowing that.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pdml_ray.stragglers.policy import Arrival, Combination, OnePartitionEach


class BackupPolicy(OnePartitionEach):
    name = "backup"

    @property
    def num_workers(self) -> int:
        return self.n + self.s

    @property
    def num_partitions(self) -> int:
        return self.n + self.s

    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        return len(arrivals) >= self.n

    def feasible(self, alive: frozenset[int]) -> bool:
        return len(alive) >= self.n

    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        return self.average(step, arrivals, f"first {len(arrivals)} of {self.n}+{self.s} backup")

    def describe(self) -> str:
        return f"{self.name}(n={self.n}, b={self.s}: {self.num_workers} workers)"
