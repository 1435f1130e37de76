"""Gradient weights through DDP's hook and FSDP2's loss scale, and the guard rails, on a real one-rank
gloo group (no Ray). The two-rank exactness tests are in tests/ray/test_wrappers_ray.py."""

import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import NonFiniteError, UsageError
from pdml_ray.train.context import PDMLContext, StepBatch
from pdml_ray.train.wrappers import DDPHook, LossScale, unwrap


@pytest.fixture(scope="module")
def gloo():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _ctx(**node):
    return PDMLContext(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=12, **node)), 0, 1,
                       torch.device("cpu"), "CPU", None)


def _batch(n=12, weight=1.0, step=0):
    return StepBatch(step=step, epoch=0, indices=np.arange(n), grad_weight=weight, decision_version=0)


def _reference_grads(x, y):
    ref = _model()
    F.cross_entropy(ref(x), y).backward()
    return [p.grad for p in ref.parameters()]


def test_a_ddp_model_is_detected_and_its_buckets_carry_the_weight(gloo):
    x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
    ctx = _ctx()
    model = ctx.prepare_model(torch.nn.parallel.DistributedDataParallel(_model()))
    assert isinstance(ctx._combiner, DDPHook) and hasattr(model, "module")  # no second wrapper, .module kept
    batch = _batch(weight=0.25)  # one rank holding a quarter of a (hypothetical) global batch
    with ctx.step(batch) as step:
        step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
    for p, g in zip(model.parameters(), _reference_grads(x, y)):
        torch.testing.assert_close(p.grad, 0.25 * g)  # the SUM over ranks of w_i g_i: here w_0 g_0
    assert ctx._reports[-1].compute_s > 0


def test_a_plain_module_is_wrapped_in_ddp_with_the_hook(gloo):
    assert isinstance(_ctx()._combiner, type(None))
    ctx = _ctx()
    plain = _model()
    wrapped = ctx.prepare_model(plain)
    assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and isinstance(ctx._combiner, DDPHook)
    assert unwrap(wrapped) is plain
    with pytest.raises(UsageError, match="already called"):
        ctx.prepare_model(_model())


def test_fsdp2_gets_the_loss_scale_and_fsdp1_is_refused(gloo):
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    ctx = _ctx()
    ctx.prepare_model(fully_shard(_model()))
    assert isinstance(ctx._combiner, LossScale)
    loss = ctx.step(_batch(weight=0.25)).loss(torch.ones(12))
    assert loss.item() == pytest.approx(0.25 * 1)  # mean 1 x w_i x world_size (1)
    fsdp1 = FullyShardedDataParallel.__new__(FullyShardedDataParallel)  # FSDP1 cannot be built on a CPU
    torch.nn.Module.__init__(fsdp1)
    with pytest.raises(UsageError, match="FSDP1"):
        _ctx().prepare_model(fsdp1)


