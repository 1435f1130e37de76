"""The weight tuner: a discounted-UCB bandit over a handful of points of the weight simplex.

The gradient deriver's priority is ``alpha * grad + beta * data + gamma * node`` with (alpha, beta,
gamma) on the simplex. Tuning them online is a bandit problem: each decision interval pulls one
weight vector (an arm) and the run pays back a noisy reward, the loss decrease per second over the
interval. Why these choices:

- **Discrete arms** (the configured prior, then the grid ``{(i, j, k) / R}``): a handful of arms is
  explored in a few dozen boundaries, every arm is a weight vector a person can read in the status
  output, and nothing has to be differentiated (a reward of one interval says nothing about a
  gradient in weight space: it is dominated by noise and by where training is).
- **Discounted UCB** (Garivier and Moulines, 2011): the reward drifts down as training converges,
  so old rewards are forgotten by ``discount`` per pull (the effective memory is ``1 / (1 - discount)``
  pulls). Arm a's index is its discounted mean reward plus ``c * scale * sqrt(log n / n_a)``, with
  ``n`` the discounted number of pulls and ``scale`` the running mean absolute reward, so ``c`` is
  unit-free (rewards are losses per second: their scale depends on the model).
- Untried arms go first, the prior first of all (arm 0); ties go to the lower index. No randomness:
  the same rewards give the same pulls, so runs replay.

``reset()`` forgets everything and pins the prior (the deriver calls it when the continuity check
finds the priorities collapsed). Pure numpy: no Ray, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pdml_ray.errors import ConfigError, StateError

Weights = tuple[float, float, float]


def simplex_arms(prior: Sequence[float], resolution: int) -> tuple[Weights, ...]:
    """The prior first, then the grid points ``(i, j, k) / resolution`` (i + j + k = resolution) that
    differ from it: (resolution + 1)(resolution + 2) / 2 grid points; resolution 0: the prior alone."""
    if resolution < 0:
        raise ConfigError(f"simplex resolution must be >= 0 (0: the prior alone), got {resolution!r}")
    arms: list[Weights] = [(float(prior[0]), float(prior[1]), float(prior[2]))]
    if resolution == 0:
        return tuple(arms)
    for i in range(resolution, -1, -1):
        for j in range(resolution - i, -1, -1):
            w = (i / resolution, j / resolution, (resolution - i - j) / resolution)
            if max(abs(a - b) for a, b in zip(w, arms[0])) > 1e-9:
                arms.append(w)
    return tuple(arms)


class WeightBandit:
    """Discounted UCB over ``arms`` (any sequence of weight vectors; arm 0 is the prior)."""

    def __init__(self, arms: Sequence[Weights], discount: float = 0.98, exploration: float = 1.0) -> None:
        if len(arms) < 1:
            raise ConfigError("WeightBandit needs at least one arm")
        if not (0.0 < discount <= 1.0):
            raise ConfigError(f"bandit discount must be in (0, 1], got {discount!r}")
        self.arms = tuple(arms)
        self.discount = float(discount)
        self.exploration = float(exploration)
        self.counts = np.zeros(len(arms))       # discounted number of pulls per arm
        self.sums = np.zeros(len(arms))         # discounted sum of rewards per arm
        self.pulls = np.zeros(len(arms), dtype=np.int64)  # undiscounted, for stats
        self.scale = 0.0                        # running mean |reward| (the exploration bonus's unit)
        self.scale_weight = 0.0
        self.current = 0                        # arm in force now
        self.resets = 0

    @property
    def weights(self) -> Weights:
        return self.arms[self.current]

    def means(self) -> np.ndarray:
        """Discounted mean reward per arm (nan for an arm without pulls)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 1e-12, self.sums / np.maximum(self.counts, 1e-300), np.nan)

    def indices(self) -> np.ndarray:
        """UCB index per arm; +inf for an arm never pulled since the last reset."""
        total = float(self.counts.sum())
        bonus_unit = self.exploration * (self.scale if self.scale > 0 else 1.0)
        out = np.full(len(self.arms), math.inf)
        tried = self.counts > 1e-12
        if tried.any():
            log_n = math.log(max(total, 1.0 + 1e-12))
            out[tried] = self.sums[tried] / self.counts[tried] + bonus_unit * np.sqrt(log_n / self.counts[tried])
        return out

    def select(self) -> int:
        """The arm to pull next (the highest index; untried arms first, lowest index on ties)."""
        self.current = int(np.argmax(self.indices()))
        return self.current

    def update(self, arm: int, reward: float) -> None:
        """Credit ``reward`` (loss decrease per second) to ``arm``; every arm's past is discounted."""
        if not math.isfinite(reward):
            return
        self.counts *= self.discount
        self.sums *= self.discount
        self.counts[arm] += 1.0
        self.sums[arm] += reward
        self.pulls[arm] += 1
        self.scale_weight = self.discount * self.scale_weight + 1.0
        self.scale += (abs(reward) - self.scale) / self.scale_weight

    def best_arm(self) -> int:
        """The arm with the highest discounted mean reward so far (the prior before any reward)."""
        means = self.means()
        return int(np.nanargmax(means)) if np.isfinite(means).any() else 0

    def reset(self) -> None:
        """Forget every reward and return to the prior (arm 0)."""
        self.counts[:] = 0.0
        self.sums[:] = 0.0
        self.scale = self.scale_weight = 0.0
        self.current = 0
        self.resets += 1

    def state_dict(self) -> dict[str, Any]:
        return {"arms": [list(a) for a in self.arms], "counts": self.counts.tolist(), "sums": self.sums.tolist(),
                "pulls": self.pulls.tolist(), "scale": self.scale, "scale_weight": self.scale_weight,
                "current": self.current, "resets": self.resets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        arms = tuple(tuple(float(x) for x in a) for a in state["arms"])
        if len(arms) != len(self.arms) or any(max(abs(x - y) for x, y in zip(a, b)) > 1e-9
                                              for a, b in zip(arms, self.arms)):
            raise StateError(f"saved weight bandit has arms {arms}, this run has {self.arms}; resume with the same "
                             "gradient_priority.prior_weights and simplex_resolution")
        self.counts = np.array(state["counts"], dtype=np.float64)
        self.sums = np.array(state["sums"], dtype=np.float64)
        self.pulls = np.array(state["pulls"], dtype=np.int64)
        self.scale, self.scale_weight = float(state["scale"]), float(state["scale_weight"])
        self.current, self.resets = int(state["current"]), int(state["resets"])
