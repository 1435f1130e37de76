"""Pipeline partitioning and the plain StageWorker, without Ray."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.partition import balanced_cuts, layer_param_counts, split_sequential, stage_bounds
from pdml_ray.pipeline.stage import StageWorker


def _mlp(widths: list[int], seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(dtype)


# -- partition ------------------------------------------------------------------------------------

def test_balanced_cuts_minimise_the_largest_stage():
    assert balanced_cuts([1, 1, 1, 1, 1, 1], 3) == (2, 4)
    assert balanced_cuts([100, 1, 1, 1], 2) == (1,)  # the big layer alone; the rest together
    assert balanced_cuts([5, 5, 10], 2) == (2,)
    assert balanced_cuts([7], 1) == ()


def test_balanced_cuts_match_brute_force_on_small_cases():
    import itertools
    import random

    rng = random.Random(0)
    for _ in range(50):
        n, s = rng.randint(1, 7), rng.randint(1, 4)
        if s > n:
            continue
        weights = [rng.randint(0, 20) for _ in range(n)]
        got = balanced_cuts(weights, s)
        best = min(max(sum(weights[a:b]) for a, b in stage_bounds(n, list(c)))
                   for c in itertools.combinations(range(1, n), s - 1))
        assert max(sum(weights[a:b]) for a, b in stage_bounds(n, got)) == best


def test_parameter_free_layers_stay_with_the_layer_before_them():
    model = _mlp([8, 8, 8, 8, 8])  # Linear Tanh Linear Tanh Linear Tanh Linear
    stages = split_sequential(model, 2)
    assert [len(s) for s in stages] == [4, 3]
    assert isinstance(stages[0][-1], nn.Tanh)


def test_split_balances_parameters_and_keeps_layer_order():
    model = _mlp([16, 64, 64, 64, 4])
    stages = split_sequential(model, 3)
    counts = [sum(layer_param_counts(list(s))) for s in stages]
    assert sum(counts) == sum(p.numel() for p in model.parameters())
    # A perfect 3-way split is impossible; check the bottleneck is no worse than the best cut list.
    assert max(counts) == min(max(sum(layer_param_counts(list(s))) for s in split_sequential(model, 3, c))
                              for c in [(2, 4), (2, 6), (4, 6), (1, 4), (3, 5)])
    assert [m for s in stages for m in s] == list(model)  # same layer objects, same order


def test_split_with_explicit_cuts_and_bad_cuts():
    model = _mlp([4, 4, 4, 4])  # 5 layers
    assert [len(s) for s in split_sequential(model, 3, cuts=[1, 3])] == [1, 2, 2]
    with pytest.raises(PlanError, match="strictly increasing"):
        split_sequential(model, 3, cuts=[3, 3])
    with pytest.raises(PlanError, match="need 2 cuts"):
        split_sequential(model, 3, cuts=[2])
    with pytest.raises(PlanError, match="non-empty stages"):
        split_sequential(model, 6)


# -- StageWorker ----------------------------------------------------------------------------------

def _two_stage_workers(model: nn.Sequential, **kwargs) -> list[StageWorker]:
    stages = split_sequential(copy.deepcopy(model), 2)
    return [StageWorker(k, 0, 2, stages[k], loss_fn=nn.MSELoss(), **kwargs) for k in range(2)]


def test_stage_workers_match_the_unsplit_model_over_microbatches():
    model = _mlp([6, 16, 16, 3])
    workers = _two_stage_workers(model, lr=0.05)
    x, y = torch.randn(12, 6, dtype=torch.float64), torch.randn(12, 3, dtype=torch.float64)

    # Unsplit reference: mean loss over the batch, one SGD step.
    ref = copy.deepcopy(model)
    ref_loss = nn.MSELoss()(ref(x), y)
    ref_loss.backward()
    ref_grads = [p.grad.clone() for p in ref.parameters()]
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.05 * p.grad

    # Split: 3 micro-batches of 4, loss scaled by 4/12, activations and gradients passed by hand.
    total_loss = 0.0
    for mb, (xm, ym) in enumerate(zip(x.split(4), y.split(4))):
        act, t0 = workers[0].forward(mb, xm)
        assert act is not None and not act.requires_grad and t0.emulated_s == 0.0
        none, t1 = workers[1].forward(mb, act, target=ym, loss_scale=4 / 12)
        assert none is None and t1.loss is not None
        total_loss += t1.loss
    for mb in reversed(range(3)):  # any order: backward per micro-batch is independent
        grad_act, _ = workers[1].backward(mb)
        assert grad_act is not None and grad_act.shape == (4, 16)
        grad_in, _ = workers[0].backward(mb, grad_act)
        assert grad_in is None  # stage 0 sends nothing upstream

    assert total_loss == pytest.approx(float(ref_loss.detach()), abs=1e-10)
    split_grads = workers[0].grads() + workers[1].grads()
    for g, r in zip(split_grads, ref_grads, strict=True):
        assert torch.allclose(g, r, atol=1e-6, rtol=0)
    for w in workers:
        w.step()
    split_params = workers[0].get_parameters() + workers[1].get_parameters()
    for p, r in zip(split_params, ref.parameters(), strict=True):
        assert torch.allclose(p, r, atol=1e-6, rtol=0)


def test_replica_gradient_sum_keeps_replicas_identical_and_equals_the_whole_batch():
    model = _mlp([5, 8, 2])  # Linear Tanh Linear: one stage, two replicas, batch split between them
    ref = copy.deepcopy(model)
    replicas = [StageWorker(0, r, 1, copy.deepcopy(model), loss_fn=nn.MSELoss(), lr=0.1) for r in range(2)]
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    for mb, (xm, ym) in enumerate(zip(x.split(3), y.split(3))):
        w = replicas[mb % 2]
        w.forward(mb, xm, target=ym, loss_scale=0.5)
        w.backward(mb)
    grads = [w.grads() for w in replicas]
    for w in replicas:
        w.sum_grads_and_step(*grads)
    nn.MSELoss()(ref(x), y).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    a, b = replicas[0].get_parameters(), replicas[1].get_parameters()
    for pa, pb, r in zip(a, b, ref.parameters(), strict=True):
        assert torch.equal(pa, pb)
        assert torch.allclose(pa, r, atol=1e-6, rtol=0)


def test_idle_replica_contributes_zero_gradients():
    w = StageWorker(0, 1, 2, nn.Linear(3, 3))
    assert all(torch.count_nonzero(g) == 0 for g in w.grads())


def test_misuse_is_reported():
    worker = StageWorker(0, 0, 2, nn.Linear(3, 3))
    with pytest.raises(PlanError, match="without its forward"):
        worker.backward(0, torch.zeros(1, 3))
    worker.forward(0, torch.zeros(1, 3))
    with pytest.raises(PlanError, match="ran twice"):
        worker.forward(0, torch.zeros(1, 3))
    with pytest.raises(PlanError, match="still waiting"):
        worker.step()
    with pytest.raises(PlanError, match="loss_fn"):
        StageWorker(1, 0, 2, nn.Linear(3, 3))
    with pytest.raises(ValueError, match="speed"):
        StageWorker(0, 0, 1, nn.Linear(3, 3), loss_fn=nn.MSELoss(), speed=0.0)


def test_emulated_speed_sleeps_and_says_so():
    # A slow replica's latency includes the emulated sleep, reported separately from real compute.
    worker = StageWorker(0, 0, 2, nn.Linear(64, 64), speed=0.25)
    _, timing = worker.forward(0, torch.randn(32, 64))
    assert timing.emulated_s == pytest.approx(3.0 * timing.compute_s)
    assert timing.latency_s == pytest.approx(timing.compute_s + timing.emulated_s)


def test_sleep_compute_mode_sleeps_per_sample_over_speed(monkeypatch):
    # --compute sleep: the real (small) forward/backward runs, then samples x per-sample time / speed is
    # slept (twice that for a backward), whatever the real compute took.
    from pdml_ray.pipeline import stage as stage_module

    slept: list[float] = []
    monkeypatch.setattr(stage_module, "sleep_compute", lambda n, per_s, speed: slept.append(n * per_s / speed) or slept[-1])
    worker = StageWorker(0, 0, 1, nn.Linear(4, 1), loss_fn=nn.MSELoss(), speed=0.5, compute="sleep", per_sample_s=0.001)
    _, fwd = worker.forward(0, torch.randn(10, 4), target=torch.zeros(10, 1))
    _, bwd = worker.backward(0)
    assert slept == [pytest.approx(0.02), pytest.approx(0.04)]  # 10 x 1 ms / 0.5; backward 2x
    assert fwd.emulated_s == pytest.approx(0.02) and bwd.emulated_s == pytest.approx(0.04)
    assert fwd.latency_s == pytest.approx(fwd.compute_s + 0.02)
    assert all(p.grad is not None for p in worker.module.parameters())  # real gradients all the same
    # Really sleeping: a 5-sample forward at 2 ms per sample and speed 1 takes at least 10 ms.
    monkeypatch.undo()
    real = StageWorker(0, 0, 2, nn.Linear(4, 4), compute="sleep", per_sample_s=0.002)
    _, timing = real.forward(0, torch.randn(5, 4))
    assert timing.emulated_s >= 0.01 and timing.latency_s >= 0.01


def test_compute_mode_is_checked():
    with pytest.raises(ValueError, match="compute must be one of"):
        StageWorker(0, 0, 2, nn.Linear(3, 3), compute="fast")
    with pytest.raises(ValueError, match="per_sample_s > 0"):
        StageWorker(0, 0, 2, nn.Linear(3, 3), compute="sleep")


def test_discard_step_forgets_a_failed_step():
    worker = StageWorker(0, 0, 1, nn.Linear(3, 1), loss_fn=nn.MSELoss())
    before = worker.get_parameters()
    worker.forward(0, torch.randn(2, 3), target=torch.zeros(2, 1))
    worker.forward(1, torch.randn(2, 3), target=torch.zeros(2, 1))
    worker.backward(0)
    worker.discard_step()
    assert all(torch.count_nonzero(g) == 0 for g in worker.grads())
    worker.step()  # no longer refused: nothing waits for a backward
    assert all(torch.equal(a, b) for a, b in zip(before, worker.get_parameters()))
