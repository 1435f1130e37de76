"""Feeds a straggler policy's gradient priorities from the run's scheduler, its ``gradient`` axis.

The step's completed worker reports go to a ``Scheduler`` whose only axis is the gradient deriver (the
same ``GradientPriorityDeriver`` the Ray Train path runs; no node section: without one it measures each
worker's rate itself for the node-health term), through ``SchedulerClient`` over a transport: the
straggler runtime passes the run's scheduler actor (so the run shows in ``pdml-ray status`` and the
metrics), the simulator an in-process scheduler (``LocalSchedulerTransport``) on the same code path.

Every ``interval`` steps the buffered reports go out and the next ``GradientDecision`` is requested;
the aggregator never waits for it: it is adopted (``policy.adopt``) at the first step its answer is
there (in-process: at once, the same step), and the policy applies the rule it holds to each step's
arrivals locally. A request that could not go out (the previous answer was still on its way: a slow
or loaded scheduler) is sent at the first step after that answer is in, so a slow scheduler delays
decisions rather than skipping them (``requests_sent`` counts them). ``cost_s`` is the time the aggregator spent on the feed inside its timed step.

``fixed_weights`` pins (alpha, beta, gamma): the deriver's bandit gets that one arm
(``simplex_resolution=0``), so "fixed" is the same deriver with nothing to tune. Pure: no Ray here.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient, SchedulerTransport
from pdml_ray.config import GradientPriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, GradientDecision, WorkerReport
from pdml_ray.scheduler import Scheduler
from pdml_ray.stragglers.policy import StragglerPolicy


def feed_config(config: GradientPriorityConfig, seed: int = 0,
                fixed_weights: tuple[float, float, float] | None = None, decision_interval: int = 5) -> PDMLConfig:
    """The scheduler config of a straggler run's gradient axis (and nothing else), deciding every
    ``decision_interval`` steps."""
    if fixed_weights is not None:
        config = dataclasses.replace(config, prior_weights=tuple(fixed_weights), simplex_resolution=0)  # type: ignore[arg-type]
    return PDMLConfig(gradient_priority=config, seed=seed, decision_interval=decision_interval)


class GradientFeed:
    """Gradient decisions for ``num_workers`` workers from a scheduler's gradient axis."""

    def __init__(self, config: GradientPriorityConfig, num_workers: int, *, interval: int = 5,
                 fixed_weights: tuple[float, float, float] | None = None, seed: int = 0,
                 transport: SchedulerTransport | None = None) -> None:
        self.pdml_config = feed_config(config, seed, fixed_weights, interval)
        self.config, self.fixed_weights = self.pdml_config.gradient_priority, fixed_weights
        self.interval = self.pdml_config.decision_interval
        self.scheduler: Scheduler | None = None
        if transport is None:  # in this process (the simulator)
            self.scheduler = Scheduler(self.pdml_config, num_workers)
            transport = LocalSchedulerTransport(self.scheduler)
        self.client = SchedulerClient(transport)
        self.since: dict[str, int] = {}
        self.cost_s = 0.0
        """Seconds the aggregator spent on the feed (sending reports, polling, adopting), summed."""
        self.k_history: list[tuple[int, float]] = []
        """(step, K) of every gradient decision adopted, at the step it was adopted."""
        self.weight_history: list[tuple[int, tuple[float, float, float]]] = []
        self.decision: GradientDecision | None = None
        self._buffer: list[WorkerReport] = []
        self._owed: Boundary | None = None  # a boundary whose request could not go out yet
        self.requests_sent = 0
        self._closed_stats: dict[str, object] | None = None

    @classmethod
    def for_policy(cls, policy: StragglerPolicy, **kwargs: Any) -> GradientFeed | None:
        """The feed ``policy`` asks for (``policy.gradient_priority``), or None."""
        if policy.gradient_priority is None:
            return None
        return cls(policy.gradient_priority, policy.num_workers, fixed_weights=getattr(policy, "fixed_weights", None),
                   seed=policy.seed, **kwargs)

    def observe(self, step: int, reports: Sequence[WorkerReport], policy: StragglerPolicy) -> GradientDecision | None:
        """Take ``step``'s completed reports; at every ``interval``-th step send them and ask for a
        decision; adopt an answer that is there. Returns the decision adopted now, if any."""
        t0 = time.perf_counter()
        # buffered: the deriver decides only at boundaries, so one report call per interval loses nothing
        self._buffer.extend(r for r in reports if r.samples > 0 and math.isfinite(r.compute_s))
        if step > 0 and step % self.interval == 0:
            if self._buffer:
                self.client.report(self._buffer)
                self._buffer = []
            self._owed = Boundary(step, self.interval, ())
        bundle = self.client.poll(0.0)  # first: an answer in frees the slot for the request owed
        if self._owed is not None and not self.client.request_pending:
            # an unreachable scheduler drops it: the next boundary asks again (no lookup every step)
            sent = self.client.request(dataclasses.replace(self._owed, first_step=step), self.since)
            self._owed = None
            self.requests_sent += sent
            if sent and bundle is None:
                bundle = self.client.poll(0.0)  # in this process it is answered at once
        adopted = None
        d = bundle.get("gradient") if bundle is not None else None
        if isinstance(d, GradientDecision):
            d.validate(policy.num_workers)
            policy.adopt(d)
            self.since["gradient"] = d.version
            self.decision = adopted = d
            self.k_history.append((step, d.k_fraction))
            self.weight_history.append((step, d.weights))
        self.cost_s += time.perf_counter() - t0
        return adopted

    def stats(self) -> dict[str, object]:
        """The deriver's figures for a benchmark: high/low gradient-norm ratio, weights, K, arms pulled
        (after ``close``: as they were then)."""
        if self._closed_stats is not None:
            return self._closed_stats
        stats = self.client.call("stats")
        s = stats.derivers["gradient"]
        return {"high_low_grad_norm_ratio": s.high_low_grad_norm_ratio, "weights": s.weights,
                "k_fraction": s.k_fraction, "arm_pulls": s.arm_pulls, "collapse_resets": s.collapse_resets,
                "progress_rate": s.progress_rate, "cost_s": self.cost_s,
                "scheduler_cpu_s": stats.process_cpu_s}  # the actor's process (None in this process)

    def close(self) -> None:
        """The run is over (its scheduler is about to end): keep the figures ``stats`` reads from it."""
        if self._closed_stats is None:
            self._closed_stats = self.stats()
