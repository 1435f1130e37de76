"""The convex problem the tests and the benchmark train: L2-regularised logistic regression on
generated data (one optimum, so every policy can be checked against ``sync``'s).

Features x ~ N(0, I_d) (float32), labels y = 1[x . w_true + 0.5 noise > 0] with w_true ~ N(0, I_d/d)
scaled by 3, fixed by the seed. The model is ``nn.Linear(dim, 1)`` (dim + 1 parameters).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from pdml_ray.stragglers.delays import StragglerModel
from pdml_ray.stragglers.policy import StragglerPolicy
from pdml_ray.stragglers.run import split_partitions
from pdml_ray.stragglers.worker import GradientWorker


def logistic_data(num_samples: int, dim: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, dim, generator=g)
    w_true = 3.0 * torch.randn(dim, generator=g) / dim ** 0.5
    y = ((x @ w_true + 0.5 * torch.randn(num_samples, generator=g)) > 0).to(torch.float32).unsqueeze(1)
    return x, y


def logistic_model(dim: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Linear(dim, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    return model


def logistic_loss(logits: Tensor, y: Tensor) -> Tensor:
    return nn.functional.binary_cross_entropy_with_logits(logits, y)


def worker_partitions(policy: StragglerPolicy, x: Tensor, y: Tensor) -> list[dict[int, tuple[Tensor, Tensor]]]:
    """Per worker of ``policy``: the partitions it holds (policy.placement), cut from (x, y)."""
    parts = split_partitions(x, y, policy.num_partitions)
    return [{p: parts[p] for p in policy.placement(w)} for w in range(policy.num_workers)]


def make_workers(policy: StragglerPolicy, x: Tensor, y: Tensor, *, l2: float,
                 straggler_model: StragglerModel | None = None, per_sample_s: float = 0.0) -> Sequence[GradientWorker]:
    """In-process workers for the simulated clock (the Ray runtime builds the same inside actors)."""
    dim = x.shape[1]
    return [GradientWorker(w, logistic_model(dim), logistic_loss, held, l2=l2, straggler_model=straggler_model,
                           per_sample_s=per_sample_s)
            for w, held in enumerate(worker_partitions(policy, x, y))]
