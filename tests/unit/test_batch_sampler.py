"""ctx.batch_sampler: a DataLoader (worker processes, prefetching) trains the same batches as ctx.epoch,
decisions switch lead_steps after the boundary that adopts them, and nothing runs too far ahead.
One worker, a real Scheduler in this process (the second worker's reports written in beside it, as
in test_context_adoption), no Ray."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from pdml_ray.client import SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import UsageError
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.context import PDMLContext

from test_context_adoption import TwoWorkers

N, B = 64 * 30, 64


def _ctx():
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=B, warmup_steps=0,
                                                         hysteresis=0.0, ema_alpha=1.0))
    scheduler = Scheduler(config, 2)
    return PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", SchedulerClient(TwoWorkers(scheduler, False))), scheduler


def _train(ctx, loader_kwargs, lead_steps=8, epochs=2):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(N, 4, generator=g), torch.randint(0, 2, (N,), generator=g), torch.arange(N))
    torch.manual_seed(0)
    model = ctx.prepare_model(torch.nn.Linear(4, 2))
    seen = []
    for epoch in range(epochs):
        loader = DataLoader(data, batch_sampler=ctx.batch_sampler(epoch, N, lead_steps=lead_steps), **loader_kwargs)
        for x, y, idx in loader:
            with ctx.step() as step:
                step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
            model.zero_grad()
            seen.append((epoch, idx.tolist()))
    return seen


def test_a_dataloader_with_worker_processes_trains_every_sample_once_and_switches_with_the_lead():
    ctx, scheduler = _ctx()
    seen = _train(ctx, {"num_workers": 2, "prefetch_factor": 2})
    for epoch in (0, 1):
        # rank 0 of two: its chunks; the other worker's are the rest of each global step
        mine = [i for e, idx in seen if e == epoch for i in idx]
        assert len(mine) == len(set(mine)) and len(mine) < N
    assert len(ctx.adopted) >= 3
    stamped = {(d["version"], d["effective_step"]) for d in scheduler.decision_history()}
    for step, version, sizes in ctx.adopted:
        assert (version, step) in stamped and step >= ctx.lead_steps  # in force at its stamped step
    # the sizes rank 0 trained each step are those of the decision in force at that step
    sizes = [len(idx) for _, idx in seen]
    assert len(set(sizes)) > 1


def test_the_sampler_covers_the_epoch_exactly_like_ctx_epoch():
    ctx, _ = _ctx()
    seen = _train(ctx, {"num_workers": 0}, epochs=1)
    ref, _ = _ctx()
    ref.prepare_model(torch.nn.Linear(4, 2))
    perm = np.random.default_rng([0, 0]).permutation(N)
    first_chunk = perm[: len(seen[0][1])].tolist()
    assert seen[0][1] == first_chunk  # the same permutation, cut from the start


def test_running_further_ahead_than_the_lead_is_refused():
    ctx, _ = _ctx()
    with pytest.raises(UsageError, match="lead_steps"):
        _train(ctx, {"num_workers": 2, "prefetch_factor": 4}, lead_steps=2, epochs=1)


def test_mixing_the_sampler_and_ctx_epoch_or_a_missing_batch_is_refused():
    ctx, _ = _ctx()
    with pytest.raises(UsageError, match="DataLoader"):
        ctx.step()
    ctx.batch_sampler(0, N)
    with pytest.raises(UsageError, match="batch_sampler"):
        next(iter(ctx.epoch(0, N)))
