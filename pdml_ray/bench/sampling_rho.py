"""``bench sampling``'s irreducible-loss models for its rho-loss arms (``pdml_ray.train.irreducible``).

- ``rho_loss``: cross-fitted (``--il-folds``, default 2: each half of the training set scored by a model
  trained on the other half, as RHO-LOSS does without holdout data), class-balanced draws with the
  logit adjustment, a two-layer width-64 MLP, ``--il-steps`` (500) Adam steps per fold; the
  ``rho_loss_corrected`` ablation uses the same models;
- ``rho_loss_holdout`` (the ablation): the recipe rho-loss was first measured with, a one-layer
  width-64 MLP trained for 100 steps on uniform draws of a holdout carved off the training set
  (``--holdout-fraction``). On noisy imbalanced data it never learns the rare class (the clean
  positives keep a mean irreducible loss of ~1.7), so they stop being drawn while the model still
  misclassifies them.

Both train on the noisy training labels (the benchmark's own data, nothing else), and their wall
time is counted in the arm's time from step 0.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from pdml_ray.train.irreducible import (IrreducibleLosses, carve_holdout, fit_crossfit_irreducible_losses,
                                        fit_irreducible_losses)

RHO_ARMS = ("rho_loss", "rho_loss_corrected", "rho_loss_holdout")
_HIDDEN = 64             # width of the irreducible-loss models
_CROSSFIT_LR = 1e-2
_HOLDOUT_STEPS, _HOLDOUT_LR = 100, 1e-2    # the first recipe's


def _per_sample(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(out.squeeze(1), target, reduction="none")


def irreducible_losses(name: str, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace,
                       seed: int) -> IrreducibleLosses:
    """The irreducible losses of every training sample (x (N, d), y (N,) noisy labels) for rho arm
    ``name``, with their wall seconds."""
    dim = x.shape[1]
    if name != "rho_loss_holdout":  # rho_loss and rho_loss_corrected: the same cross-fitted models
        def make() -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Linear(dim, _HIDDEN), torch.nn.ReLU(),
                                       torch.nn.Linear(_HIDDEN, _HIDDEN), torch.nn.ReLU(), torch.nn.Linear(_HIDDEN, 1))

        torch.manual_seed(seed + 30_013)
        return fit_crossfit_irreducible_losses(make, _per_sample, (x, y), folds=args.il_folds, steps=args.il_steps,
                                               lr=_CROSSFIT_LR, batch_size=128, seed=seed + 30_013,
                                               class_balanced=True)
    _, held = carve_holdout(len(x), args.holdout_fraction, seed + 30_013)
    torch.manual_seed(seed + 30_013)
    model = torch.nn.Sequential(torch.nn.Linear(dim, _HIDDEN), torch.nn.ReLU(), torch.nn.Linear(_HIDDEN, 1))
    rows = torch.from_numpy(held)
    return fit_irreducible_losses(model, _per_sample, (x[rows], y[rows]), (x, y), steps=_HOLDOUT_STEPS,
                                  lr=_HOLDOUT_LR, batch_size=128, seed=seed)
