"""The batch-size rules: shares into integer batch sizes, step time, and each worker's chunk of a step.

One place for the rounding rule, below both the decision records (``NodeDecision.uniform``) and the
node deriver: integer sizes proportional to shares that sum exactly to the global batch (floors and
caps met by water-filling, then largest-remainder rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdml_ray.errors import PlanError


def round_to_batch_sizes(shares: Sequence[float] | np.ndarray, total: int, min_batch: int = 0,
                         max_batch: int | None = None) -> np.ndarray:
    """Integer batch sizes (int64, shape (n,)) proportional to ``shares``, summing exactly to ``total``.

    Floors and caps are met first by water-filling (clamped workers are fixed, the rest share what is
    left in proportion), then fractions are rounded by largest remainder. Requires
    ``n * min_batch <= total <= n * max_batch``; ties in the remainders go to the lower index.
    """
    s = np.asarray(shares, dtype=np.float64)
    n = len(s)
    if n == 0:
        raise PlanError("round_to_batch_sizes needs at least one share (one per worker)")
    if not np.all(np.isfinite(s)) or np.any(s < 0) or s.sum() <= 0:
        raise PlanError(f"shares must be finite, >= 0 and not all zero, got {s.tolist()}")
    cap = total if max_batch is None else max_batch
    if n * min_batch > total or n * cap < total:
        raise PlanError(f"cannot split {total} samples over {n} workers within [{min_batch}, {max_batch}]; "
                        "change min_batch/max_batch or the global batch size")

    # Water-filling: the level T with sum(clip(T * s, lo, cap)) == total. The sum is non-decreasing in
    # T, so bisection finds it; zero shares get a vanishing weight so they only grow when they must.
    s = np.maximum(s / s.max(), 1e-12)
    low, high = 0.0, cap / s.min()
    for _ in range(200):
        mid = 0.5 * (low + high)
        if np.clip(mid * s, min_batch, cap).sum() < total:
            low = mid
        else:
            high = mid
    target = np.clip(high * s, min_batch, cap)

    sizes = np.clip(np.floor(target + 1e-9), min_batch, cap).astype(np.int64)
    short = int(total - sizes.sum())
    if short > 0:  # largest remainder among workers below their cap; stable sort breaks ties by index
        remainder = np.where(sizes < cap, target - sizes, -np.inf)
        sizes[np.argsort(-remainder, kind="stable")[:short]] += 1
    elif short < 0:  # target overshot by rounding noise: take back from the smallest remainders
        remainder = np.where(sizes > min_batch, target - sizes, np.inf)
        sizes[np.argsort(remainder, kind="stable")[:-short]] -= 1
    return sizes


def predicted_step_s(batch_sizes: Sequence[int], rates: Sequence[float] | np.ndarray) -> float:
    """Compute time of a synchronous step: the slowest worker's batch over its rate (seconds)."""
    return max(b / r for b, r in zip(batch_sizes, rates) if b > 0) if sum(batch_sizes) else 0.0


def step_slices(offset: int, batch_sizes: Sequence[int], num_samples: int) -> list[slice]:
    """Each worker's contiguous chunk of a global permutation for the step starting at ``offset``.

    A full step hands out ``sum(batch_sizes)`` positions; the last, partial step of an epoch splits
    what is left in the same proportions (largest remainder), so every position of the permutation
    is used exactly once per epoch whatever the sequence of decisions.
    """
    left = num_samples - offset
    if left <= 0:
        return [slice(offset, offset)] * len(batch_sizes)
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    if sizes.sum() > left:
        sizes = round_to_batch_sizes(np.maximum(sizes, 0) + 1e-12, left)
    bounds = offset + np.concatenate([[0], np.cumsum(sizes)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
