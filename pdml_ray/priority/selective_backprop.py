"""Selective-Backprop's choice (Jiang et al., 2019): forward the whole batch, backpropagate only the
samples whose loss is high against the losses seen lately.

A worker keeps its last ``window`` per-sample losses in a ring buffer. For a new batch of losses the
threshold is the ``1 - share`` quantile of the buffer with the batch in it; the samples at or above it
are backpropagated (at least one per non-empty batch: the highest). The rest were forwarded only: they
cost a forward pass and are counted apart (``forward_only``). O(window) per batch (one
``np.partition``), a few microseconds at the default 4,096.

This is a per-worker percentile. It is biased on purpose: the backpropagated loss is the mean over
the chosen samples, which over-represents high losses (the paper's trade: fewer backward passes,
more useful ones).
"""

from __future__ import annotations

import numpy as np

from pdml_ray.errors import ConfigError


class BackpropSelector:
    """Which samples of each batch to backpropagate, by their loss's percentile among recent losses."""

    def __init__(self, share: float, window: int) -> None:
        if not (0.0 < share <= 1.0) or window < 1:
            raise ConfigError(f"BackpropSelector needs 0 < share <= 1 and window >= 1 (sample_priority."
                              f"backprop_share, percentile_window), got {share!r}, {window!r}")
        self.share = float(share)
        self._ring = np.empty(int(window))  # recent per-sample losses
        self._size = 0                      # filled part of the ring
        self._next = 0                      # where the next loss goes
        self.trained = 0                    # samples backpropagated so far
        self.forward_only = 0               # samples forwarded and not backpropagated

    def select(self, losses: np.ndarray) -> np.ndarray:
        """A bool mask (B,) over one batch's per-sample losses (float (B,)): True = backpropagate.
        Non-finite losses are never chosen (and never enter the history)."""
        losses = np.asarray(losses, dtype=np.float64).ravel()
        finite = np.isfinite(losses)
        self._remember(losses[finite])
        mask = np.zeros(losses.size, dtype=bool)
        if finite.any():
            history = self._ring[:self._size]
            k = min(int(np.floor((1.0 - self.share) * history.size)), history.size - 1)
            threshold = np.partition(history, k)[k]  # the (1 - share) quantile, a value of the history
            mask = finite & (losses >= threshold)
            if not mask.any():  # every finite loss below the history's quantile: train the batch's highest
                mask[np.flatnonzero(finite)[np.argmax(losses[finite])]] = True
        chosen = int(mask.sum())
        self.trained += chosen
        self.forward_only += losses.size - chosen
        return mask

    def _remember(self, losses: np.ndarray) -> None:
        window = self._ring.size
        losses = losses[-window:]
        end = self._next + losses.size
        if end <= window:
            self._ring[self._next:end] = losses
        else:
            cut = window - self._next
            self._ring[self._next:] = losses[:cut]
            self._ring[:end - window] = losses[cut:]
        self._next = end % window
        self._size = min(self._size + losses.size, window)
