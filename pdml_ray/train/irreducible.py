"""RHO-LOSS's irreducible-loss model (Mindermann et al., 2022): a small model trained on a holdout
split, whose per-sample loss on the training set is what training cannot reduce (noise, samples that
cannot be learnt). ``sample_priority.mode='rho-loss'`` scores a sample by its training loss minus this
loss (``SamplePrioritizer.set_irreducible_losses``).

The holdout is the user's, or carved off the training set (``carve_holdout``: a seeded random share).
Its cost is real and returned (``IrreducibleLosses.train_s``, ``infer_s``: wall seconds), so a
benchmark or a run can count it with the selection's cost. Plain torch on in-memory tensors; no Ray.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from pdml_ray.errors import ConfigError

PerSampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(model output (B, ...), targets (B, ...)) -> per-sample losses (B,), e.g. a loss with reduction='none'."""


@dataclass(frozen=True, slots=True)
class IrreducibleLosses:
    """The irreducible-loss model's per-sample losses on the training set, and what they cost."""

    losses: np.ndarray
    """float64 (N,): the model's loss on each training sample (>= 0, finite)."""
    train_s: float
    """Wall seconds training the model on the holdout."""
    infer_s: float
    """Wall seconds computing ``losses``."""


def carve_holdout(num_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, holdout): a seeded random split of ``range(num_samples)``, ``fraction`` of it held out
    (at least one sample each side), both sorted int64."""
    if not (0.0 < fraction < 1.0) or num_samples < 2:
        raise ConfigError(f"carve_holdout needs 0 < fraction < 1 and at least 2 samples, got fraction {fraction!r} "
                          f"of {num_samples!r}; e.g. fraction 0.1")
    k = min(max(1, round(fraction * num_samples)), num_samples - 1)
    perm = np.random.default_rng(seed).permutation(num_samples)
    return np.sort(perm[k:]).astype(np.int64), np.sort(perm[:k]).astype(np.int64)


def fit_irreducible_losses(model: torch.nn.Module, loss_fn: PerSampleLoss, holdout: tuple[torch.Tensor, torch.Tensor],
                           data: tuple[torch.Tensor, torch.Tensor], *, steps: int, lr: float, batch_size: int,
                           seed: int) -> IrreducibleLosses:
    """Train ``model`` (small, fresh) with Adam on ``holdout`` (x, y) for ``steps`` steps of
    ``batch_size`` samples drawn uniformly, then its per-sample loss on every sample of ``data`` (x, y)."""
    x_hold, y_hold = holdout
    if steps < 1 or batch_size < 1 or len(x_hold) < 1:
        raise ConfigError(f"fit_irreducible_losses needs steps >= 1, batch_size >= 1 and a non-empty holdout, got "
                          f"{steps}, {batch_size}, {len(x_hold)} samples")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    t0 = time.perf_counter()
    model.train()
    for _ in range(steps):
        rows = torch.randint(0, len(x_hold), (batch_size,), generator=gen)
        loss = loss_fn(model(x_hold[rows]), y_hold[rows]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    t1 = time.perf_counter()
    model.eval()
    x, y = data
    with torch.no_grad():
        losses = torch.cat([loss_fn(model(x[i:i + 8192]), y[i:i + 8192]) for i in range(0, len(x), 8192)])
    out = np.nan_to_num(losses.double().numpy(), nan=0.0, posinf=0.0).clip(min=0.0)
    return IrreducibleLosses(losses=out, train_s=t1 - t0, infer_s=time.perf_counter() - t1)
