"""StepScope.loss: the importance-weighted mean the worker's gradient comes from (no Ray, no process group)."""

import numpy as np
import pytest
import torch

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import UsageError
from pdml_ray.train.context import PDMLContext, StepBatch, StepScope

CTX = PDMLContext(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=3)), 0, 1, torch.device("cpu"), "CPU", None)


def test_step_loss_is_the_importance_weighted_mean_in_float32():
    losses = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16, requires_grad=True)
    weights = np.array([1.0, 0.5, 0.25], dtype=np.float32)
    batch = StepBatch(step=0, epoch=0, indices=np.arange(3), grad_weight=1.0, decision_version=0,
                      sample_weights=weights)
    loss = StepScope(CTX, batch).loss(losses)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx((1.0 + 1.0 + 1.0) / 3)
    loss.backward()
    np.testing.assert_allclose(losses.grad.float().numpy(), weights / 3, rtol=1e-2)
    uniform = StepScope(CTX, StepBatch(step=0, epoch=0, indices=np.arange(3), grad_weight=1.0, decision_version=0))
    assert uniform.loss(torch.tensor([1.0, 2.0, 4.0])).item() == pytest.approx(7.0 / 3)
    empty = StepScope(CTX, StepBatch(step=0, epoch=0, indices=np.arange(0), grad_weight=0.0, decision_version=0,
                                      sample_weights=np.zeros(0, dtype=np.float32)))
    assert empty.loss(torch.zeros(0)).item() == 0.0


class _Rank:
    """What StepScope.loss reads of its context, for one rank of a world of ``world_size`` (no process group)."""

    def __init__(self, world_size: int, sample_priority: bool = False):
        from pdml_ray.config import SamplePriorityConfig

        self.config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=4),
                                 sample_priority=SamplePriorityConfig() if sample_priority else None)
        self.rank, self.world_size, self.device, self._combiner, self._params = 0, world_size, torch.device("cpu"), None, []
        self.backprop_selector = None


