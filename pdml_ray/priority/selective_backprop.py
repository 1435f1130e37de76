"""Selective-Backprop's choice (Jiang et al., 2019): forward the whole batch, backpropagate only the
samples whose loss is high against the losses seen lately.

The saving needs the backward to run over the chosen rows only: score the whole batch without
gradients, then forward and backpropagate the chosen rows (``rows``; ``StepScope.backprop_rows`` in
``ctx.step``). A loss masked to the chosen rows gives the same gradient but a backward over the whole
batch.

A worker keeps its last ``window`` per-sample losses in a ring buffer. For a new batch of losses the
threshold is the ``1 - share`` quantile of the buffer with the batch in it (just above it where that
value is tied with lower-ranked losses, ``LossWindow.threshold``); the samples at or above it are
backpropagated (at least one per non-empty batch: the highest). The rest were forwarded only: they
cost a forward pass and are counted apart (``forward_only``). O(window) per batch (one
``np.partition``), a few microseconds at the default 4,096.

Per worker by default; where the scheduler's table is on, its plans carry the cluster's percentile
(``SamplePlan.backprop_threshold``: the same quantile over the last ``window`` losses every worker
reported, ``LossWindow`` in the table) and each worker selects by it, so a worker whose losses run
high (a harder shard, a different loss scale) backpropagates more of its batch than one whose losses
run low, as a single worker over the global batch would. It is biased on purpose: the
backpropagated loss is the mean over the chosen samples, which over-represents high losses (the
paper's trade: fewer backward passes, more useful ones).
"""

from __future__ import annotations

import numpy as np

from pdml_ray.errors import ConfigError


class LossWindow:
    """The last ``window`` finite per-sample losses (a ring buffer) and their quantiles."""

    def __init__(self, window: int) -> None:
        self._ring = np.empty(int(window))  # recent per-sample losses
        self._size = 0                      # filled part of the ring
        self._next = 0                      # where the next loss goes

    def __len__(self) -> int:
        return self._size

    def threshold(self, q: float) -> float:
        """The loss at or above which a sample ranks in the top ``1 - q`` of the window (0 <= q < 1; nan
        while it is empty), O(window): its q quantile, a value of it, unless that value is tied with
        losses ranked below the quantile, then just above it. A sample is chosen by its rank, the share
        of the window strictly below it: a mass of equal losses (float32 losses of confident predictions
        round to exactly 0, most of a window late in training) would otherwise all sit "at" the quantile
        and all be chosen."""
        if self._size == 0:
            return float("nan")
        history = self._ring[:self._size]
        k = min(int(np.floor(q * history.size)), history.size - 1)
        value = float(np.partition(history, k)[k])
        if np.count_nonzero(history < value) < k:  # value's ties reach below rank k
            value = float(np.nextafter(value, np.inf))
        return value

    def add(self, losses: np.ndarray) -> None:
        """Remember ``losses`` (float (B,), finite), the oldest leaving once the window is full."""
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


class BackpropSelector:
    """Which samples of each batch to backpropagate, by their loss's percentile among recent losses."""

    def __init__(self, share: float, window: int) -> None:
        if not (0.0 < share <= 1.0) or window < 1:
            raise ConfigError(f"BackpropSelector needs 0 < share <= 1 and window >= 1 (sample_priority."
                              f"backprop_share, percentile_window), got {share!r}, {window!r}")
        self.share = float(share)
        self.history = LossWindow(window)  # this worker's recent losses
        self.trained = 0                    # samples backpropagated so far
        self.forward_only = 0               # samples forwarded and not backpropagated

    def select(self, losses: np.ndarray, threshold: float | None = None) -> np.ndarray:
        """A bool mask (B,) over one batch's per-sample losses (float (B,)): True = backpropagate.
        ``threshold``: the cluster's percentile from the plan (``SamplePlan.backprop_threshold``);
        None: this worker's own, over its history with the batch in it. Non-finite losses are never
        chosen (and never enter the history)."""
        losses = np.asarray(losses, dtype=np.float64).ravel()
        finite = np.isfinite(losses)
        self.history.add(losses[finite])
        mask = np.zeros(losses.size, dtype=bool)
        if finite.any():
            if threshold is None:
                threshold = self.history.threshold(1.0 - self.share)
            mask = finite & (losses >= threshold)
            if not mask.any():  # every finite loss below the threshold: train the batch's highest
                mask[np.flatnonzero(finite)[np.argmax(losses[finite])]] = True
        chosen = int(mask.sum())
        self.trained += chosen
        self.forward_only += losses.size - chosen
        return mask

    def rows(self, losses: np.ndarray, threshold: float | None = None) -> np.ndarray:
        """``select`` as the chosen positions, int64 (k,) ascending: the rows to forward again and
        backpropagate when the batch was scored without gradients (``StepScope.backprop_rows``)."""
        return np.flatnonzero(self.select(losses, threshold))
