"""pdml-ray's figures reach Ray Train's reported metrics: ``ctx.report`` adds them under ``pdml/`` keys,
so ``Result.metrics`` (Ray Train v2: the metrics reported with the newest checkpoint) carries them next
to the user's own, which always win."""

import os
import tempfile

import pytest
import ray
import ray.train
import torch
import torch.nn.functional as F

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer, get_context
from pdml_ray.train.workloads import make_classification, make_mlp

STEPS = 12


def reporting_loop(config):
    """Two epochs of a small MLP; ``ctx.report`` at the end of each, with a user key named like a pdml one."""
    torch.set_num_threads(1)
    ctx = get_context()
    x, y = make_classification(STEPS * 64, 16, 2, seed=0)
    model = ctx.prepare_model(make_mlp(16, 32, 2, depth=1, seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        loss = None
        for batch in ctx.epoch(epoch, len(x)):
            with ctx.step(batch) as step:
                loss = step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none"))
                loss.backward()
            opt.step()
            opt.zero_grad()
        with tempfile.TemporaryDirectory() as d:  # Ray Train keeps the metrics reported with a checkpoint
            torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            ctx.report({"epoch": epoch, "loss": float(loss), "pdml/global_step": -1.0},
                       checkpoint=ray.train.Checkpoint.from_directory(d))


@pytest.fixture(scope="module")
def result(ray_local, tmp_path_factory):
    storage = tmp_path_factory.mktemp("result_metrics")
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=64, emulated_speeds=[1.0, 0.5],
                                                         emulated_per_sample_s=2e-4, warmup_steps=1))
    return PDMLTrainer(reporting_loop, scaling_config=ray.train.ScalingConfig(num_workers=2),
                       run_config=ray.train.RunConfig(name="result-metrics", storage_path=str(storage)),
                       pdml_config=config).fit()


def test_result_metrics_carry_the_pdml_figures_next_to_the_users(result):
    m = result.metrics
    assert m["epoch"] == 1 and "loss" in m
    assert m["pdml/global_step"] == -1.0  # the user's key is never overridden
    worker = ["pdml/batch_size_samples", "pdml/grad_weight_ratio", "pdml/node_priority_ratio", "pdml/decision_version",
              "pdml/step_compute_seconds", "pdml/step_wait_seconds", "pdml/step_seconds", "pdml/rate_samples_per_second",
              "pdml/overhead_seconds_total", "pdml/stale_bundles_total", "pdml/nonfinite_excluded_steps_total",
              "pdml/nonfinite_dropped_steps_total"]
    scheduler = ["pdml/reports_received_total", "pdml/reports_rejected_total", "pdml/scheduler_decide_errors_total",
                 "pdml/scheduler_decision_requests_total", "pdml/scheduler_decision_seconds_total",
                 "pdml/decision_version/node"]
    missing = [k for k in worker + scheduler if k not in m]
    assert not missing, (missing, sorted(k for k in m if k.startswith("pdml/")))
    # rank 0 (whose metrics Ray Train keeps) is the fast worker: the larger share, under the decision in force
    assert m["pdml/batch_size_samples"] > 32 and m["pdml/grad_weight_ratio"] == m["pdml/batch_size_samples"] / 64
    # the worker's decision in force, and the scheduler's newest (it may have decided one not adopted yet)
    assert 1 <= m["pdml/decision_version"] <= m["pdml/decision_version/node"]
    assert 0 < m["pdml/step_compute_seconds"] < 5 and m["pdml/step_seconds"] >= m["pdml/step_compute_seconds"] * 0.5
    # the rate is the newest timed step's samples over its compute time: a whole batch of 1..64 samples
    # (that step's batch may predate the decision in force, so it need not be batch_size_samples)
    samples = m["pdml/rate_samples_per_second"] * m["pdml/step_compute_seconds"]
    assert samples == pytest.approx(round(samples), rel=1e-6) and 1 <= round(samples) <= 64, samples
    # each worker has sent the reports of all but its last interval (4 steps) and the untimed newest step;
    # the node relay's round in flight may still hold one worker's newest interval (seen in CI: 36 of 48)
    sent_per_worker = 2 * STEPS - 4 - 1
    assert m["pdml/reports_received_total"] >= 2 * sent_per_worker - 4
    assert m["pdml/scheduler_decision_requests_total"] >= 2 and m["pdml/reports_rejected_total"] == 0
    assert all(isinstance(m[k], float) for k in worker + scheduler)
