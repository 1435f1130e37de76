"""A checkpoint written by a worker group of another size resumes an elastic run (no Ray: one worker, the
scheduler in process): the position carries over, the rest of the epoch is the same permutation from
the checkpoint's offset, the old count's decision is dropped, and the start-up boundary brings the
resized scheduler's decision at the restart step. A run of a fixed size still refuses that checkpoint."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import NodeDecision
from pdml_ray.errors import StateError
from pdml_ray.scheduler import Scheduler
from pdml_ray.state_format import write_state
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.saved_state import SCHEDULER_STATE_FILE

N, B, K = 96, 8, 4  # 12 steps per epoch
CONFIG = PDMLConfig(decision_interval=K, seed=3, node_priority=NodePriorityConfig(global_batch_size=B))


def _checkpoint_of_two_workers(directory: str, step: int, offset: int) -> None:
    """What rank 0 of a 2-worker group writes after ``step`` steps, ``offset`` samples into epoch 0."""
    decision = NodeDecision.uniform(B, 2)
    write_state(os.path.join(directory, SCHEDULER_STATE_FILE),
                {"state": Scheduler(CONFIG, 2).state_dict(), "decision": decision, "versions": {"node": 0},
                 "global_step": step, "position": (0, offset), "lead_steps": 0, "upcoming": (), "horizon": step})


def _context(elastic: bool) -> PDMLContext:
    scheduler = Scheduler(CONFIG, 2)
    scheduler.resize(1)  # what rank 0 does as the new group starts
    ctx = PDMLContext(CONFIG, 0, 1, torch.device("cpu"), "CPU", SchedulerClient(LocalSchedulerTransport(scheduler)))
    ctx.elastic = elastic
    ctx.prepare_model(torch.nn.Linear(2, 1))
    return ctx


def test_an_elastic_run_resumes_a_checkpoint_of_another_worker_count(tmp_path):
    _checkpoint_of_two_workers(str(tmp_path), step=5, offset=40)
    ctx = _context(elastic=True)
    assert ctx.load_scheduler_state(str(tmp_path))
    assert (ctx.global_step, ctx.start_epoch, ctx.decision.batch_sizes) == (5, 0, (B,))
    trained = []
    for batch in ctx.epoch(0, N):
        with ctx.step(batch) as step:
            step.loss(F.mse_loss(ctx._params[0].sum() * torch.ones(len(batch.indices)), torch.zeros(len(batch.indices)),
                                 reduction="none"))
        trained += batch.indices.tolist()
    perm = np.random.default_rng([CONFIG.seed, 0]).permutation(N)
    assert trained == perm[40:].tolist()  # the rest of the epoch, in the epoch's order, each sample once
    assert ctx.global_step == 5 + (N - 40) // B
    assert ctx.adopted and ctx.adopted[0][0] == 5  # the resized scheduler's decision, from the restart step


def test_a_fixed_size_run_refuses_a_checkpoint_of_another_worker_count(tmp_path):
    _checkpoint_of_two_workers(str(tmp_path), step=5, offset=40)
    with pytest.raises(StateError, match="another PDMLConfig or number of workers"):
        _context(elastic=False).load_scheduler_state(str(tmp_path))