def _token_losses(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    losses = torch.rand(6, 5, generator=g) * 3  # (B, T) per-token losses of one global batch
    mask = torch.rand(6, 5, generator=g) > 0.4  # (B, T) the tokens that count (padding False)
    mask[:, 0] = True
    mask[4] = False  # a sequence with no counted token
    return losses, mask


def _ranks_loss(losses, mask, sizes, reduction, monkeypatch):
    """The ranks' losses combined as the b_i/B weighted all-reduce combines their gradients: sum_i w_i L_i.
    The token count's all-reduce is scripted: each rank receives the global count."""
    import pdml_ray.train.step as step_module

    total_tokens = float(mask.sum())
    monkeypatch.setattr(step_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(step_module.dist, "all_reduce", lambda t: t.fill_(total_tokens))
    combined, start, B = 0.0, 0, sum(sizes)
    for b in sizes:
        rows = slice(start, start + b)
        batch = StepBatch(step=0, epoch=0, indices=np.arange(start, start + b), grad_weight=b / B, decision_version=0)
        scope = StepScope(_Rank(len(sizes)), batch)
        combined += b / B * scope.loss(losses[rows], mask[rows], reduction=reduction).item()
        start += b
    return combined


def test_per_token_losses_reduce_to_what_one_process_computes_on_the_global_batch(monkeypatch):
    losses, mask = _token_losses()
    token_mean = float((losses * mask).sum() / mask.sum())  # one process: F.cross_entropy's mean over counted tokens
    per_sequence = (losses * mask).sum(1) / mask.sum(1).clamp(min=1)
    for sizes in ([6], [4, 2], [1, 2, 3]):
        assert _ranks_loss(losses, mask, sizes, "token", monkeypatch) == pytest.approx(token_mean, rel=1e-6), sizes
        assert _ranks_loss(losses, mask, sizes, "sequence", monkeypatch) == pytest.approx(
            float(per_sequence.mean()), rel=1e-6), sizes
    # no mask: every token counts
    assert _ranks_loss(losses, torch.ones_like(mask), [4, 2], "token", monkeypatch) == pytest.approx(
        float(losses.mean()), rel=1e-6)


def test_the_per_token_gradient_is_the_one_process_gradient(monkeypatch):
    import pdml_ray.train.step as step_module

    losses, mask = _token_losses(1)
    monkeypatch.setattr(step_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(step_module.dist, "all_reduce", lambda t: t.fill_(float(mask.sum())))
    x = losses.clone().requires_grad_(True)
    ((x * mask).sum() / mask.sum()).backward()
    y = losses.clone().requires_grad_(True)
    for rows, b in ((slice(0, 4), 4), (slice(4, 6), 2)):
        batch = StepBatch(step=0, epoch=0, indices=np.arange(b), grad_weight=b / 6, decision_version=0)
        (b / 6 * StepScope(_Rank(2), batch).loss(y[rows], mask[rows], reduction="token")).backward()
    np.testing.assert_allclose(y.grad.numpy(), x.grad.numpy(), rtol=1e-6)


def test_a_reduced_loss_is_taken_where_exact_and_refused_where_a_loss_per_sample_is_needed():
    out_loss = torch.tensor(1.25, requires_grad=True)  # e.g. a Hugging Face model's out.loss
    batch = StepBatch(step=0, epoch=0, indices=np.arange(3), grad_weight=0.5, decision_version=0)
    scope = StepScope(_Rank(2), batch)
    assert scope.loss(out_loss).item() == 1.25 and scope._per_sample.tolist() == [1.25]
    # the ranks' local means under b_i/B weights give the global mean: (3 x 1.0 + 1 x 3.0) / 4
    means = [StepScope(_Rank(2), StepBatch(0, 0, np.arange(b), b / 4, 0)).loss(torch.tensor(m)).item() * b / 4
             for b, m in ((3, 1.0), (1, 3.0))]
    assert sum(means) == pytest.approx(1.5)
    empty = StepScope(_Rank(2), StepBatch(0, 0, np.arange(0), 0.0, 0)).loss(torch.tensor(float("nan")))
    assert empty.item() == 0.0
    weighted = StepBatch(step=0, epoch=0, indices=np.arange(3), grad_weight=1.0, decision_version=0,
                         sample_weights=np.ones(3, dtype=np.float32))
    with pytest.raises(UsageError, match="sample priorities are on"):
        StepScope(_Rank(1, sample_priority=True), weighted).loss(out_loss)
    with pytest.raises(UsageError, match="reduction='sequence'"):
        StepScope(_Rank(1, sample_priority=True), weighted).loss(torch.ones(3, 4), reduction="token")
    with pytest.raises(UsageError, match=r"shape \(3,\)"):
        scope.loss(torch.ones(2, 3, 4))


def test_a_step_without_step_loss_is_refused_where_a_loss_per_sample_is_required():
    from pdml_ray.config import SamplePriorityConfig

    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=3), sample_priority=SamplePriorityConfig())
    ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", None)
    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    batch = StepBatch(step=0, epoch=0, indices=np.arange(3), grad_weight=1.0, decision_version=0,
                      sample_weights=np.ones(3, dtype=np.float32))
    with pytest.raises(UsageError, match="without step.loss"):
        with ctx.step(batch):
            model(torch.ones(3, 2)).mean().backward()
    with ctx.step(batch) as step:  # through step.loss: accepted
        step.loss(model(torch.ones(3, 2)).squeeze(1)).backward()


def test_selective_backprop_trains_the_high_loss_share_and_reports_every_sample():
    from pdml_ray.config import SamplePriorityConfig

    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8),
                        sample_priority=SamplePriorityConfig(mode="selective-backprop", backprop_share=0.25,
                                                             percentile_window=8))
    ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", None)
    losses = torch.tensor([0.1, 0.2, 5.0, 0.3, 0.4, 4.0, 0.5, 0.6], requires_grad=True)
    scope = StepScope(ctx, StepBatch(step=0, epoch=0, indices=np.arange(8), grad_weight=1.0, decision_version=0))
    loss = scope.loss(losses)
    assert loss.item() == pytest.approx((5.0 + 4.0) / 2)  # the mean over the chosen quarter
    loss.backward()
    np.testing.assert_allclose(losses.grad.numpy(), [0, 0, 0.5, 0, 0, 0.5, 0, 0])
    assert ctx.backprop_selector.trained == 2 and ctx.backprop_selector.forward_only == 6
    assert scope._per_sample.numel() == 8  # every forwarded sample is reported and scored
