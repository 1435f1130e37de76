"""``topk``: of the first n - s gradients that arrived, apply the top K by gradient priority.

Each of n workers computes its own partition; the step completes when n - s have arrived (as in
``ignore-stragglers``). Of the m that arrived, ``select_topk`` (``pdml_ray.priority.gradient``) picks
first every worker not applied for ``max_wait`` steps (the no-starvation bound: the set D, d of them),
then the highest priorities up to k = max(1, ceil(K m)) places (the set R, r of them). K, the
priorities and the bounds come from the gradient deriver's newest ``GradientDecision`` (``adopt``);
K follows the convergence rate between ``k_min`` and ``k_max`` (slower progress, larger K). Before any
decision: uniform priorities and K = ``k_max``.

Rescaling (weights of the applied sum, so it estimates the mean over the m arrived gradients):

    due worker (in D):        1 / m               it stands for itself
    chosen by priority (R):   (m - d) / (m r)     the r stand for all m - d arrived and not due

With ``selection="random"`` R is a uniform sample of r of the m - d not-due arrivals (seeded per
step): each is in R with probability r / (m - d), so the weights are Horvitz-Thompson weights and the
update is an UNBIASED estimate of the arrived mean (and of the full gradient, when who arrives does
not depend on the data, as with the emulated straggler models). With ``selection="priority"`` (the
default) R is deterministic: a not-chosen gradient has inclusion probability 0, so no reweighting can
make the update unbiased; it is the arrived mean tilted towards the high-priority gradients (the
point of the policy), and the bias vanishes as K -> 1 (progress stalls) and is bounded by the
no-starvation rule (every arriving gradient is applied at least once in any ``max_wait`` steps). If
more are due than k (r = 0 and d < m), the due ones are averaged (weight 1 / d): biased the same way.

No starvation covers workers that ARRIVE: one that is never among the first n - s (a persistent
straggler) is ignored as ``ignore-stragglers`` ignores it, unless ``wait_for_due=True``, which makes a
step also wait for every alive worker that is due (costing that straggler's time once per
``max_wait`` steps).
"""

from __future__ import annotations

import math
from typing import Iterable, Literal, Mapping, Sequence

import numpy as np

from pdml_ray.config.gradient import GradientPriorityConfig
from pdml_ray.decisions import GradientDecision
from pdml_ray.errors import ConfigError
from pdml_ray.priority.gradient import mark_applied, select_topk
from pdml_ray.stragglers.policies.ignore_stragglers import IgnoreStragglersPolicy
from pdml_ray.stragglers.policy import Arrival, Combination, make_combination

Selection = Literal["priority", "random"]


class TopKPolicy(IgnoreStragglersPolicy):
    name = "topk"

    def __init__(self, workers: int, stragglers: int, seed: int = 0, *,
                 gradient_priority: GradientPriorityConfig | None = None, selection: Selection = "priority",
                 fixed_weights: tuple[float, float, float] | None = None, wait_for_due: bool = False) -> None:
        super().__init__(workers, stragglers, seed)
        if selection not in ("priority", "random"):
            raise ConfigError(f"topk selection must be 'priority' or 'random', got {selection!r}")
        self.gradient_priority = gradient_priority or GradientPriorityConfig()
        self.selection: Selection = selection
        self.fixed_weights = fixed_weights
        self.wait_for_due = wait_for_due
        cfg = self.gradient_priority
        self.priorities = np.ones(self.n)
        self.k_fraction, self.max_wait = cfg.k_max, cfg.max_wait
        self.last_applied = np.full(self.n, -1, dtype=np.int64)  # step each worker's gradient was last applied

    def adopt(self, decision: GradientDecision) -> None:
        self.priorities = np.asarray(decision.priorities, dtype=np.float64)
        self.k_fraction, self.max_wait = decision.k_fraction, decision.max_wait

    def due(self, step: int, workers: Iterable[int]) -> list[int]:
        """Of ``workers``, those not applied for ``max_wait`` steps or more (never applied: since step -1)."""
        return [w for w in sorted(workers) if step - int(self.last_applied[w]) >= self.max_wait]

    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        if len(arrivals) < self.needed:
            return False
        return not self.wait_for_due or all(w in arrivals for w in self.due(step, alive))

    def choose(self, step: int, arrived: Sequence[int]) -> tuple[list[int], list[int]]:
        """(due, chosen by priority or at random) among ``arrived``."""
        m = len(arrived)
        due = self.due(step, arrived)
        if self.selection == "priority":
            chosen = select_topk(self.priorities.tolist(), arrived, self.k_fraction, self.last_applied.tolist(), step,
                                 self.max_wait)
            return due, [w for w in chosen if w not in due]
        k = max(1, math.ceil(self.k_fraction * m - 1e-9))
        rest = [w for w in sorted(arrived) if w not in due]
        r = min(len(rest), max(0, k - len(due)))
        rng = np.random.default_rng([self.seed, 7, step])
        return due, sorted(int(w) for w in rng.choice(rest, size=r, replace=False)) if r else []

    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        arrived = [a.worker for a in arrivals]
        m = len(arrived)
        due, rest = self.choose(step, arrived)
        d, r = len(due), len(rest)
        if r:
            weights = {w: 1.0 / m for w in due} | {w: (m - d) / (m * r) for w in rest}
        else:
            weights = {w: 1.0 / d for w in due}
        self.last_applied = mark_applied(self.last_applied.tolist(), list(weights), step)
        note = (f"{self.selection} top {r} of {m - d} (K {self.k_fraction:.2f}) + {d} due of {m} arrived, "
                f"{'unbiased (Horvitz-Thompson)' if self.selection == 'random' else 'biased to high priority'}")
        return make_combination(step, weights, arrivals, self.num_partitions, note=note)

    def describe(self) -> str:
        w = f", fixed weights {self.fixed_weights}" if self.fixed_weights is not None else ""
        return f"{self.name}(n={self.n}, s={self.s}, {self.selection}{w})"
