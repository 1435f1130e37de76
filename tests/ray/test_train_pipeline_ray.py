"""Pipeline x data parallelism inside ``PDMLTrainer``: 4 Ray Train workers of half a CPU each run 2 stages
x 2 replicas on torch's pipeline runtime, osprey planning from the latencies they measure; after 3 steps
the checkpoint reported through Ray Train holds the parameters and momentum buffers of 3 SGD steps of the
unsplit model on the whole batches, and pdml-ray's state (the steps trained)."""

import os
import tempfile

import numpy as np
import pytest
import ray
import ray.train
import torch

from pdml_ray.config import NodePriorityConfig, PDMLConfig, PipelineConfig
from pdml_ray.errors import ConfigError
from pdml_ray.state_format import read_state
from pdml_ray.train import PDMLTrainer, get_pipeline_context
from pdml_ray.train.saved_state import SCHEDULER_STATE_FILE

pytestmark = pytest.mark.ray

STAGES, WORKERS, MICROBATCHES, ROWS, LR, MOMENTUM, STEPS = 2, 4, 2, 8, 0.1, 0.9, 3


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's global batch: ROWS rows per replica."""
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(2 * ROWS, 6, generator=gen), torch.randn(2 * ROWS, 3, generator=gen)) for _ in range(STEPS)]


def pipeline_loop() -> None:
    torch.set_num_threads(1)
    ctx = get_pipeline_context()
    pipe = ctx.prepare(_model(), microbatches=MICROBATCHES, loss_fn=torch.nn.functional.mse_loss,
                       optimizer=lambda params: torch.optim.SGD(params, lr=LR, momentum=MOMENTUM))
    losses = []
    for x, y in _batches():
        rows = slice(ctx.replica * ROWS, (ctx.replica + 1) * ROWS)  # this replica's share of the global batch
        losses.append(pipe.step(x[rows], y[rows]))
    state, optimizers = pipe.state_dict(), pipe.optimizer_state_dict()  # every rank calls them; rank 0 has them
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if ctx.rank == 0:
            torch.save({"model": state, "optimizer": optimizers}, os.path.join(d, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(d)  # ctx.report adds pdml-ray's state to it
        ctx.report({"losses": losses, "stage": ctx.stage, "replica": ctx.replica}, checkpoint=checkpoint)


def test_a_pipeline_run_trains_as_the_unsplit_model_and_reports_a_loadable_checkpoint(ray_local, tmp_path):
    # osprey: its plans (and the action latencies they rest on) travel through the run's scheduler actor
    config = PDMLConfig(pipeline=PipelineConfig(schedule="osprey", stages=STAGES), decision_interval=2)
    result = PDMLTrainer(pipeline_loop, pdml_config=config,
                         scaling_config=ray.train.ScalingConfig(num_workers=WORKERS, resources_per_worker={"CPU": 0.5}),
                         run_config=ray.train.RunConfig(name="pipeline-dp", storage_path=str(tmp_path))).fit()
    model, reference = _model(), _model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    ref_losses = []
    for x, y in _batches():
        loss = torch.nn.functional.mse_loss(reference(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        ref_losses.append(float(loss.detach()))
    with result.checkpoint.as_directory() as d:
        saved = torch.load(os.path.join(d, "model.pt"))
        pdml_state = read_state(os.path.join(d, SCHEDULER_STATE_FILE))
    model.load_state_dict(saved["model"])
    diff = max(float((a - b).abs().max()) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert diff <= 1e-5, diff
    # each stage's momentum buffers, in stage order, are the unsplit model's in parameter order
    stages = saved["optimizer"]["stages"]
    assert len(stages) == STAGES and all(s is not None for s in stages)
    buffers = [s["state"][i]["momentum_buffer"] for s in stages for i in sorted(s["state"])]
    expected = [optimizer.state[p]["momentum_buffer"] for p in reference.parameters()]
    assert len(buffers) == len(expected) and max(float((a - b).abs().max()) for a, b in zip(buffers, expected)) <= 1e-5
    assert pdml_state["global_step"] == STEPS and pdml_state["stages"] == STAGES  # a resumed run starts at step 3
    m = result.metrics  # rank 0's: stage 0 of replica 0, with the global batch's loss
    assert (m["stage"], m["replica"]) == (0, 0) and np.allclose(m["losses"], ref_losses, atol=1e-5)
    assert ref_losses[-1] < ref_losses[0]
    assert (m["pdml/pipeline_stages"], m["pdml/pipeline_replicas"], m["pdml/step"]) == (2.0, 2.0, float(STEPS))
    assert m["pdml/pipeline_plan_changes"] >= 1.0 and m["pdml/pipeline_plan_fallbacks_total"] >= 0.0
    stats = result.pdml.stats
    assert stats.derivers["pipeline"].plans >= STEPS and stats.reports_received >= WORKERS * 2  # every 2 steps
    assert stats.derivers["pipeline"].steps_observed >= STEPS - 1  # the last step's latencies may still be in flight
    assert stats.derivers["pipeline"].observations_rejected == 0
    assert not result.pdml.warnings


def test_node_priorities_with_a_pipeline_are_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="node priorities stay off for pipeline runs"):
        PDMLTrainer(pipeline_loop, scaling_config=ray.train.ScalingConfig(num_workers=4),
                    pdml_config=PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=16),
                                           pipeline=PipelineConfig(schedule="1f1b", stages=2)))
    with pytest.raises(ConfigError, match=r"pipeline.stages=3 must divide .*num_workers=4"):
        PDMLTrainer(pipeline_loop, scaling_config=ray.train.ScalingConfig(num_workers=4),
                    pdml_config=PDMLConfig(pipeline=PipelineConfig(schedule="1f1b", stages=3)))
