"""Seeded straggler models for emulation: how much slower each worker is at each step, and who dies.

A model answers two questions, deterministically for a seed whatever the order of the calls:

- ``factor(worker, step)``: the slowdown (>= 1) of that worker's compute at that step. The emulated
  compute time of a step is ``samples x per_sample_s x factor``, so a worker that computes s + 1
  partitions (gradient coding) takes s + 1 times as long as one that computes one (per-step slowness
  multiplies the work, as in the shifted-exponential model of Lee et al. 2017).
- ``death_step(worker)``: the step at which the worker dies (None: never). A dead worker's process
  exits (on Ray) or never answers (in the simulator).

Every model has a ``label`` (e.g. ``shifted-exp(1+Exp(mean=1))``) that every output using it prints.
Models by name: ``make_straggler_model(name, workers=..., stragglers=..., seed=...)`` with names in
``STRAGGLER_MODELS``; the parameters each name uses are stated in its label and its class below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pdml_ray.errors import ConfigError


class StragglerModel(Protocol):
    @property
    def label(self) -> str:
        """What the model is, with its parameters: printed in every output that uses it."""
        ...

    def factor(self, worker: int, step: int) -> float:
        """Slowdown (>= 1) of ``worker``'s compute at ``step``."""
        ...

    def death_step(self, worker: int) -> int | None:
        """The step at which ``worker`` dies, or None."""
        ...


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


@dataclass(frozen=True)
class NoStragglers:
    """Every worker at full speed, nobody dies."""

    label: str = "none"

    def factor(self, worker: int, step: int) -> float:
        return 1.0

    def death_step(self, worker: int) -> int | None:
        return None


@dataclass(frozen=True)
class FixedSlowdown:
    """The chosen ``workers`` are always ``slowdown`` times slower; the others run at full speed."""

    workers: tuple[int, ...]
    slowdown: float = 3.0

    def __post_init__(self) -> None:
        if not self.slowdown >= 1.0:
            raise ConfigError(f"fixed slowdown must be >= 1 (3.0 = three times slower), got {self.slowdown!r}")

    @property
    def label(self) -> str:
        return f"fixed(workers={list(self.workers)}, x{self.slowdown:g})"

    def factor(self, worker: int, step: int) -> float:
        return self.slowdown if worker in self.workers else 1.0

    def death_step(self, worker: int) -> int | None:
        return None


@dataclass(frozen=True)
class ShiftedExponential:
    """``factor = 1 + Exp(mean=mean_extra)``, independent per (worker, step)."""

    mean_extra: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.mean_extra > 0:
            raise ConfigError(f"shifted-exp mean_extra must be > 0 (1.0: the mean step is twice the shift), got {self.mean_extra!r}")

    @property
    def label(self) -> str:
        return f"shifted-exp(1+Exp(mean={self.mean_extra:g}), seed={self.seed})"

    def factor(self, worker: int, step: int) -> float:
        return 1.0 + float(_rng(self.seed, 1, worker, step).exponential(self.mean_extra))

    def death_step(self, worker: int) -> int | None:
        return None


@dataclass(frozen=True)
class Pareto:
    """Heavy-tailed: ``factor = Pareto(alpha)`` with minimum 1 (P(factor > x) = x^-alpha), per (worker, step)."""

    alpha: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.alpha > 1.0:
            raise ConfigError(f"pareto alpha must be > 1 (finite mean; 2.0 is heavy-tailed), got {self.alpha!r}")

    @property
    def label(self) -> str:
        return f"pareto(alpha={self.alpha:g}, min=1, seed={self.seed})"

    def factor(self, worker: int, step: int) -> float:
        return 1.0 + float(_rng(self.seed, 2, worker, step).pareto(self.alpha))  # Lomax + 1 = Pareto(xm=1)

    def death_step(self, worker: int) -> int | None:
        return None


@dataclass(frozen=True)
class Correlated:
    """Slowness that persists: a 2-state Markov chain per worker (fast: factor 1, slow: ``slowdown``).

    Each step a fast worker turns slow with probability ``p_slow`` and a slow one recovers with
    ``p_recover``; every worker starts fast. Expected slow spell: 1 / p_recover steps; stationary
    slow fraction p_slow / (p_slow + p_recover).
    """

    p_slow: float = 0.05
    p_recover: float = 0.25
    slowdown: float = 4.0
    seed: int = 0
    _chains: dict[int, list[bool]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (0.0 <= self.p_slow <= 1.0 and 0.0 < self.p_recover <= 1.0 and self.slowdown >= 1.0):
            raise ConfigError(f"correlated model needs 0 <= p_slow <= 1, 0 < p_recover <= 1, slowdown >= 1; got "
                              f"p_slow={self.p_slow!r}, p_recover={self.p_recover!r}, slowdown={self.slowdown!r}")

    @property
    def label(self) -> str:
        return (f"correlated(markov p_slow={self.p_slow:g}, p_recover={self.p_recover:g}, "
                f"x{self.slowdown:g}, seed={self.seed})")

    def slow(self, worker: int, step: int) -> bool:
        chain = self._chains.setdefault(worker, [False])
        if step >= len(chain):  # extend the chain in order with one generator per (seed, worker, step)
            for t in range(len(chain), step + 1):
                u = float(_rng(self.seed, 3, worker, t).random())
                chain.append((u >= self.p_recover) if chain[t - 1] else (u < self.p_slow))
        return chain[step]

    def factor(self, worker: int, step: int) -> float:
        return self.slowdown if self.slow(worker, max(step, 0)) else 1.0

    def death_step(self, worker: int) -> int | None:
        return None


@dataclass(frozen=True)
class Death:
    """``workers`` die at ``step``; until then (and for everyone else) compute follows ``base``."""

    workers: tuple[int, ...]
    step: int
    base: StragglerModel = field(default_factory=NoStragglers)

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ConfigError(f"death step must be >= 0, got {self.step!r}")

    @property
    def label(self) -> str:
        return f"death(workers={list(self.workers)} at step {self.step}) + {self.base.label}"

    def factor(self, worker: int, step: int) -> float:
        return self.base.factor(worker, step)

    def death_step(self, worker: int) -> int | None:
        return self.step if worker in self.workers else None


STRAGGLER_MODELS = ("none", "fixed", "shifted-exp", "pareto", "correlated", "death")


def make_straggler_model(name: str, *, workers: int, stragglers: int, seed: int = 0,
                         death_step: int = 10, slowdown: float = 3.0, mean_extra: float = 1.0,
                         alpha: float = 2.0) -> StragglerModel:
    """Model ``name`` for ``workers`` workers, ``stragglers`` of them chosen (seeded) where the model
    names workers: the slow ones of ``fixed`` and the dying ones of ``death`` (which runs on a
    shifted-exponential background with ``mean_extra``)."""
    if name not in STRAGGLER_MODELS:
        raise ConfigError(f"unknown straggler model {name!r}; valid names: {list(STRAGGLER_MODELS)}")
    chosen = tuple(sorted(int(w) for w in _rng(seed, 4).choice(workers, size=min(stragglers, workers), replace=False)))
    if name == "none":
        return NoStragglers()
    if name == "fixed":
        return FixedSlowdown(chosen, slowdown)
    if name == "shifted-exp":
        return ShiftedExponential(mean_extra, seed)
    if name == "pareto":
        return Pareto(alpha, seed)
    if name == "correlated":
        return Correlated(slowdown=slowdown, seed=seed)
    return Death(chosen, death_step, ShiftedExponential(mean_extra, seed))
