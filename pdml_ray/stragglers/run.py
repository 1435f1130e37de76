"""Records of a straggler-tolerant training run (the Ray runtime and the simulated clock write the
same ones) and the figures the benchmark reports from them.

Times are seconds. On Ray, ``step_time_s`` is the aggregator's wall time from publishing the step's
parameters to applying the update (the evaluation of the full loss and gradient, done for the
figures only, is outside it); in the simulator it is the simulated EMULATED compute time of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from pdml_ray.decisions import WorkerReport
from pdml_ray.errors import ConfigError
from pdml_ray.stragglers.policy import Combination
from pdml_ray.stragglers.worker import LossFn, flat_grad, objective


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    step_time_s: float
    loss: float
    """Full objective after this step's update (nan without an evaluator)."""
    grad_cosine: float
    """Cosine between the applied gradient and the full gradient at the parameters it was applied to."""
    combination: Combination
    partitions_computed: tuple[int, ...]
    """Per worker given a task this step: partitions it was asked to compute (fresh and catch-up)."""
    arrived: tuple[int, ...]
    dead: tuple[int, ...]
    reports: tuple[WorkerReport, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    straggler_model: str
    """The straggler model's label."""
    records: tuple[StepRecord, ...]
    stalled: str | None
    """Why the run stopped early (a dead worker the policy cannot tolerate, a step timeout), or None."""
    initial_loss: float
    params: Tensor

    @property
    def step_times(self) -> np.ndarray:
        return np.array([r.step_time_s for r in self.records])

    def step_time_quantile(self, q: float) -> float | None:
        t = self.step_times
        return float(np.quantile(t, q)) if len(t) else None

    def time_to_target(self, target_loss: float) -> float | None:
        """Summed step time until the first step whose loss is <= target, None if never."""
        elapsed = 0.0
        for r in self.records:
            elapsed += r.step_time_s
            if r.loss <= target_loss:
                return elapsed
        return None

    @property
    def final_loss(self) -> float:
        return self.records[-1].loss if self.records else self.initial_loss

    @property
    def partitions_per_step(self) -> float:
        """Median over all (worker, step) tasks of the partitions computed: the steady state (pgc's
        warm-up step 0 computes s + 1, and its catch-ups one more; see the mean)."""
        counts = [c for r in self.records for c in r.partitions_computed]
        return float(np.median(counts)) if counts else math.nan

    @property
    def partitions_per_step_mean(self) -> float:
        counts = [c for r in self.records for c in r.partitions_computed]
        return float(np.mean(counts)) if counts else math.nan

    @property
    def grad_cosine(self) -> float:
        c = [r.grad_cosine for r in self.records if not math.isnan(r.grad_cosine)]
        return float(np.mean(c)) if c else math.nan

    @property
    def grad_cosine_min(self) -> float:
        c = [r.grad_cosine for r in self.records if not math.isnan(r.grad_cosine)]
        return float(np.min(c)) if c else math.nan

    @property
    def exact_fraction(self) -> float:
        return float(np.mean([r.combination.exact for r in self.records])) if self.records else math.nan


class FullObjective:
    """Full-batch objective and gradient at flat parameters (float64 gradient): the reference for
    the gradient cosine and the training loss. Runs wherever it is called (the aggregator), outside
    any timed step."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, l2: float = 0.0) -> None:
        self.model, self.loss_fn, self.x, self.y, self.l2 = model, loss_fn, x, y, l2

    def __call__(self, params: Tensor) -> tuple[float, Tensor]:
        nn.utils.vector_to_parameters(params.to(torch.float32), self.model.parameters())
        self.model.zero_grad(set_to_none=True)
        loss = objective(self.model, self.x, self.y, self.loss_fn, self.l2)
        loss.backward()
        return float(loss.detach()), flat_grad(self.model).detach().to(torch.float64)


def minimize(evaluate: FullObjective, dim: int, max_iter: int = 500) -> tuple[float, Tensor]:
    """The objective's minimum and its parameters (L-BFGS from zero, strong Wolfe line search): the
    reference a run's loss is compared with. Convex problems only (logistic regression here)."""
    theta = torch.zeros(dim + 1, requires_grad=True)
    opt = torch.optim.LBFGS([theta], max_iter=max_iter, tolerance_grad=1e-12, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss, grad = evaluate(theta.detach())
        theta.grad = grad.float()
        return torch.tensor(loss)

    opt.step(closure)
    return float(evaluate(theta.detach())[0]), theta.detach()

def cosine(a: Tensor, b: Tensor) -> float:
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    return float(torch.dot(a.double(), b.double())) / (na * nb) if na > 0 and nb > 0 else math.nan


def split_partitions(x: Tensor, y: Tensor, parts: int) -> list[tuple[Tensor, Tensor]]:
    """``parts`` equal, contiguous partitions of (x, y); the sample count must divide evenly (so the
    mean of partition means is the full mean)."""
    if len(x) % parts:
        raise ConfigError(f"{len(x)} samples do not split into {parts} equal partitions; use a multiple of {parts}")
    size = len(x) // parts
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(parts)]


Evaluator = Callable[[Tensor], tuple[float, Tensor]]
