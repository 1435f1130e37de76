"""A run resumed from a checkpoint continues where it stopped, through ctx.batch_sampler and ctx.epoch: the
same steps with the same indices (every sample once per epoch), and a finished epoch resumes with the next
(no Ray: one worker, the scheduler in process)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import UsageError
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.context import PDMLContext

N, B = 96, 8  # 12 steps per epoch


def _context() -> PDMLContext:
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=B))
    ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", SchedulerClient(LocalSchedulerTransport(
        Scheduler(config, 1))))
    ctx.prepare_model(torch.nn.Linear(2, 1))
    return ctx


def _train(ctx: PDMLContext, epoch: int, sampler: bool, stop_after: int | None = None) -> list[list[int]]:
    """One epoch (from where the context stands); returns each step's indices. Stops after ``stop_after`` steps."""
    steps = []
    batches = ctx.batch_sampler(epoch, N) if sampler else ctx.epoch(epoch, N)
    for item in batches:
        indices = item if sampler else item.indices.tolist()
        with (ctx.step() if sampler else ctx.step(item)) as step:
            step.loss(F.mse_loss(ctx._params[0].sum() * torch.ones(len(indices)), torch.zeros(len(indices)),
                                 reduction="none"))
        steps.append(list(indices))
        if stop_after is not None and len(steps) == stop_after:
            break
    return steps


@pytest.mark.parametrize("sampler", [True, False], ids=["batch_sampler", "epoch"])
def test_a_resumed_run_continues_the_epoch_where_its_checkpoint_stopped(tmp_path, sampler):
    whole = _train(_context(), 0, sampler)
    first = _context()
    before = _train(first, 0, sampler, stop_after=5)
    assert first.save_scheduler_state(str(tmp_path))
    resumed = _context()
    assert resumed.load_scheduler_state(str(tmp_path))
    assert (resumed.global_step, resumed.start_epoch) == (5, 0)
    after = _train(resumed, 0, sampler)
    assert before + after == whole  # the same steps, the same indices
    assert sorted(i for step in before + after for i in step) == list(range(N))


@pytest.mark.parametrize("sampler", [True, False], ids=["batch_sampler", "epoch"])
def test_a_checkpoint_at_the_end_of_an_epoch_resumes_with_the_next(tmp_path, sampler):
    first = _context()
    _train(first, 0, sampler)
    assert first.save_scheduler_state(str(tmp_path))
    resumed = _context()
    resumed.load_scheduler_state(str(tmp_path))
    assert (resumed.global_step, resumed.start_epoch) == (N // B, 1)
    nxt = _train(resumed, 1, sampler)
    assert len(nxt) == N // B and sorted(i for step in nxt for i in step) == list(range(N))


def test_lead_steps_stay_what_a_checkpoint_with_pending_decisions_was_taken_with(tmp_path):
    first = _context()
    _train(first, 0, True, stop_after=5)
    first.save_scheduler_state(str(tmp_path))
    resumed = _context()
    resumed.load_scheduler_state(str(tmp_path))
    assert resumed.lead_steps == 8
    resumed._upcoming = [resumed.decision.__class__.uniform(B, 1)]  # a decision adopted for a later step
    with pytest.raises(UsageError, match="keep it"):
        resumed.batch_sampler(0, N, lead_steps=4)
    with pytest.raises(Exception, match=">= 1"):
        resumed.batch_sampler(0, N, lead_steps=0)
