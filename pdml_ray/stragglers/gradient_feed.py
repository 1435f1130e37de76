"""Feeds a straggler policy's gradient priorities: the step's worker reports go into an in-process
``Scheduler`` with the node and gradient derivers enabled (the same ``GradientPriorityDeriver`` the
Ray Train path runs, not a copy), and every ``interval`` steps its ``GradientDecision`` goes to
``policy.adopt``.

Why in-process and not the scheduler actor: the aggregator needs the decision inside the step it
combines; an actor round trip (~1 ms, more on a busy machine) would cost more than the derivers
themselves. The cost is measured, not assumed: ``cost_s`` sums the time spent in ``report`` and
``bundle`` (and the runtime calls ``observe`` inside its timed step, so the cost is in the step time
too). The node deriver's rates come from the reports' ``compute_s`` (EMULATED compute included) and
give the node-health term; the data term reads the reported losses (no sample table here: the
straggler runtime's workers hold fixed partitions).

``fixed_weights`` pins (alpha, beta, gamma): the deriver's bandit gets that one arm (so "fixed" is the
same deriver with nothing to tune). Pure: no Ray, no clocks besides ``perf_counter`` for the cost.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from pdml_ray.config import GradientPriorityConfig, NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, GradientDecision, WorkerReport
from pdml_ray.priority.bandit import WeightBandit
from pdml_ray.priority.gradient import GradientPriorityDeriver
from pdml_ray.scheduler import Scheduler
from pdml_ray.stragglers.policy import StragglerPolicy


class GradientFeed:
    """An in-process scheduler deriving gradient priorities for ``num_workers`` workers."""

    def __init__(self, config: GradientPriorityConfig, num_workers: int, samples_per_worker: int, *,
                 interval: int = 5, fixed_weights: tuple[float, float, float] | None = None, seed: int = 0) -> None:
        if fixed_weights is not None:
            config = dataclasses.replace(config, prior_weights=tuple(fixed_weights))  # type: ignore[arg-type]
        self.config, self.interval, self.fixed_weights = config, int(interval), fixed_weights
        node = NodePriorityConfig(global_batch_size=num_workers * max(1, samples_per_worker), warmup_steps=0,
                                  decision_interval=self.interval)
        self.scheduler = Scheduler(PDMLConfig(node_priority=node, gradient_priority=config, seed=seed), num_workers)
        deriver = self.scheduler.derivers["gradient"]
        assert isinstance(deriver, GradientPriorityDeriver)
        self.deriver = deriver
        if fixed_weights is not None:
            w = config.prior_weights
            self.deriver.bandit = WeightBandit((w,), config.bandit_discount, config.bandit_exploration)
        self.batch_sizes = (max(1, samples_per_worker),) * num_workers
        self.since: dict[str, int] = {}
        self.cost_s = 0.0
        """Seconds spent in the scheduler (report + bundle), summed."""
        self.k_history: list[tuple[int, float]] = []
        """(step, K) of every gradient decision adopted."""
        self.weight_history: list[tuple[int, tuple[float, float, float]]] = []
        self.decision: GradientDecision | None = None
        self._buffer: list[WorkerReport] = []

    @classmethod
    def for_policy(cls, policy: StragglerPolicy, samples_per_worker: int, **kwargs: object) -> GradientFeed | None:
        """The feed ``policy`` asks for (``policy.gradient_priority``), or None."""
        if policy.gradient_priority is None:
            return None
        fixed = getattr(policy, "fixed_weights", None)
        return cls(policy.gradient_priority, policy.num_workers, samples_per_worker, fixed_weights=fixed,
                   seed=policy.seed, **kwargs)  # type: ignore[arg-type]

    def observe(self, step: int, reports: Sequence[WorkerReport], policy: StragglerPolicy) -> GradientDecision | None:
        """Take ``step``'s completed reports; at a boundary (ingest them all, then) (every ``interval`` steps) decide and hand a
        new decision to ``policy.adopt``. Returns the decision adopted now, if any."""
        t0 = time.perf_counter()
        # buffered: the derivers decide only at boundaries, so one report call per interval loses
        # nothing and pays the scheduler's per-call cost once
        self._buffer.extend(r for r in reports if r.samples > 0 and math.isfinite(r.compute_s))
        adopted = None
        if step > 0 and step % self.interval == 0:
            if self._buffer:
                self.scheduler.report(self._buffer)
                self._buffer = []
            bundle = self.scheduler.bundle(Boundary(step, self.interval, self.batch_sizes), self.since)
            self.since.update({name: d.version for name, d in bundle.decisions.items()})
            d = bundle.get("gradient")
            if isinstance(d, GradientDecision):
                d.validate(policy.num_workers)
                policy.adopt(d)
                self.decision = adopted = d
                self.k_history.append((step, d.k_fraction))
                self.weight_history.append((step, d.weights))
        self.cost_s += time.perf_counter() - t0
        return adopted

    def stats(self) -> dict[str, object]:
        """The deriver's figures for a benchmark: high/low gradient-norm ratio, weights, K, arms pulled."""
        s = self.deriver.stats()
        return {"high_low_grad_norm_ratio": s.high_low_grad_norm_ratio, "weights": s.weights,
                "k_fraction": s.k_fraction, "arm_pulls": s.arm_pulls, "collapse_resets": s.collapse_resets,
                "progress_rate": s.progress_rate, "cost_s": self.cost_s}
