"""``gc-fr`` / ``gc-cr``: gradient coding (Tandon et al. 2017, "Gradient coding").

Each of n workers computes all s + 1 partitions it holds every step and sends one coded message
``sum_p B[i, p] g_p`` (``pdml_ray.stragglers.coding``). The step completes as soon as the arrived
set can decode (FR: one worker of every group, which may be before n - s have arrived; CR: generically
any n - s), and the decode gives exactly the mean of all n fresh partition gradients: the combination
is ``exact`` with staleness 0, and ``decode_error`` is the decode's float32 error bound
(``coding.Decoding.error_bound``: at most 1e-4 of the mean partition-gradient norm, or the code is
refused when it is built). The price: s + 1 partitions of compute per worker per step.
"""

from __future__ import annotations

from typing import ClassVar, Mapping, Sequence

from pdml_ray.errors import PlanError
from pdml_ray.stragglers.coding import GradientCode
from pdml_ray.stragglers.policy import Arrival, Combination, StragglerPolicy, WorkerTask, make_combination


class GradientCodingPolicy(StragglerPolicy):
    scheme: ClassVar[str] = "cr"

    def __init__(self, workers: int, stragglers: int, seed: int = 0) -> None:
        super().__init__(workers, stragglers, seed)
        self.code = GradientCode(self.n, self.s, self.scheme, seed)

    def placement(self, worker: int) -> tuple[int, ...]:
        return self.code.supports[worker]

    def task(self, worker: int, step: int) -> WorkerTask:
        return WorkerTask(worker, step, self.placement(worker), self.code.coefficients(worker))

    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        return self.code.decodable(arrivals)

    def feasible(self, alive: frozenset[int]) -> bool:
        return self.code.decodable(alive)

    def decode_weights(self, step: int, arrivals: Sequence[Arrival]) -> tuple[dict[int, float], float]:
        decoding = self.code.decode(a.worker for a in arrivals)
        if decoding is None:
            raise PlanError(f"{self.name} step {step}: workers {sorted(a.worker for a in arrivals)} cannot decode; "
                            "combine only once ready() is True")
        return {w: c / self.n for w, c in decoding.as_dict().items()}, decoding.error_bound

    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        weights, err = self.decode_weights(step, arrivals)
        return make_combination(step, weights, arrivals, self.n, err,
                                f"{self.scheme.upper()} decode of {len(weights)} of {len(arrivals)} arrived")


class FRGradientCoding(GradientCodingPolicy):
    name = "gc-fr"
    scheme = "fr"


class CRGradientCoding(GradientCodingPolicy):
    name = "gc-cr"
    scheme = "cr"
