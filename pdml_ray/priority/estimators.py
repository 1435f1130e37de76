"""The one exponential moving average behind the derivers' smoothed estimates.

Osprey smooths each (stage, replica, kind) latency (seconds), sample priorities each sample's loss
(``score='loss_ema'``; ``'loss'`` is the same EMA with ``alpha = 1``). (Node priorities fit a line
per worker instead, ``step_fit.StepTimeFit``: a step time has a fixed and a per-sample part, which one
smoothed rate cannot tell apart.) Both share one rule:

    first observation of a slot:   value <- x                       (replaces the prior outright)
    later observations:            value <- (1 - alpha) * value + alpha * x

``values`` holds the prior (NaN unless given) until a slot is first observed; ``measured`` says
which slots have been. Owners may also write ``values`` directly (a decay towards the mean, a
recalibration): the EMA then continues from what they wrote.

``median``: a partition median of a small array (the sample table's robust scale, every scored update).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdml_ray.errors import ConfigError


class EMA:
    """Exponential moving average over a fixed array of slots (float64, any shape)."""

    def __init__(self, shape: int | tuple[int, ...], alpha: float, prior: float | np.ndarray = np.nan) -> None:
        if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
            raise ConfigError(f"EMA weight alpha must be in (0, 1] (1.0 = newest only), got {alpha!r}")
        self.alpha = float(alpha)
        self.values = np.empty(shape, dtype=np.float64)
        self.values[...] = prior
        self.measured = np.zeros(self.values.shape, dtype=bool)

    def update(self, index: Any, x: float | np.ndarray) -> None:
        """Fold observation(s) ``x`` into slot(s) ``index`` (an int, a tuple, or unique int arrays)."""
        old, seen = self.values[index], self.measured[index]
        if np.ndim(old) == 0:  # one slot: plain floats, no temporary arrays
            self.values[index] = (1.0 - self.alpha) * float(old) + self.alpha * float(x) if seen else float(x)
        else:
            self.values[index] = np.where(seen, (1.0 - self.alpha) * old + self.alpha * np.asarray(x), x)
        self.measured[index] = True

    @property
    def all_measured(self) -> bool:
        return bool(self.measured.all())

    def state_dict(self) -> dict[str, Any]:
        return {"values": self.values.tolist(), "measured": self.measured.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = np.array(state["values"], dtype=np.float64)  # its own copy: a state that came through Ray is read-only
        if values.shape != self.values.shape:
            raise ConfigError(f"saved estimates have shape {values.shape}, this run needs {self.values.shape}; "
                              "resume with the same number of workers (stages, samples)")
        self.values = values
        self.measured = np.array(state["measured"], dtype=bool).reshape(values.shape)


def median(x: np.ndarray) -> float:
    """The median of a non-empty 1-D float array by partition: ``np.median``'s value, at a fifth of its
    cost on a few hundred values, and without its first call's import of ``numpy.ma`` (15 ms, which
    landed inside the first scored update of a training run's sample table)."""
    n = x.size
    k = n // 2
    if n % 2:
        return float(np.partition(x, k)[k])
    part = np.partition(x, (k - 1, k))
    return 0.5 * (float(part[k - 1]) + float(part[k]))