def test_a_plain_model_is_prepared_without_importing_fsdp():
    """Importing torch.distributed.fsdp costs ~2 s of CPU per worker: only a model built with it pays."""
    import subprocess
    import sys

    code = ("import sys, torch; from pdml_ray.train.wrappers import check_supported, combiner_for, is_fsdp2; "
            "m = torch.nn.Linear(2, 2); check_supported(m, 'auto'); combiner_for(m, 'auto', 1, torch.device('cpu')); "
            "print(is_fsdp2(m), 'torch.distributed.fsdp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["False", "False"], out.stderr[-2000:]


def test_a_loss_that_is_not_one_per_sample_is_refused(gloo):
    ctx = _ctx()
    ctx.prepare_model(_model())
    step = ctx.step(_batch(n=12))
    with pytest.raises(UsageError, match="one loss per sample"):
        step.loss(torch.ones(12, 4, 2))  # neither per sample, per token nor a mean (step.loss takes a 0-d mean)
    with pytest.raises(UsageError, match="one loss per sample"):
        step.loss(torch.ones(8))  # a DataLoader batch that is not this step's indices


def test_optimizer_step_inside_the_step_block_applies_the_combined_gradient_under_ddp(gloo):
    """DDP combines the gradients inside backward: an optimizer step in the block applies combined ones."""
    ctx = _ctx()
    model = ctx.prepare_model(_model())
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
    with ctx.step(_batch(weight=0.5)) as step:
        step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
        opt.step()
    assert not step.dropped
    for p, b, ref in zip(model.parameters(), before, _reference_grads(x, y)):
        torch.testing.assert_close(p.detach(), b - 0.1 * 0.5 * ref)  # SGD with lr 0.1 on w_0 g_0


# -- non-finite losses and gradients (one rank: excluding it leaves nothing, so the step is dropped; the
# -- renormalisation over the good ranks is checked on two and four Ray Train workers in
# -- tests/ray/test_nonfinite_ray.py)

def _nan_step(ctx, model, step, poison="loss", opt=None, step_inside=False):
    """One step; ``poison``: a NaN loss ("loss"), a NaN gradient of a finite loss ("grad"), or None.
    ``step_inside``: ``opt.step()`` inside the step block (after backward) instead of after it."""
    x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
    with ctx.step(_batch(step=step)) as scope:
        per_sample = F.cross_entropy(model(x), y, reduction="none")
        if poison == "loss":
            per_sample = per_sample * float("nan")
        out = scope.loss(per_sample)
        if poison == "grad":
            out = out + 0.0 * sum(p.sum() for p in model.parameters()) * float("inf")  # inf * 0: NaN gradients
        out.backward()
        if opt is not None and step_inside:
            opt.step()
            opt.zero_grad()
    if opt is not None and not step_inside:
        opt.step()
        opt.zero_grad()
    return scope


@pytest.mark.parametrize("wrap,poison", [("ddp", "loss"), ("ddp", "grad"), ("fsdp", "loss"), ("fsdp", "grad")])
def test_a_nan_step_with_optimizer_step_inside_the_block_changes_nothing(gloo, wrap, poison):
    """The guard runs before the optimizer (its step pre-hook), not at the end of the block after it."""
    from torch.distributed.fsdp import fully_shard

    ctx = _ctx()
    model = ctx.prepare_model(torch.nn.parallel.DistributedDataParallel(_model()) if wrap == "ddp"
                              else fully_shard(_model()))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _nan_step(ctx, model, 0, poison=None, opt=opt, step_inside=True)  # one good step: Adam's state exists
    full = (lambda p: p.full_tensor()) if wrap == "fsdp" else (lambda p: p)
    before = [full(p.detach()).clone() for p in model.parameters()]
    moments = [full(opt.state[p]["exp_avg"]).clone() for p in model.parameters()]
    steps = [float(opt.state[p]["step"]) for p in model.parameters()]
    scope = _nan_step(ctx, model, 1, poison=poison, opt=opt, step_inside=True)
    assert scope.dropped and ctx.nonfinite.dropped_steps == 1
    for p, b, m, k in zip(model.parameters(), before, moments, steps):
        assert torch.equal(full(p.detach()), b) and bool(torch.isfinite(full(p.detach())).all())
        assert torch.equal(full(opt.state[p]["exp_avg"]), m) and float(opt.state[p]["step"]) == k
    scope = _nan_step(ctx, model, 2, poison=None, opt=opt, step_inside=True)  # and the next good step moves
    assert not scope.dropped and not torch.equal(full(next(model.parameters()).detach()), before[0])


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_a_nan_loss_excludes_the_rank_and_a_step_with_nothing_left_is_dropped(gloo, wrap):
    from torch.distributed.fsdp import fully_shard

    ctx = _ctx()
    model = ctx.prepare_model(torch.nn.parallel.DistributedDataParallel(_model()) if wrap == "ddp"
                              else fully_shard(_model()))
    if wrap == "fsdp":
        assert ctx._combiner.can_exclude  # the excluding reduce-scatter is installed
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _nan_step(ctx, model, 0, poison=None, opt=opt)  # one good step: momentum buffers exist
    before = [p.detach().clone() for p in model.parameters()]
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    scope = _nan_step(ctx, model, 1, opt=opt)
    assert scope.excluded == (0,) and scope.dropped
    for p, b, m in zip(model.parameters(), before, momentum):  # SGD saw no gradient: nothing moved
        assert torch.equal(p.detach(), b) and torch.equal(opt.state[p]["momentum_buffer"], m)
    assert ctx.nonfinite.excluded == [1] and ctx.nonfinite.dropped_steps == 1 and ctx.nonfinite.consecutive == [1]
    assert ctx._reports[-1].sample_losses is None and np.isnan(ctx._reports[-1].loss)  # no NaN sample losses
    scope = _nan_step(ctx, model, 2, poison=None, opt=opt)  # a good step resets the run of failures
    assert scope.excluded == () and not scope.dropped and ctx.nonfinite.consecutive == [0]
    assert all(bool(torch.isfinite(p.detach() if not hasattr(p, "full_tensor") else p.full_tensor()).all())
               for p in model.parameters())


def test_repeated_nan_losses_end_the_run_naming_the_worker_and_the_step(gloo):
    ctx = _ctx(max_consecutive_nonfinite=3)
    model = ctx.prepare_model(_model())
    _nan_step(ctx, model, 0)
    _nan_step(ctx, model, 1)
    _nan_step(ctx, model, 2, poison=None)  # recovered: the count starts again
    _nan_step(ctx, model, 3)
    _nan_step(ctx, model, 4)
    with pytest.raises(NonFiniteError, match=r"worker rank 0 \(CPU\) had a NaN or infinite loss in 3 consecutive "
                                             r"steps, the last at step 5"):
        _nan_step(ctx, model, 5)
    assert ctx.nonfinite.excluded == [5]


def test_a_gradient_that_overflows_in_backward_drops_the_step_and_repeats_end_the_run(gloo):
    ctx = _ctx(max_consecutive_nonfinite=2)
    model = ctx.prepare_model(_model())
    handle = model.module[0].weight.register_hook(lambda g: g * float("inf"))  # finite loss, inf gradient
    scope = _nan_step(ctx, model, 0, poison=None)
    assert scope.excluded == () and scope.dropped and all(p.grad is None for p in model.parameters())
    with pytest.raises(NonFiniteError, match="combined gradient was NaN or infinite in 2 consecutive steps"):
        _nan_step(ctx, model, 1, poison=None)
    handle.remove()


@pytest.mark.parametrize("layer", [0, 2])  # DDP buckets in reverse order: the last bucket, and the first
def test_ddp_checks_the_combined_gradient_bucket_by_bucket_as_it_is_reduced(gloo, layer):
    """Under DDP the combined gradient's check runs in the hook on each reduced bucket (no pass over the
    parameters after backward): an inf in any bucket drops the step, and a clean step stays clear."""
    ctx = _ctx()
    model = ctx.prepare_model(torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0001))
    assert not bool(_nan_step(ctx, model, 0, poison=None).dropped)
    assert ctx._combiner.combined_nonfinite() is False
    handle = model.module[layer].bias.register_hook(lambda g: g * float("inf"))
    scope = _nan_step(ctx, model, 1, poison=None)
    assert ctx._combiner.combined_nonfinite() is True and scope.dropped and scope.excluded == ()
    handle.remove()
    assert not _nan_step(ctx, model, 2, poison=None).dropped  # each step's check starts clear


