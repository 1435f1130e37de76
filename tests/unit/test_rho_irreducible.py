"""RHO-LOSS's irreducible-loss model: cross-fitting and class-balanced draws (pure torch, no Ray)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pdml_ray.errors import ConfigError
from pdml_ray.train.irreducible import carve_folds, fit_crossfit_irreducible_losses, fit_irreducible_losses


def _bce(out, target):
    return F.binary_cross_entropy_with_logits(out.squeeze(1), target, reduction="none")


class _Recorder(torch.nn.Module):
    """Remembers the sample ids (column 0) it trained on; outputs one learnt bias."""

    def __init__(self, seen: list[set[int]]) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.trained_on: set[int] = set()
        seen.append(self.trained_on)

    def forward(self, x):
        if self.training:
            self.trained_on.update(int(i) for i in x[:, 0])
        return self.bias.expand(len(x), 1)


def test_folds_cut_every_sample_once_and_each_fold_is_scored_by_a_model_that_never_saw_it():
    folds = carve_folds(11, 3, seed=0)
    assert sorted(np.concatenate(folds).tolist()) == list(range(11)) and sorted(map(len, folds)) == [3, 4, 4]
    with pytest.raises(ConfigError, match="folds"):
        carve_folds(5, 1, seed=0)
    n = 60
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    y = (torch.arange(n) % 2).float()
    seen: list[set[int]] = []
    il = fit_crossfit_irreducible_losses(lambda: _Recorder(seen), _bce, (x, y), folds=2, steps=10, lr=0.1,
                                         batch_size=16, seed=0)
    parts = carve_folds(n, 2, seed=0)
    assert len(seen) == 2 and il.losses.shape == (n,) and il.train_s > 0
    for trained_on, scored in zip(seen, parts):
        assert trained_on and trained_on.isdisjoint(scored.tolist())  # out-of-fold scores only


def test_class_balanced_draws_see_the_rare_class_half_the_time_and_the_logit_adjustment_recalibrates():
    # 10% positives, no feature: the calibrated model predicts p = 0.1 everywhere
    n = 1000
    x, y = torch.zeros(n, 1), (torch.arange(n) < 100).float()

    def fit(balanced: bool):
        torch.manual_seed(0)
        return fit_irreducible_losses(torch.nn.Linear(1, 1), _bce, (x, y), (x, y), steps=300, lr=0.05,
                                      batch_size=64, seed=0, class_balanced=balanced).losses

    for losses in (fit(False), fit(True)):
        assert losses[:100].mean() == pytest.approx(-math.log(0.1), abs=0.15)   # positives
        assert losses[100:].mean() == pytest.approx(-math.log(0.9), abs=0.03)   # negatives
    with pytest.raises(ConfigError, match="class labels"):
        fit_irreducible_losses(torch.nn.Linear(1, 1), _bce, (x, y + 0.5), (x, y), steps=1, lr=0.1, batch_size=4,
                               seed=0, class_balanced=True)
