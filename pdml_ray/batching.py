"""The batch-size rules: shares into integer batch sizes, step time, and each worker's chunk of a step.

One place for the rounding rule, below both the decision records (``NodeDecision.uniform``) and the
node deriver: integer sizes proportional to shares that sum exactly to the global batch (floors and
caps met by water-filling, then largest-remainder rounding). And one place for the step-time model
the node deriver balances: worker i computes a batch of b samples in ``c_i + b / r_i`` seconds (a
fixed cost per step plus a per-sample rate); ``balance_affine`` splits the global batch so that the
slowest worker is as fast as it can be, ``predicted_step_s`` is that model's step time.
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

    # Water-filling: sizes clip(T * s, lo, cap) at the level T where they sum to total (exact, O(n log n));
    # zero shares get a vanishing weight so they only grow when they must.
    s = np.maximum(s / s.max(), 1e-12)
    target = _water_fill(np.zeros(n), s, total, float(min_batch), float(cap))

    sizes = np.clip(np.floor(target + 1e-9), min_batch, cap).astype(np.int64)
    short = int(total - sizes.sum())
    if short > 0:  # largest remainder among workers below their cap; stable sort breaks ties by index
        remainder = np.where(sizes < cap, target - sizes, -np.inf)
        sizes[np.argsort(-remainder, kind="stable")[:short]] += 1
    elif short < 0:  # target overshot by rounding noise: take back from the smallest remainders
        remainder = np.where(sizes > min_batch, target - sizes, np.inf)
        sizes[np.argsort(remainder, kind="stable")[:-short]] -= 1
    return sizes


def balance_affine(fixed_s: Sequence[float] | np.ndarray, rates: Sequence[float] | np.ndarray, total: int,
                   min_batch: int = 0, max_batch: int | None = None) -> np.ndarray:
    """Real-valued batch sizes (float64, shape (n,)) summing to ``total`` that minimise the step time
    ``max_i fixed_s[i] + b_i / rates[i]`` within ``[min_batch, max_batch]``.

    Water-filling on the level T: ``b_i(T) = clip(rates[i] * (T - fixed_s[i]), min_batch, max_batch)``
    with ``sum_i b_i(T) == total``. The sum is piecewise linear and non-decreasing in T, so T is found
    exactly between two of its breakpoints. Workers that reach the level have equal predicted step
    times; a worker whose fixed cost alone exceeds the level keeps ``min_batch``. With all fixed costs
    zero the sizes are proportional to the rates (what ``round_to_batch_sizes`` water-fills).
    ``round_to_batch_sizes(b / total, total, min_batch, max_batch)`` turns the result into integers.
    """
    c = np.asarray(fixed_s, dtype=np.float64)
    r = np.asarray(rates, dtype=np.float64)
    n = len(r)
    if n == 0 or len(c) != n:
        raise PlanError(f"balance_affine needs one fixed cost and one rate per worker, got {len(c)} and {n}")
    if not (np.all(np.isfinite(r)) and np.all(r > 0) and np.all(np.isfinite(c)) and np.all(c >= 0)):
        raise PlanError(f"rates must be finite and > 0, fixed costs finite and >= 0; got rates {r.tolist()}, "
                        f"fixed costs {c.tolist()}")
    cap = float(total if max_batch is None else max_batch)
    lo = float(min_batch)
    if n * lo > total or n * cap < total:
        raise PlanError(f"cannot split {total} samples over {n} workers within [{min_batch}, {max_batch}]; "
                        "change min_batch/max_batch or the global batch size")

    return _water_fill(c, r, total, lo, cap)


def _water_fill(c: np.ndarray, r: np.ndarray, total: int, lo: float, cap: float) -> np.ndarray:
    """``b_i = clip(r_i * (T - c_i), lo, cap)`` at the level T where ``sum(b) == total`` (bounds already
    checked). The sum is piecewise linear and non-decreasing in T with breakpoints where a worker leaves
    its floor (``a_i = c_i + lo / r_i``) or reaches its cap (``e_i = c_i + cap / r_i``); it is evaluated
    at every breakpoint at once from sorted cumulative sums (O(n log n)), then T is found exactly
    between the two that bracket ``total``."""
    n = len(r)
    a, e = c + lo / r, c + cap / r
    levels = np.unique(np.concatenate([a, e]))
    order_a, order_e = np.argsort(a, kind="stable"), np.argsort(e, kind="stable")
    ra, rca = np.concatenate([[0.0], np.cumsum(r[order_a])]), np.concatenate([[0.0], np.cumsum((r * c)[order_a])])
    re, rce = np.concatenate([[0.0], np.cumsum(r[order_e])]), np.concatenate([[0.0], np.cumsum((r * c)[order_e])])
    ka = np.searchsorted(a[order_a], levels, side="right")  # workers off their floor at each level
    ke = np.searchsorted(e[order_e], levels, side="right")  # workers at their cap
    active_r, active_rc = ra[ka] - re[ke], rca[ka] - rce[ke]
    sums = lo * (n - ka) + cap * ke + levels * active_r - active_rc
    sums = np.maximum.accumulate(sums)  # monotone despite rounding
    k = int(np.searchsorted(sums, total, side="left"))  # first breakpoint whose sum reaches total
    if k == 0:
        level = float(levels[0])
    elif k == len(levels):  # every worker at its cap (the sum fell short by rounding)
        level = float(levels[-1])
    else:  # linear between breakpoints k - 1 and k
        t0, t1, s0, s1 = levels[k - 1], levels[k], sums[k - 1], sums[k]
        level = float(t0 + (total - s0) * (t1 - t0) / (s1 - s0)) if s1 > s0 else float(t1)
    b = np.clip(r * (level - c), lo, cap)
    # Rounding noise: hand the last fraction to the workers strictly inside their bounds.
    free = (b > lo) & (b < cap)
    short = total - b.sum()
    if free.any() and short != 0.0:
        b[free] += short * r[free] / r[free].sum()
        b = np.clip(b, lo, cap)
    return b


def predicted_step_s(batch_sizes: Sequence[int] | np.ndarray, rates: Sequence[float] | np.ndarray,
                     fixed_s: Sequence[float] | np.ndarray | None = None) -> float:
    """Compute time of a synchronous step under the affine model: ``max_i fixed_s[i] + b_i / rates[i]``
    over the workers with a non-empty batch (seconds; no fixed costs: the slowest batch over its rate)."""
    fixed = [0.0] * len(batch_sizes) if fixed_s is None else fixed_s
    times = [c + b / r for b, r, c in zip(batch_sizes, rates, fixed) if b > 0]
    return float(max(times)) if times else 0.0


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
