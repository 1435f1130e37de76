"""PDMLContext's decision switching, driven without Ray: a real Scheduler in this process.

The worker adopts each decision at exactly the step the scheduler stamped on it; a bundle that
arrives late is dropped and the scheduler re-issues its decision for the next boundary, so every
decision the worker ran is in the scheduler's history with the same version and step.

The context runs as rank 0 of what the scheduler sees as two workers; the second worker's reports
are written into the scheduler alongside rank 0's (its rate flips between a third and three times
rank 0's every flush, so node decisions keep coming).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.decisions import WorkerReport
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.context import PDMLContext


class BundleAnswer(tuple):
    """A pending bundle answer (the only calls this transport makes late)."""


class TwoWorkers(LocalSchedulerTransport):
    """Rank 0's calls go to the scheduler; each report flush also brings worker 1's reports. With
    ``late``, bundle answers arrive only at the boundary after the one they were asked for, half the time."""

    def __init__(self, scheduler, late):
        super().__init__(scheduler)
        self.late, self.polls, self.flushes = late, 0, 0

    def submit(self, method, *args):
        if method == "report":
            self.flushes += 1
            factor = 3.0 if self.flushes % 2 else 1 / 3
            mine = args[0]
            self.scheduler.report([WorkerReport(worker_id=1, step=r.step, samples=r.samples,
                                                compute_s=r.compute_s / factor) for r in mine])
        pending = super().submit(method, *args)
        return BundleAnswer(pending) if method == "bundle" else pending

    def ready(self, pending, timeout_s):
        if not isinstance(pending, BundleAnswer):  # reports are never late
            return True
        self.polls += 1
        return not (self.late and self.polls % 4 in (1, 2))


def _train(late, sample=False, steps=48):
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=64, warmup_steps=0,
                                                         hysteresis=0.0, ema_alpha=1.0),
                        sample_priority=SamplePriorityConfig() if sample else None)
    scheduler = Scheduler(config, 2)
    ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", SchedulerClient(TwoWorkers(scheduler, late)))
    torch.manual_seed(0)
    model = ctx.prepare_model(torch.nn.Linear(4, 2))
    x, y = torch.randn(steps * 64, 4), torch.randint(0, 2, (steps * 64,))
    for epoch in range(2):
        for batch in ctx.epoch(epoch, len(x)):
            if len(batch.indices) == 0:
                continue
            idx = torch.as_tensor(batch.indices)
            with ctx.step(batch) as step:
                step.loss(F.cross_entropy(model(x[idx]), y[idx], reduction="none")).backward()
            model.zero_grad()
            if ctx.global_step >= steps:
                break
    ctx.flush()
    return ctx, scheduler


@pytest.mark.parametrize("late", [False, True])
def test_every_adopted_decision_is_the_one_the_scheduler_stamped(late):
    ctx, scheduler = _train(late)
    stamped = {(d["version"], d["effective_step"]): tuple(d["batch_sizes"]) for d in scheduler.decision_history()}
    assert len(ctx.adopted) >= 3, ctx.adopted
    for step, version, sizes in ctx.adopted:
        assert stamped[(version, step)] == sizes, (step, version, sizes, stamped)
    assert (ctx.stale_bundles >= 1) == late  # late answers are dropped, never adopted at a step they were not for


def test_sample_plans_reach_the_worker_and_its_losses_reach_the_table():
    ctx, scheduler = _train(late=False, sample=True, steps=20)
    table = scheduler.derivers["sample"].table
    assert table is not None and table.seen.sum() > 0
    assert ctx.versions["sample"] >= 1 and np.isfinite(scheduler.stats().derivers["sample"].epoch)
