"""RHO-LOSS's irreducible-loss model (Mindermann et al., 2022): a small model trained on a holdout
split, whose per-sample loss on the training set is what training cannot reduce (noise, samples that
cannot be learnt). ``sample_priority.mode='rho-loss'`` scores a sample by its training loss minus this
loss (``SamplePrioritizer.set_irreducible_losses``).

The holdout is the user's, or carved off the training set (``carve_holdout``: a seeded random share).
Without one, ``fit_crossfit_irreducible_losses`` cuts the training set into folds and scores each
fold with a model trained on the others, as RHO-LOSS does without holdout data (two halves, each
model scoring the other): every sample is scored by a model that never saw it, and each model sees
(folds - 1) / folds of the data, not a tenth of it.

The model must have learnt what is learnable, rare classes included: a sample whose training loss
falls to its irreducible loss is no longer drawn. On imbalanced data with noisy labels a small model
on uniform draws of a small holdout does not (``bench sampling --imbalance 100 --label-noise 0.1``:
about 18 clean positives among about 200 flipped labels in a 10% holdout; the model gave the clean
positives a mean loss of 1.7, so they stopped being drawn at p ~ 0.2). ``class_balanced=True`` draws
each class equally often and adds log(prior) to the logits at inference (logit adjustment, Menon et
al., 2021: a model trained on balanced draws estimates p(y|x) / prior(y) up to a constant, so the
adjusted loss is the calibrated one RHO-LOSS needs, while the rare class is seen half the time).

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


def carve_folds(num_samples: int, folds: int, seed: int) -> list[np.ndarray]:
    """``folds`` seeded random folds of ``range(num_samples)`` (sizes differing by at most one), each
    sorted int64."""
    if not (2 <= folds <= num_samples):
        raise ConfigError(f"carve_folds needs 2 <= folds <= samples, got {folds!r} folds of {num_samples!r}; e.g. 2")
    perm = np.random.default_rng(seed).permutation(num_samples)
    return [np.sort(f).astype(np.int64) for f in np.array_split(perm, folds)]


def fit_irreducible_losses(model: torch.nn.Module, loss_fn: PerSampleLoss, holdout: tuple[torch.Tensor, torch.Tensor],
                           data: tuple[torch.Tensor, torch.Tensor], *, steps: int, lr: float, batch_size: int,
                           seed: int, class_balanced: bool = False) -> IrreducibleLosses:
    """Train ``model`` (small, fresh) with Adam on ``holdout`` (x, y) for ``steps`` steps of
    ``batch_size`` samples drawn uniformly, then its per-sample loss on every sample of ``data`` (x, y).
    ``class_balanced``: y holds class labels (0 .. K-1, K >= 2; the model outputs one logit for K = 2,
    else K) drawn equally often, and log(prior) is added to the logits at inference (module docstring)."""
    x_hold, y_hold = holdout
    if steps < 1 or batch_size < 1 or len(x_hold) < 1:
        raise ConfigError(f"fit_irreducible_losses needs steps >= 1, batch_size >= 1 and a non-empty holdout, got "
                          f"{steps}, {batch_size}, {len(x_hold)} samples")
    gen = torch.Generator().manual_seed(seed)
    classes, log_prior = _class_rows(y_hold) if class_balanced else (None, None)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    t0 = time.perf_counter()
    model.train()
    for _ in range(steps):
        if classes is None:
            rows = torch.randint(0, len(x_hold), (batch_size,), generator=gen)
        else:  # a class uniformly, then a sample of it uniformly
            pick = torch.randint(0, len(classes), (batch_size,), generator=gen)
            rows = torch.cat([c[torch.randint(0, len(c), (int((pick == k).sum()),), generator=gen)]
                              for k, c in enumerate(classes)])
        loss = loss_fn(model(x_hold[rows]), y_hold[rows]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    t1 = time.perf_counter()
    model.eval()
    x, y = data
    with torch.no_grad():
        losses = torch.cat([loss_fn(_adjusted(model(x[i:i + 8192]), log_prior), y[i:i + 8192])
                            for i in range(0, len(x), 8192)])
    out = np.nan_to_num(losses.double().numpy(), nan=0.0, posinf=0.0).clip(min=0.0)
    return IrreducibleLosses(losses=out, train_s=t1 - t0, infer_s=time.perf_counter() - t1)


def fit_crossfit_irreducible_losses(make_model: Callable[[], torch.nn.Module], loss_fn: PerSampleLoss,
                                    data: tuple[torch.Tensor, torch.Tensor], *, folds: int, steps: int, lr: float,
                                    batch_size: int, seed: int, class_balanced: bool = False) -> IrreducibleLosses:
    """Irreducible losses without a holdout: ``data`` (x, y) cut into ``folds`` seeded folds
    (``carve_folds``), each scored by a fresh ``make_model()`` trained on the other folds
    (``fit_irreducible_losses``, ``steps`` each); the seconds are the sums over the folds."""
    x, y = data
    parts = carve_folds(len(x), folds, seed)
    losses, train_s, infer_s = np.zeros(len(x)), 0.0, 0.0
    for k, scored in enumerate(parts):
        rows = torch.from_numpy(np.concatenate([p for j, p in enumerate(parts) if j != k]))
        cut = torch.from_numpy(scored)
        il = fit_irreducible_losses(make_model(), loss_fn, (x[rows], y[rows]), (x[cut], y[cut]), steps=steps, lr=lr,
                                    batch_size=batch_size, seed=seed + k, class_balanced=class_balanced)
        losses[scored], train_s, infer_s = il.losses, train_s + il.train_s, infer_s + il.infer_s
    return IrreducibleLosses(losses=losses, train_s=train_s, infer_s=infer_s)


def _class_rows(y: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The rows of each class of ``y`` (class labels 0 .. K-1) and log(prior) (K,)."""
    labels = y.reshape(-1)
    if labels.numel() == 0 or not torch.equal(labels, labels.round()) or labels.min() < 0:
        raise ConfigError("class_balanced=True needs class labels 0 .. K-1 as targets (a classifier's holdout)")
    counts = torch.bincount(labels.long())
    if len(counts) < 2 or bool((counts == 0).any()):
        raise ConfigError(f"class_balanced=True needs every class 0 .. K-1 (K >= 2) in the holdout, got counts "
                          f"{counts.tolist()}; use a larger holdout or class_balanced=False")
    log_prior = (counts.double() / counts.sum()).log().float()
    return [torch.nonzero(labels == k).squeeze(1) for k in range(len(counts))], log_prior


def _adjusted(logits: torch.Tensor, log_prior: torch.Tensor | None) -> torch.Tensor:
    """Logits plus log(prior) (class_balanced): per class for K logits (B, K), log(prior_1 / prior_0)
    for a binary model's one logit ((B,) or (B, 1)); else the logits as they are."""
    if log_prior is None:
        return logits
    log_prior = log_prior.to(logits.device, logits.dtype)
    k = len(log_prior)
    if logits.dim() > 1 and logits.shape[-1] == k:
        return logits + log_prior
    if k == 2 and (logits.dim() == 1 or logits.shape[-1] == 1):
        return logits + (log_prior[1] - log_prior[0])
    raise ConfigError(f"class_balanced=True: the model's outputs {tuple(logits.shape)} are neither one logit per "
                      f"class ({k}) nor a binary model's one logit")
