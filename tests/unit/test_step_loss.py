"""StepScope.loss: the importance-weighted mean the worker's gradient comes from (no Ray, no process group)."""

import numpy as np
import pytest
import torch

from pdml_ray.config import NodePriorityConfig, PDMLConfig
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