def test_the_guard_can_be_turned_off(gloo):
    ctx = _ctx(check_nonfinite=False)
    model = ctx.prepare_model(_model())
    scope = _nan_step(ctx, model, 0)
    assert scope.excluded == () and not scope.dropped and ctx.nonfinite.total_excluded == 0
    assert not bool(torch.isfinite(model.module[0].weight.grad).all())  # the NaN went through, as before


def test_each_step_reports_the_local_gradient_norm_taken_before_the_weighted_all_reduce(gloo):
    """The DDP hook measures this rank's own gradient (one norm per bucket, on the device, before the
    bucket is weighted), and the step's report carries it as ``grad_norm``."""
    model = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0001)  # several buckets
    ctx = _ctx()
    model = ctx.prepare_model(model)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(12, 8, generator=g), torch.randint(0, 3, (12,), generator=g)
    with ctx.step(_batch(weight=0.25)) as step:  # weighted: the all-reduced gradient is a quarter of the local one
        step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
    reduced = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    ctx.flush()
    assert ctx._last_report is not None
    assert ctx._last_report.grad_norm == pytest.approx(4 * float(reduced), rel=1e-5)


def _slow(seconds):
    import time

    def hook(*args, **kwargs):
        time.sleep(seconds)
    return hook


def test_a_wait_inside_ddps_forward_before_the_module_runs_is_not_compute(gloo):
    """DDP broadcasts rank 0's buffers (BatchNorm's running statistics) before the module's forward, a
    collective that waits for rank 0: a 0.3 s wait there (a hook after DDP's own, standing in for a late
    rank 0) stays out of the step's compute time; the same wait in the module's own forward counts."""
    x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
    ctx = _ctx()
    model = ctx.prepare_model(_model())
    model.register_forward_pre_hook(_slow(0.3))  # runs after prepare_model's pause, before the module
    with ctx.step(_batch()) as step:
        step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
    assert ctx._reports[-1].compute_s < 0.15
    model.module[0].register_forward_pre_hook(_slow(0.3))  # inside the module: compute
    with ctx.step(_batch(step=1)) as step:
        step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
    assert ctx._reports[-1].compute_s >= 0.3


