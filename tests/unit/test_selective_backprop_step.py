"""Selective-backprop that saves the backward in ctx.step: the whole batch scored without gradients,
``step.backprop_rows`` picks the high-loss share, forward and backward run over those rows only
(``step.loss(losses, rows=rows)``), with the masked form's gradient (no Ray, no process group)."""

import copy

import numpy as np
import pytest
import torch

from pdml_ray import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.errors import UsageError
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.step import StepBatch

B, SHARE = 16, 0.25


def _ctx(mode: str = "selective-backprop") -> PDMLContext:
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B),
                        sample_priority=SamplePriorityConfig(mode=mode, backprop_share=SHARE, percentile_window=B))
    return PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", None)


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 4, generator=g), torch.randn(B, generator=g)


def _net(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _loss(model, x, y):
    return (model(x).squeeze(1) - y) ** 2  # (b,) per-sample squared error


def _batch(weights=None, threshold=None) -> StepBatch:
    return StepBatch(step=0, epoch=0, indices=np.arange(B), grad_weight=1.0, decision_version=0,
                     sample_weights=weights, backprop_threshold=threshold)


@pytest.mark.parametrize("weights", [None, np.linspace(0.5, 2.0, B).astype(np.float32)])
def test_the_chosen_rows_backward_alone_gives_the_masked_forms_gradient_and_reports_the_rest_forward_only(weights):
    x, y = _data()
    net = _net()
    ref_net = copy.deepcopy(net)
    backward_rows: list[int] = []  # rows reaching the last layer's backward, per backward
    net[2].register_full_backward_hook(lambda m, gin, gout: backward_rows.append(gout[0].shape[0]))
    ref_net[2].register_full_backward_hook(lambda m, gin, gout: backward_rows.append(gout[0].shape[0]))

    ctx = _ctx()
    model = ctx.prepare_model(net)
    with ctx.step(_batch(weights)) as step:
        with torch.no_grad():
            scores = _loss(model, x, y)  # (B,) the whole batch, no graph
        rows = step.backprop_rows(scores)
        step.loss(_loss(model, x[rows], y[rows]), rows=rows).backward()

    # the high-loss quarter: the window holds this batch only, so its top 4 losses
    top = np.sort(np.argsort(scores.numpy())[-B // 4:])
    np.testing.assert_array_equal(rows.numpy(), top)
    assert rows.dtype == torch.int64
    assert backward_rows == [4]  # backward ran over the 4 chosen rows, not the 16
    report = ctx._last_report
    assert report.samples == B and report.forward_only == B - 4
    np.testing.assert_allclose(report.sample_losses, scores.numpy(), rtol=1e-6)  # every sample's feedback
    assert ctx.backprop_selector.trained == 4 and ctx.backprop_selector.forward_only == 12

    ref_ctx = _ctx()
    ref_model = ref_ctx.prepare_model(ref_net)
    with ref_ctx.step(_batch(weights)) as step:  # the masked form: backward over the whole batch
        step.loss(_loss(ref_model, x, y)).backward()
    assert ref_ctx._last_report.forward_only == 0 and backward_rows == [4, B]  # its backward: every row
    for p, q in zip(net.parameters(), ref_net.parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6)


def test_the_clusters_threshold_and_per_token_scores_choose_the_rows():
    ctx = _ctx()
    model = ctx.prepare_model(_net())
    losses = torch.tensor([[0.1, 9.0], [0.2, 0.0], [5.0, 5.0], [0.3, 0.3]])  # (4, T=2) per-token
    mask = torch.tensor([[True, False], [True, True], [True, True], [True, True]])  # (4, 2)
    batch = StepBatch(step=0, epoch=0, indices=np.arange(4), grad_weight=1.0, decision_version=0,
                      backprop_threshold=0.25)  # the cluster's percentile, from the plan
    with ctx.step(batch) as step:
        rows = step.backprop_rows(losses, mask)  # per-sequence means 0.1, 0.1, 5.0, 0.3
        assert rows.tolist() == [2, 3] and step.forward_only == 2
        out = model(torch.ones(2, 4)).squeeze(1)
        chosen = torch.stack([out, out], dim=1)  # (k=2, T=2)
        loss = step.loss(chosen, mask[rows], rows=rows)
        torch.testing.assert_close(loss, out.mean())  # the chosen rows' mean
        loss.backward()
    assert ctx._last_report.forward_only == 2


def test_misuse_is_refused_with_the_form_to_use():
    x, y = _data()
    ctx = _ctx()
    model = ctx.prepare_model(_net())
    with pytest.raises(UsageError, match="torch.no_grad"):
        with ctx.step(_batch()) as step:
            step.backprop_rows(_loss(model, x, y))  # scored with a graph: nothing saved
    with pytest.raises(UsageError, match="rows=rows"):
        with ctx.step(_batch()) as step:
            with torch.no_grad():
                step.backprop_rows(_loss(model, x, y))
            step.loss(_loss(model, x, y))  # every row's loss after choosing rows
    with pytest.raises(UsageError, match="call it first"):
        with ctx.step(_batch()) as step:
            step.loss(_loss(model, x[:4], y[:4]), rows=torch.arange(4))
    with pytest.raises(UsageError, match="what step.backprop_rows returned"):
        with ctx.step(_batch()) as step:
            with torch.no_grad():
                rows = step.backprop_rows(_loss(model, x, y))
            step.loss(_loss(model, x[rows], y[rows]), rows=rows + 1)
    with pytest.raises(UsageError, match="once per step"):
        with ctx.step(_batch()) as step:
            with torch.no_grad():
                step.backprop_rows(_loss(model, x, y))
                step.backprop_rows(_loss(model, x, y))
    other = _ctx("importance")
    other_model = other.prepare_model(_net())
    with pytest.raises(UsageError, match="mode='selective-backprop'"):
        with other.step(_batch(np.ones(B, dtype=np.float32))) as step:
            with torch.no_grad():
                step.backprop_rows(_loss(other_model, x, y))


def test_the_bench_arm_backpropagates_the_chosen_rows_alone_with_the_masked_forms_gradient():
    import argparse

    import torch.nn.functional as F

    from pdml_ray.bench import sampling, sampling_arm
    from pdml_ray.bench.common import add_common_arguments
    from pdml_ray.priority.sample import SamplePrioritizer

    parser = argparse.ArgumentParser()
    sampling.add_arguments(parser)
    add_common_arguments(parser)
    args = parser.parse_args(["--dataset-size", "200", "--hidden", "8", "--batch-size", "32"])
    (x, y), _ = sampling_arm.make_task(3, 200, 0)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    sp = SamplePrioritizer(200, sampling.priority_config(args, "selective_backprop"), seed=1)
    arm = sampling_arm.Arm("selective_backprop", x, y, args, 0, 1e-2, sp)
    ref = copy.deepcopy(arm.model)
    rows_seen: list[int] = []
    arm.model[4].register_full_backward_hook(lambda m, gin, gout: rows_seen.append(gout[0].shape[0]))
    ti = torch.arange(32)
    w = torch.linspace(0.5, 2.0, 32) / torch.linspace(0.5, 2.0, 32).sum()  # normalised weights, as a plan's
    per_sample, loss = arm._selective_backprop_loss(arm.selector, ti, w)
    loss.backward()
    k = arm.selector.trained
    assert 0 < k < 32 and rows_seen == [k]  # backward over the chosen rows only
    full = F.binary_cross_entropy_with_logits(ref(x[ti]).squeeze(1), y[ti], reduction="none")
    torch.testing.assert_close(per_sample, full.detach(), rtol=0, atol=1e-6)  # every sample's feedback
    chosen = per_sample >= torch.sort(per_sample).values[32 - k]  # the masked form over the same rows
    ((torch.where(chosen, full * (32 / k), torch.zeros_like(full))) @ w).backward()
    for p, q in zip(arm.model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6)
    arm.train_s = 1.0  # result() divides by the arm's wall time: no step() ran here
    assert arm.result(1)["backprop_fraction"] == pytest.approx(k / 32)


def test_tied_losses_at_the_percentile_are_chosen_by_their_rank_not_all():
    from pdml_ray.priority.sample import SamplePrioritizer
    from pdml_ray.priority.selective_backprop import BackpropSelector

    # 70% of the losses exactly 0 (float32 losses of confident predictions), 30% positive and distinct
    losses = np.concatenate([np.zeros(700), np.linspace(0.1, 3.0, 300)])
    sel = BackpropSelector(1 / 3, 1000)
    assert sel.select(losses).sum() == 300  # the positive ones; ">= the quantile 0" chose all 1,000
    continuous = np.linspace(0.0, 1.0, 12)  # no ties: the quantile itself is chosen, as before
    assert BackpropSelector(0.25, 12).select(continuous).sum() == 3
    table = SamplePrioritizer(1000, SamplePriorityConfig(mode="selective-backprop", backprop_share=1 / 3,
                                                         percentile_window=1000), seed=0)
    table.update(np.arange(1000), losses, step=0)
    threshold = table.plan(1, [64]).backprop_threshold  # the cluster's, by the same rule
    assert threshold is not None and 0.0 < threshold < 0.1
    assert BackpropSelector(1 / 3, 1000).select(losses, threshold).sum() == 300
