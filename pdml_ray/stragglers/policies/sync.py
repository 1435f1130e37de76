"""``sync``: wait for every worker, average all partitions (what an all-reduce does; the baseline).

A dead worker makes every later step impossible: ``feasible`` is False as soon as one is gone, and
the runtime reports the run as stalled, naming the dead worker.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pdml_ray.stragglers.policy import Arrival, Combination, OnePartitionEach


class SyncPolicy(OnePartitionEach):
    name = "sync"

    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        return len(arrivals) == self.num_workers

    def feasible(self, alive: frozenset[int]) -> bool:
        return len(alive) == self.num_workers

    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        return self.average(step, arrivals, "all workers")