def test_fsdp2_collectives_are_bracketed_out_of_the_compute_time(gloo):
    """Every FSDP2 parameter group's unshard / wait_for_unshard / post_backward / finalize_backward is
    bracketed: a 0.2 s wait inside the first all-gather (standing in for a slow rank) is not compute."""
    from torch.distributed.fsdp import fully_shard

    from pdml_ray.train.wrappers import FSDP_COMM_METHODS

    model = _model()
    fully_shard(model[0])
    fully_shard(model)
    group = model[0]._get_fsdp_state()._fsdp_param_groups[0]
    unshard = group.unshard

    def late_unshard(*args, **kwargs):
        _slow(0.2)()
        return unshard(*args, **kwargs)
    group.unshard = late_unshard
    ctx = _ctx()
    model = ctx.prepare_model(model)
    assert ctx._combiner.timed_comm and all(getattr(group, m).__name__ == "call" for m in FSDP_COMM_METHODS)
    x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
    calls = []
    pause, resume = ctx._timer.pause, ctx._timer.resume
    ctx._timer.pause = lambda: (calls.append("pause"), pause())[1]
    ctx._timer.resume = lambda: (calls.append("resume"), resume())[1]
    with ctx.step(_batch()) as step:
        step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
    assert ctx._reports[-1].compute_s < 0.1
    assert calls.count("pause") == calls.count("resume") >= 2 * 4  # two groups, four methods each


def test_batchnorm_layers_get_a_floor_sync_or_nothing():
    from pdml_ray.errors import ConfigError
    from pdml_ray.train.wrappers import batchnorm_layers, prepare_batchnorm

    def net():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.LazyBatchNorm1d())
    cpu = torch.device("cpu")
    model = net()
    assert len(batchnorm_layers(model)) == 2
    assert prepare_batchnorm(model, NodePriorityConfig(global_batch_size=64), cpu) == (model, 16)
    assert prepare_batchnorm(model, NodePriorityConfig(global_batch_size=64, batchnorm_min_batch=8), cpu)[1] == 8
    assert prepare_batchnorm(model, NodePriorityConfig(global_batch_size=64, batchnorm="local"), cpu)[1] == 0
    assert prepare_batchnorm(_model(), NodePriorityConfig(global_batch_size=64), cpu)[1] == 0  # no BatchNorm
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(4)))
    assert batchnorm_layers(synced) == []  # global statistics: no floor needed
    with pytest.raises(ConfigError, match="SyncBatchNorm has no CPU kernels"):
        prepare_batchnorm(model, NodePriorityConfig(global_batch_size=64, batchnorm="sync"), cpu)
    with pytest.raises(ValueError, match="batchnorm must be"):
        NodePriorityConfig(global_batch_size=64, batchnorm="off")



def test_with_syncbatchnorm_the_weight_goes_on_the_loss_not_on_the_buckets(gloo):
    """SyncBatchNorm's backward sums every rank's output gradients, so they must carry 1 / B already:
    the hook then sums the buckets as they are and ``step.loss`` scales by w_i. The rank's gradient is
    still w_i times its own mean gradient, and the local gradient norm is that of its own gradient. (DDP
    refuses SyncBatchNorm on a CPU: the mode is switched on by hand here; the GPU check converts a model.)"""
    x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
    ctx = _ctx()
    model = ctx.prepare_model(_model())
    assert not ctx._combiner.scale_loss and ctx._combiner.loss_scale(0.25) == 1.0  # no SyncBatchNorm: buckets
    ctx._combiner.scale_loss = True
    assert ctx._combiner.loss_scale(0.25) == 0.25
    with ctx.step(_batch(weight=0.25)) as step:
        step.loss(F.cross_entropy(model(x), y, reduction="none")).backward()
    reference = _reference_grads(x, y)
    for p, g in zip(model.parameters(), reference):
        torch.testing.assert_close(p.grad, 0.25 * g)
    norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in reference]))
    assert ctx._combiner.local_grad_norm().item() == pytest.approx(norm.item(), rel=1e-5)
