"""Switch priority sampling off while it does not pay (after Katharopoulos & Fleuret, 2018).

Gain. Drawing i with probability p_i and weighting its loss by 1 / (N p_i) estimates the uniform mean
with second moment ``E_u[s^2 / (N p)]`` instead of uniform draws' ``E_u[s^2]``, with s a per-sample
gradient-norm proxy (here the table's score, the loss). Their ratio

    gain = E_u[s^2] / E_u[s^2 / (N p)]        (1 when p is uniform; mean(s^2) / mean(s)^2 when p ~ s)

is the variance reduction the sampler predicts for an unbiased step, i.e. the factor by which a
uniform batch would have to grow to match it. It is estimated over the seen samples from
``GAIN_ITEMS`` (1,024) of them drawn from the sum-tree (q ~ s^alpha among the seen), each term
divided by ``n_seen q``: a uniform subsample would miss the few heavy samples that carry the gain
(19 positives in 20,000), which is exactly where priority pays. O(1,024 log N) per decision interval.

Cost. ``cost = 1 + selection seconds per step / step seconds``: the table's own measured time in
plans and updates (draws, weights, scoring) per step, taken while priority draws are on, against
the step time the workers report (``note_step_seconds``). Before a step time is known the cost
counts as 1.

Rule. While ``gain / cost < pay_threshold`` the draws are uniform with every weight 1 (the table
keeps scoring what is drawn, so the gain is still measured); back on once it exceeds
``pay_threshold * (1 + HYSTERESIS)``. Each switch is counted (``switches_off``, ``switches_on``).
The predicted gain is that of an unbiased sampler: a mode whose benefit is its bias (annealed,
rho-loss) can gain more than it predicts, so the switch is off unless ``pay_threshold`` is set.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

GAIN_ITEMS = 1024
"""Seen samples drawn to estimate the gain: its relative error is ~1/sqrt(1024) = 3% for light tails."""
HYSTERESIS = 0.1
"""Back on only above pay_threshold * 1.1, so a gain near the threshold does not flip every interval."""
_MIN_SEEN = 64
"""Fewer seen samples in the estimate than this: no verdict (keep the current state)."""
_STEP_EMA = 0.2
"""Weight of the newest step time in the step-seconds EMA."""


def predicted_gain(scores: np.ndarray, relative_p: np.ndarray, relative_q: np.ndarray | None = None) -> float:
    """``E[s^2] / E[s^2 / (N p)]`` over samples' scores s (>= 0) and N p (their probability times N),
    the samples drawn uniformly, or from q with ``relative_q`` = n q (each term divided by it)."""
    q = np.ones_like(scores) if relative_q is None else np.maximum(relative_q, 1e-300)
    square = scores * scores / q
    second = float(np.mean(square))
    weighted = float(np.mean(square / np.maximum(relative_p, 1e-300)))
    return second / weighted if weighted > 0 else 1.0


class PaySwitch:
    """Priority draws on or off, from the predicted gain against the measured cost (module docstring)."""

    def __init__(self, threshold: float | None) -> None:
        self.threshold = threshold
        self.on = True
        self.switches_off = 0
        self.switches_on = 0
        self.selection_s = 0.0      # table time in plans and updates, all along (s)
        self._on_selection_s = 0.0  # the part of it spent while priority draws were on (s)
        self._on_steps = 0          # steps planned while on
        self.step_s = math.nan      # EMA of the workers' step time (s)
        self.gain = math.nan        # last predicted gain
        self.cost = math.nan        # last cost factor

    def record_selection(self, seconds: float, steps: int = 0) -> None:
        """Table time spent on selection (``steps``: steps it planned, 0 for an update)."""
        self.selection_s += seconds
        if self.on:
            self._on_selection_s += seconds
            self._on_steps += steps

    def note_step_seconds(self, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            self.step_s = seconds if math.isnan(self.step_s) else (1 - _STEP_EMA) * self.step_s + _STEP_EMA * seconds

    def cost_factor(self) -> float:
        if self._on_steps == 0 or not self.step_s > 0:
            return 1.0
        return 1.0 + self._on_selection_s / self._on_steps / self.step_s

    def decide(self, scores: np.ndarray, relative_p: np.ndarray, relative_q: np.ndarray | None = None) -> bool:
        """Update on/off from samples' scores and N p (arrays of the same shape), drawn uniformly or from
        q (``relative_q``: n q, see ``predicted_gain``); returns ``on``."""
        if self.threshold is None or scores.size < _MIN_SEEN:
            return self.on
        self.gain, self.cost = predicted_gain(scores, relative_p, relative_q), self.cost_factor()
        pays = self.gain / self.cost
        if self.on and pays < self.threshold:
            self.on, self.switches_off = False, self.switches_off + 1
        elif not self.on and pays > self.threshold * (1.0 + HYSTERESIS):
            self.on, self.switches_on = True, self.switches_on + 1
        return self.on

    def state_dict(self) -> dict[str, Any]:
        """The verdict and its counts; not the timings (a resumed run measures its own cost afresh, and
        a state holds no wall-clock figure that would make two saves of one run differ)."""
        return {"on": self.on, "switches_off": self.switches_off, "switches_on": self.switches_on}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.on = bool(d["on"])
        self.switches_off, self.switches_on = int(d["switches_off"]), int(d["switches_on"])
