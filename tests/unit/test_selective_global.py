"""Selective-Backprop by the cluster's loss percentile: the scheduler's table hands it out with the
plans and each worker selects by it (pure numpy and torch, no Ray)."""

import numpy as np
import pytest
import torch

from pdml_ray import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.decisions import SamplePlan
from pdml_ray.errors import PlanError
from pdml_ray.priority.sample import SamplePrioritizer
from pdml_ray.priority.selective_backprop import BackpropSelector
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.step import StepBatch, StepScope


def test_two_workers_with_different_loss_scales_select_by_the_global_threshold():
    rng = np.random.default_rng(0)
    n, share = 4000, 0.25
    table = SamplePrioritizer(n, SamplePriorityConfig(mode="selective-backprop", backprop_share=share,
                                                      percentile_window=4096), seed=0)
    assert table.plan(0, [64, 64]).backprop_threshold is None  # no losses yet: each worker's own
    # worker 0's losses ~ U(0, 1), worker 1's ~ U(0, 10), as the scheduler takes them from their reports
    low, high = rng.uniform(0, 1, 2000), rng.uniform(0, 10, 2000)
    table.update(np.arange(n), np.concatenate([low, high]), step=0)
    threshold = table.plan(1, [64, 64]).backprop_threshold
    # the 0.75 quantile of the mixture: 0.5 * min(t, 1) + 0.5 * t / 10 = 0.75 at t = 5
    assert threshold == pytest.approx(5.0, abs=0.25)
    workers = [BackpropSelector(share, 4096), BackpropSelector(share, 4096)]
    for sel, scale in zip(workers, (1.0, 10.0)):
        sel.select(rng.uniform(0, scale, 2000))  # each worker's own history, at its own scale
    batch_low, batch_high = rng.uniform(0, 1, 1000), rng.uniform(0, 10, 1000)
    # by the global threshold: the low-loss worker trains only its highest sample, the other half its batch
    assert workers[0].select(batch_low, threshold).sum() == 1
    assert workers[1].select(batch_high, threshold).mean() == pytest.approx(0.5, abs=0.05)
    # by their own percentiles each would have trained a quarter of its batch
    assert BackpropSelector(share, 4096).select(batch_low).mean() == pytest.approx(share, abs=0.01)
    with pytest.raises(PlanError, match="backprop_threshold"):
        SamplePlan(1, (np.arange(2),), (np.ones(2, dtype=np.float32),), backprop_threshold=float("nan")).validate()
    restored = SamplePlan.from_dict(SamplePlan(1, (np.arange(2),), (np.ones(2, dtype=np.float32),), 2.5).to_dict())
    assert restored.backprop_threshold == 2.5


def test_the_worker_step_selects_by_the_plans_threshold():
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8),
                        sample_priority=SamplePriorityConfig(mode="selective-backprop", backprop_share=0.25,
                                                             percentile_window=8))
    ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", None)
    losses = torch.tensor([0.1, 0.2, 5.0, 0.3, 0.4, 4.0, 0.5, 0.6], requires_grad=True)
    batch = StepBatch(step=0, epoch=0, indices=np.arange(8), grad_weight=1.0, decision_version=0,
                      backprop_threshold=0.35)  # the cluster's: lower than this worker's own quarter
    loss = StepScope(ctx, batch).loss(losses)
    assert ctx.backprop_selector.trained == 5  # 5.0, 4.0, 0.4, 0.5, 0.6 at or above 0.35
    assert loss.item() == pytest.approx((5.0 + 4.0 + 0.4 + 0.5 + 0.6) / 5)
