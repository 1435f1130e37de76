"""Pipeline x data parallelism inside a Ray Train loop, without Ray: 4 gloo ranks as 2 stages x 2 replicas,
each replica running the scheduler's plan on torch's pipeline runtime, give the parameters of one SGD
step of the unsplit model on the whole batch."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.pipelining  # noqa: F401 - imported once here (~1 s), not in each forked rank

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import PDMLConfig, PipelineConfig
from pdml_ray.config.training import check_ray_train
from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.torch_exec import run_local_ranks
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.pipeline import PipelineContext
from pdml_ray.train.pipeline_latency import stage_latencies

WORKERS, MICROBATCHES, ROWS, LR, STEPS = 4, 2, 8, 0.1, 2
TOLERANCE = 1e-5


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def _batches(stages: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batch of each step: ROWS rows per replica."""
    gen = torch.Generator().manual_seed(1)
    replicas = WORKERS // stages
    return [(torch.randn(replicas * ROWS, 6, generator=gen), torch.randn(replicas * ROWS, 3, generator=gen))
            for _ in range(STEPS)]


def _train(rank: int, world_size: int, schedule: str, stages: int) -> dict[str, Any]:
    """This rank's run: rank 0 plans through an in-process scheduler (the same client calls as over the
    run's actor); the whole model's parameters after STEPS steps on rank 0, each step's loss everywhere."""
    config = PDMLConfig(pipeline=PipelineConfig(schedule=schedule, stages=stages))
    client = SchedulerClient(LocalSchedulerTransport(Scheduler(config, world_size))) if rank == 0 else None
    ctx = PipelineContext(config, rank, world_size, torch.device("cpu"), client)
    pipe = ctx.prepare(_model(), microbatches=MICROBATCHES, loss_fn=torch.nn.functional.mse_loss,
                       optimizer=lambda params: torch.optim.SGD(params, lr=LR))
    losses = []
    for x, y in _batches(stages):
        rows = slice(ctx.replica * ROWS, (ctx.replica + 1) * ROWS)
        losses.append(pipe.step(x[rows] if ctx.stage == 0 else None, y[rows] if ctx.stage == stages - 1 else None))
    state = pipe.state_dict()
    ctx.flush()
    stats = client.call("stats") if client is not None else None
    return {"stage": ctx.stage, "replica": ctx.replica, "losses": losses, "plans": pipe.plans.plan_changes,
            "state": {k: v.numpy() for k, v in state.items()} if state is not None else None,
            "reports": stats.reports_received if stats is not None else None,
            "pipeline": stats.derivers["pipeline"].plans if stats is not None else None,
            "observed": stats.derivers["pipeline"].steps_observed if stats is not None else None}


def _reference(stages: int) -> tuple[list[float], dict[str, np.ndarray]]:
    """STEPS SGD steps of the unsplit model on each whole global batch, in one process."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in _batches(stages):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("schedule, stages", [("1f1b", 2), ("gpipe", 4), ("1f1b", 1), ("osprey", 2)])
def test_stages_by_replicas_equal_full_batch_steps_of_the_unsplit_model(schedule: str, stages: int) -> None:
    # 2 x 2; 4 stages of one replica (no gradient all-reduce; the 5 layers leave one stage parameter-free);
    # 1 stage of 4 replicas (plain data parallel); osprey, planning from the latencies the ranks measure
    ranks = run_local_ranks(_train, WORKERS, schedule, stages, start_method="fork")  # no Ray here: fork is safe
    assert [(r["stage"], r["replica"]) for r in ranks] == [(k % stages, k // stages) for k in range(WORKERS)]
    ref_losses, ref_state = _reference(stages)
    initial = {k: v.detach().numpy() for k, v in _model().state_dict().items()}
    state = ranks[0]["state"]
    assert state.keys() == ref_state.keys()
    moved = max(float(np.abs(ref_state[k] - initial[k]).max()) for k in ref_state)
    diff = max(float(np.abs(state[k] - ref_state[k]).max()) for k in ref_state)
    print(f"{stages} stages x {WORKERS // stages} replicas ({schedule}), {STEPS} SGD steps: max abs parameter difference {diff:.2e} "
          f"(the steps moved them up to {moved:.2e})")
    assert moved > 1e-3 and diff <= TOLERANCE
    for r in ranks:  # every rank reports the global batch's mean loss
        assert np.allclose(r["losses"], ref_losses, atol=TOLERANCE), (r["losses"], ref_losses)
    assert ref_losses[1] < ref_losses[0]
    # the scheduler's pipeline axis planned each step (one ahead); rank 0's report of each step reached it
    # (the other ranks have no client here); the static plan, new versions of it every step, travelled once
    assert ranks[0]["pipeline"] >= STEPS and ranks[0]["reports"] == STEPS
    if schedule == "osprey":  # every step's action latencies reached the scheduler (static schedules send none)
        assert ranks[0]["observed"] == STEPS
    else:
        assert ranks[0]["observed"] == 0 and [r["plans"] for r in ranks] == [1] * WORKERS


@pytest.mark.parametrize("sections, match", [
    ({"node_priority": {"global_batch_size": 16}}, "node priorities stay off for pipeline runs.*Leave PDMLConfig.node_priority unset"),
    ({"sample_priority": {}}, "sample priorities do not act in pipeline runs"),
    ({"p3": {}}, "leave PDMLConfig.p3 unset with pipeline"),
])
def test_axes_a_pipeline_run_cannot_act_on_are_refused(sections: dict[str, Any], match: str) -> None:
    config = PDMLConfig.from_dict({"pipeline": {"schedule": "1f1b", "stages": 2}, **sections})
    with pytest.raises(ConfigError, match=match):
        check_ray_train(config, 4)


@pytest.mark.parametrize("pipeline, match", [
    ({"schedule": "1f1b"}, "needs pipeline.stages"),
    ({"schedule": "osprey", "stages": 2, "osprey": {"plans": "any"}}, "set pipeline.osprey.plans: full-backward"),
    ({"stages": 2, "rebalance": {"enabled": True}}, "set pipeline.rebalance.enabled: false"),
])
def test_a_pipeline_run_needs_its_stages_and_one_stage_per_worker(pipeline: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_ray_train(PDMLConfig.from_dict({"pipeline": pipeline}), 4)
    for schedule in ("gpipe", "osprey", "auto"):  # no node section needed
        check_ray_train(PDMLConfig.from_dict({"pipeline": {"schedule": schedule, "stages": 2}}), 4)


def test_a_steps_latencies_are_the_slowest_replicas_per_action() -> None:
    replica0 = [(0, "F", 0, 0.010), (0, "B", 0, 0.020)]
    replica1 = [(0, "F", 0, 0.030), (0, "B", 0, 0.015)]
    stage1 = [(1, "F", 0, 0.005)]
    assert stage_latencies([replica0, stage1, replica1, []]) == [(0, 0, "B", 0, 0.020), (0, 0, "F", 0, 0.030),
                                                                (1, 0, "F", 0, 0.005)]
