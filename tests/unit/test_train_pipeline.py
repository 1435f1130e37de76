"""Pipeline x data parallelism inside a Ray Train loop, without Ray: 4 gloo ranks as 2 stages x 2 replicas,
each replica running the scheduler's plan on torch's pipeline runtime, give the parameters of one SGD
step of the unsplit model on the whole batch; a run resumed from a checkpoint continues exactly."""

from __future__ import annotations

import copy
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import PDMLConfig, PipelineConfig
from pdml_ray.config.training import check_ray_train
from pdml_ray.errors import ConfigError, StateError
from pdml_ray.pipeline.torch_exec import run_local_ranks
from pdml_ray.scheduler import Scheduler
from pdml_ray.state_format import write_state
from pdml_ray.train.pipeline import PipelineContext
from pdml_ray.train.pipeline_latency import stage_latencies
from pdml_ray.train.saved_state import SCHEDULER_STATE_FILE, SavedRunState, read_saved_run

WORKERS, MICROBATCHES, ROWS, LR, STEPS = 4, 2, 8, 0.1, 2
TOLERANCE = 1e-5


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def _batches(stages: int, steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batch of each step: ROWS rows per replica."""
    gen = torch.Generator().manual_seed(1)
    replicas = WORKERS // stages
    return [(torch.randn(replicas * ROWS, 6, generator=gen), torch.randn(replicas * ROWS, 3, generator=gen))
            for _ in range(steps)]


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
    ranks = run_local_ranks(_train, WORKERS, schedule, stages)
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


RESUME_STEPS, SAVE_AT = 4, 2


def _resumable(rank: int, world_size: int, directory: str, resume: bool, optimizer_state: bool) -> dict[str, Any]:
    """A 2 x 2 run of RESUME_STEPS Adam steps as a Ray Train loop writes it: straight through, saving a
    checkpoint after step SAVE_AT (the model and each stage's optimizer from the pipeline, pdml-ray's
    state as ctx.report adds it); or, with ``resume``, fresh ranks and a fresh scheduler that restore it
    (as PDMLTrainer does before the loop, then the loop) and train the steps left."""
    config = PDMLConfig(pipeline=PipelineConfig(schedule="1f1b", stages=2))
    client = SchedulerClient(LocalSchedulerTransport(Scheduler(config, world_size))) if rank == 0 else None
    ctx = PipelineContext(config, rank, world_size, torch.device("cpu"), client)
    if resume:
        assert ctx.load_scheduler_state(directory)
    pipe = ctx.prepare(_model(), microbatches=MICROBATCHES, loss_fn=torch.nn.functional.mse_loss,
                       optimizer=lambda params: torch.optim.Adam(params, lr=0.01))
    if resume:  # every rank reads the checkpoint
        saved = torch.load(os.path.join(directory, "model.pt"))
        if not optimizer_state:  # (the control run) optimizer states cut for another stage count are refused
            with pytest.raises(StateError, match=r"holds 1 stages' states .* resume with pipeline.stages=1"):
                pipe.load_state_dict(saved["model"], {"stages": saved["optimizer"]["stages"][:1]})
        pipe.load_state_dict(saved["model"], saved["optimizer"] if optimizer_state else None)
    batches, losses = _batches(2, RESUME_STEPS), []
    for step in range(ctx.start_step, RESUME_STEPS):
        x, y = batches[step]
        rows = slice(ctx.replica * ROWS, (ctx.replica + 1) * ROWS)
        losses.append(pipe.step(x[rows], y[rows]))
        if step + 1 == SAVE_AT and not resume:
            model_state, optimizers = pipe.state_dict(), pipe.optimizer_state_dict()  # collectives: on rank 0
            if rank == 0:
                torch.save({"model": model_state, "optimizer": optimizers}, os.path.join(directory, "model.pt"))
                assert ctx.save_scheduler_state(directory)
    state = pipe.state_dict()
    ctx.flush()
    stats = client.call("stats") if client is not None else None
    return {"start": ctx.start_step, "losses": losses,
            "state": {k: v.numpy() for k, v in state.items()} if state is not None else None,
            "reports": stats.reports_received if stats is not None else None}


def test_a_resumed_run_continues_with_its_optimizer_and_scheduler_state(tmp_path: Path) -> None:
    # 4 Adam steps straight vs 2 steps, a checkpoint, fresh ranks that load it and train 2 more
    straight = run_local_ranks(_resumable, WORKERS, str(tmp_path), False, True)
    resumed = run_local_ranks(_resumable, WORKERS, str(tmp_path), True, True)
    initial = {k: v.detach().numpy() for k, v in _model().state_dict().items()}
    end, again = straight[0]["state"], resumed[0]["state"]
    moved = max(float(np.abs(end[k] - initial[k]).max()) for k in end)
    diff = max(float(np.abs(end[k] - again[k]).max()) for k in end)
    print(f"2 x 2, {RESUME_STEPS} Adam steps straight vs resumed after {SAVE_AT}: max abs parameter difference "
          f"{diff:.2e} (the steps moved them up to {moved:.2e})")
    assert moved > 1e-2 and diff <= 1e-6
    for a, b in zip(straight, resumed):  # every rank continues at step SAVE_AT with the same losses
        assert b["start"] == SAVE_AT and np.allclose(b["losses"], a["losses"][SAVE_AT:], rtol=0, atol=1e-6)
    # the scheduler resumed from its saved state: rank 0's reports of the first steps are counted (a fresh one: 2)
    assert resumed[0]["reports"] == straight[0]["reports"] == RESUME_STEPS
    # the control: without the optimizer state (Adam's moments and step) the same resume ends elsewhere
    fresh = run_local_ranks(_resumable, WORKERS, str(tmp_path), True, False)[0]["state"]
    assert max(float(np.abs(end[k] - fresh[k]).max()) for k in end) > 1e-3


def test_a_pipeline_state_of_another_shape_or_kind_is_refused_before_anything_changes(tmp_path: Path) -> None:
    config = PDMLConfig(pipeline=PipelineConfig(schedule="1f1b", stages=2))
    state = Scheduler(config, WORKERS).state_dict()
    ctx = PipelineContext(config, 1, WORKERS, torch.device("cpu"), None)  # not rank 0: no scheduler client
    assert not ctx.load_scheduler_state(str(tmp_path))  # no pdml-ray state: a fresh start
    path = tmp_path / SCHEDULER_STATE_FILE
    write_state(path, {"state": state, "global_step": 5, "stages": 4})
    with pytest.raises(StateError, match=r"run of 4 stages and this one has 2 \(set pipeline.stages=4\)"):
        ctx.load_scheduler_state(str(tmp_path))
    write_state(path, {f.name: 0 for f in fields(SavedRunState)})  # a data-parallel run's keys
    with pytest.raises(StateError, match=r"\(a data-parallel run's checkpoint\?\)"):
        ctx.load_scheduler_state(str(tmp_path))
    write_state(path, {"state": state, "global_step": 5, "stages": 4})
    with pytest.raises(StateError, match=r"\(a pipeline run's checkpoint\?\)"):  # and the other way round
        read_saved_run(str(tmp_path), config, WORKERS, elastic=False)
    write_state(path, {"state": state, "decision": None, "global_step": 5})  # neither kind's
    with pytest.raises(StateError, match=r"does not hold the global_step, stages, state a pipeline run's "
                                         r"save_scheduler_state writes\. Resume"):
        ctx.load_scheduler_state(str(tmp_path))
    assert ctx.start_step == 0
    write_state(path, {"state": state, "global_step": 5, "stages": 2})
    assert ctx.load_scheduler_state(str(tmp_path)) and ctx.start_step == 5


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
