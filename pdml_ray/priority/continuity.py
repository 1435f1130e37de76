"""Continuity check: is a priority vector still a useful distribution, or has it collapsed?

Works on any non-negative priority vector (per sample now; per node or per gradient later). Three
O(N) measures, each in [0, 1]:

- ``normalized_ess = (sum p)^2 / (N sum p^2)``: 1 when all priorities are equal, 1/N when one item
  holds everything. N * normalized_ess is the number of items the distribution effectively covers.
- ``normalized_entropy = H(p / sum p) / log N``: the same story on a log scale (reported, not gated;
  nan where the check judges from sums, see below).
- ``tie_fraction``: share of priorities within relative ``tie_tolerance`` of the median. Whenever
  one tie group holds more than half of the items, the median lies in it, so this is that group's
  share; that is the only regime the check acts on (``max_tie_fraction > 0.5``). Above 2,048 items
  it is counted on 2,048 random items (binomial error under 0.7% near the 90% threshold).

Verdicts. Too **peaked**: ``normalized_ess < min_normalized_ess`` AND ``normalized_ess * N <
min_effective_items`` (the sampler keeps drawing the same handful of items; importance weights of the
rest explode; a rare class of a hundred samples holding most of a large table is not that). Too **flat**: ``normalized_ess >
max_normalized_ess`` AND ``tie_fraction > max_tie_fraction``: the deriver emits the same value for
(almost) everything. A healthy loss distribution is never flagged flat: losses of a model that still
learns differ from sample to sample (ties stay far below 90%), and a narrow but continuous spread,
typical at initialisation, fails the tie test. Zeros are ties too, but a vector of mostly zeros has a
small ESS, so it reads as peaked, not flat.

Why not the percentile test of the source article (share below the 20th percentile >= 0.2): for
continuous data it holds by construction and it can only fail on ties, so it never sees a peak.

Two ways in. ``ContinuityMonitor.check(vector)`` measures a whole vector. For long vectors (>
``max_check_items``) the measures come from a random subsample of that many items: ESS and ties are
means over items and the subsample estimates them without bias in the numerator and denominator (a
ratio estimate), but a peak of a few items is likely missed. ``ContinuityMonitor.check_sums`` judges
from ``sum p`` and ``sum p^2`` that the owner has at hand (SamplePrioritizer: its sum-tree's total and
one pass over the leaves, or a ``RunningSquares`` on a large table): exact at any N, peaks included; ties are then counted only when the
ESS reads flat, and entropy, which needs a log of every item, is not reported (nan).

Keeping ``sum p^2`` at hand. One pass over the items costs ~10-90 us at N = 20,000 (hot to cold
cache) but ~4-8 ms at N = 10^7, longer than a small model's whole step. ``RunningSquares`` keeps the
sum up to date as items change (O(B) per update: the old and new values of the changed items), so a
check is O(1); it recomputes exactly (O(N)) only when the accumulated change could have cost
precision, or after a non-finite sum. SamplePrioritizer uses it on tables of at least
``ContinuityConfig.running_sums_from`` items (below that, a pass per check is the cheaper one).

Recalibration is data (``Recalibration``); the owner of the priorities carries it out, e.g. with
``recalibrate_priorities``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from pdml_ray.config import ContinuityConfig
from pdml_ray.errors import ReportError

logger = logging.getLogger(__name__)

CollapseKind = Literal["flat", "peaked"]


@dataclass(frozen=True, slots=True)
class ContinuityMeasures:
    num_items: int
    """Items measured (the subsample size for long vectors)."""
    normalized_ess: float
    normalized_entropy: float
    """nan when judged from sums (``check_sums``)."""
    tie_fraction: float
    """nan when judged from sums and the ESS is not near 1 (ties cannot make it flat then)."""


@dataclass(frozen=True, slots=True)
class Recalibration:
    """What to do after a collapse: perturb and pull the priorities back, and hold a raised uniform mix."""

    kind: CollapseKind
    noise: float
    """Std of log-normal multiplicative noise: p <- p * exp(noise * z), z ~ N(0, 1)."""
    reset_fraction: float
    """Geometric pull towards the prior: p <- p^(1-f) * prior^f."""
    uniform_mix: float
    """Uniform mix to sample with until ``until_step`` (the owner uses max(its own mix, this))."""
    until_step: int
    """First step at which the normal mix applies again."""


@dataclass(frozen=True, slots=True)
class ContinuityVerdict:
    step: int
    healthy: bool
    collapse: CollapseKind | None
    measures: ContinuityMeasures
    reason: str
    recalibration: Recalibration | None = None


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a * b) of two 1-D float arrays in numpy's own loop. BLAS's dot wakes its thread pool for
    long vectors: between training steps on 2 cores that wake-up measured ~60 us at N = 20,000, six
    times the arithmetic itself."""
    return float(np.einsum("i,i->", a, b))


class RunningSum:
    """``sum p`` of a non-negative vector, updated with the items that change: O(B) per change, O(1) to read.

    Rounding: each update adds ``sum new`` and subtracts ``sum old``; the error of the running sum
    is at most ~B * 2^-53 times the total magnitude added and removed since the last exact sum (the
    ``churn``). When the churn exceeds ``2^20`` times the current sum (e.g. a peak of huge values
    came and went), ``value`` reads None and the owner recomputes with ``reset`` (O(N)); that keeps
    the relative error below ~1e-7 for batches up to 10^3 items, so the sum never drifts however
    long the vector lives. A healthy table churns ~2B/N of its sum per update, so at N = 20,000 and
    B = 640 that happens every ~10^7 updates."""

    CHURN_LIMIT = float(1 << 20)

    def __init__(self) -> None:
        self.total = 0.0
        self.churn = math.inf  # no exact sum yet: ``value`` is None until ``reset``
        self.resets = 0

    def _sum(self, values: np.ndarray) -> float:
        return float(np.sum(values))  # pairwise summation; an overflow is a silent inf, like the dots below

    def reset(self, values: np.ndarray) -> None:
        """The exact sum over ``values`` (shape (N,)): O(N)."""
        with np.errstate(over="ignore"):
            self.total = self._sum(np.asarray(values, dtype=np.float64))
        self.churn = 0.0
        self.resets += 1

    def replace(self, old: np.ndarray, new: np.ndarray) -> None:
        """Items with values ``old`` (float64 (B,), each item once) now hold ``new`` (float64 (B',)): an
        item that enters has no old value, one that leaves no new one."""
        with np.errstate(over="ignore"):
            added, removed = self._sum(new), self._sum(old)
        self.total += added - removed
        self.churn += added + removed

    @property
    def value(self) -> float | None:
        """The running sum, or None when it must be recomputed (``reset``): never computed, non-finite,
        negative after cancellation, or too much churn for its precision."""
        s = self.total
        if not (math.isfinite(s) and math.isfinite(self.churn)) or s < 0.0 or self.churn > self.CHURN_LIMIT * s:
            return None
        return s


class RunningSquares(RunningSum):
    """``sum p^2`` of a priority vector, kept like ``RunningSum`` (the same rounding bound and churn rule)."""

    def _sum(self, values: np.ndarray) -> float:
        # np.vdot (BLAS, single-threaded below 10,000 items) is the cheapest call here and, like
        # einsum, leaves an overflow as a silent inf, which ``value`` turns into a recomputation.
        return float(np.vdot(values, values)) if values.size < 10_000 else dot(values, values)

    @property
    def square(self) -> float:
        """The running sum of squares as it stands (``value`` says whether it can be trusted)."""
        return self.total


def normalized_ess(num_items: int, total: float, square: float) -> float:
    """``(sum p)^2 / (N sum p^2)`` from the two sums; 1.0 (uniform) for one item or an all-zero vector.

    Raises ReportError for a NaN, infinite or negative sum: priorities that produce one are broken, and
    reading them as "uniform" would call a poisoned table flat (and recalibrate it)."""
    if not (math.isfinite(total) and math.isfinite(square) and total >= 0.0 and square >= 0.0):
        raise ReportError(f"continuity: sum of priorities {total!r} and of their squares {square!r} must be finite "
                          "and >= 0; the priorities hold a NaN, an infinite or a negative value")
    if num_items <= 1 or not total > 0.0 or not square > 0.0:
        return 1.0
    return min(total / num_items * (total / square), 1.0)  # in this order: no overflow of total^2


def tie_fraction(priorities: np.ndarray, tie_tolerance: float, rng: np.random.Generator) -> float:
    """Share of ``priorities`` within relative ``tie_tolerance`` of their median, counted on <= 2048
    random items (binomial error < 0.7% at the 90% threshold). It only has to resolve a tie group
    holding > 1/2 of the items, and sorting all N would dominate the cost of a check.
    (np.sort, not np.partition: introselect slows down ~10x on the many equal values of a collapse.)"""
    p = np.asarray(priorities, dtype=np.float64).ravel()
    sub = np.sort(p if p.size <= 2048 else p[rng.integers(0, p.size, size=2048)])
    ref = float(sub[sub.size // 2])
    lo = np.searchsorted(sub, ref * (1.0 - tie_tolerance), side="left")
    hi = np.searchsorted(sub, ref * (1.0 + tie_tolerance), side="right")
    return float((hi - lo) / sub.size)


def measure(priorities: np.ndarray, *, tie_tolerance: float = 1e-3, max_items: int | None = None,
            rng: np.random.Generator | None = None) -> ContinuityMeasures:
    """The three measures of a priority vector (shape (N,), finite, >= 0). O(N), or O(max_items)."""
    p = np.asarray(priorities, dtype=np.float64).ravel()
    if p.size == 0:
        raise ReportError("continuity.measure: empty priority vector (give one priority per item)")
    rng = rng if rng is not None else np.random.default_rng(0)
    if max_items is not None and p.size > max_items:
        p = p[rng.integers(0, p.size, size=max_items)]  # with replacement: O(max_items), unbiased means
    if not (np.all(np.isfinite(p)) and p.min() >= 0.0):
        raise ReportError("continuity.measure: priorities must be finite and >= 0")
    n = p.size
    total = float(p.sum())
    if n == 1 or total <= 0.0:  # one item, or all zero: nothing to prefer, i.e. uniform
        return ContinuityMeasures(n, 1.0, 1.0, 1.0)
    with np.errstate(over="ignore"):
        square = dot(p, p)
    if not math.isfinite(square) or not math.isfinite(total):  # huge priorities: rescale (rare extra pass)
        p = p / p.max()
        total, square = float(p.sum()), dot(p, p)
    # H(p / S) = log S - sum(p log p) / S, with 0 log 0 = 0: zeros meet a finite log and vanish
    # (cheaper than compressing out the zeros or a masked log).
    plogp = dot(p, np.log(np.maximum(p, 1e-300)))
    entropy = (math.log(total) - plogp / total) / math.log(n)
    return ContinuityMeasures(n, normalized_ess(n, total, square), min(max(entropy, 0.0), 1.0),
                              tie_fraction(p, tie_tolerance, rng))


class ContinuityMonitor:
    """Judges priority vectors against ContinuityConfig and counts collapses; logs each one."""

    def __init__(self, config: ContinuityConfig | None = None, seed: int = 0, name: str = "priorities") -> None:
        self.config = config if config is not None else ContinuityConfig()
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.checks = 0
        self.collapsed_flat = 0
        self.collapsed_peaked = 0
        self.last: ContinuityVerdict | None = None

    def due(self, step: int, last_checked: int | None) -> bool:
        """Whether a check is due at ``step`` given the step of the last one: every ``check_interval``
        steps, also when callers skip steps (a scheduler folds in several steps' feedback at once)."""
        return last_checked is None or step - last_checked >= self.config.check_interval

    def check(self, priorities: np.ndarray, step: int) -> ContinuityVerdict:
        """Judge a whole priority vector: O(N), or O(max_check_items) for a longer one."""
        cfg = self.config
        return self._judge(measure(priorities, tie_tolerance=cfg.tie_tolerance, max_items=cfg.max_check_items,
                                   rng=self.rng), step)

    def check_sums(self, num_items: int, total: float, square: float, step: int,
                   tie_items: Callable[[], np.ndarray]) -> ContinuityVerdict:
        """Judge from ``sum p`` and ``sum p^2`` over ``num_items`` items, for owners that have those sums
        cheaply (SamplePrioritizer: the sum-tree's root and one pass over its leaves or a running sum).

        Exact for any N, peaks included (a random subsample would miss a peak of a few items). The tie
        fraction only decides between healthy and flat when the ESS already reads flat, so only then is
        ``tie_items()`` called, for a uniform subsample of the items (valid there: a nearly uniform
        vector has no peak to miss); otherwise it is reported as nan, and so is the entropy, which
        needs a pass over all items.
        """
        ess = normalized_ess(num_items, total, square)
        ties = math.nan
        if ess > self.config.max_normalized_ess:
            ties = tie_fraction(tie_items(), self.config.tie_tolerance, self.rng)
        return self._judge(ContinuityMeasures(num_items, ess, math.nan, ties), step)

    def _judge(self, m: ContinuityMeasures, step: int) -> ContinuityVerdict:
        cfg = self.config
        self.checks += 1
        collapse: CollapseKind | None = None
        if m.normalized_ess < cfg.min_normalized_ess and m.normalized_ess * m.num_items < cfg.min_effective_items:
            collapse = "peaked"
            self.collapsed_peaked += 1
            reason = (f"normalized ESS {m.normalized_ess:.3g} < min_normalized_ess {cfg.min_normalized_ess:.3g}: "
                      f"the distribution covers about {m.normalized_ess * m.num_items:.3g} of {m.num_items} items "
                      f"(< min_effective_items {cfg.min_effective_items:g})")
        elif m.normalized_ess > cfg.max_normalized_ess and m.tie_fraction > cfg.max_tie_fraction:
            collapse = "flat"
            self.collapsed_flat += 1
            reason = (f"normalized ESS {m.normalized_ess:.6f} > {cfg.max_normalized_ess} and "
                      f"{m.tie_fraction:.1%} of priorities tied (> {cfg.max_tie_fraction:.0%})")
        else:
            reason = "healthy"  # the measures are in the verdict; formatting them each time cost more than the check

        recal = None
        if collapse is not None:
            recal = Recalibration(kind=collapse, noise=cfg.noise, reset_fraction=cfg.reset_fraction,
                                  uniform_mix=cfg.recalibration_mix, until_step=step + cfg.recalibration_steps)
            logger.warning("continuity: %s collapsed %s at step %d (%s); recalibration: noise %.3g, "
                           "reset %.2f towards prior, uniform mix %.2f until step %d", self.name, collapse, step,
                           reason, recal.noise, recal.reset_fraction, recal.uniform_mix, recal.until_step)
        self.last = ContinuityVerdict(step=step, healthy=collapse is None, collapse=collapse, measures=m,
                                      reason=reason, recalibration=recal)
        return self.last


def recalibrate_priorities(priorities: np.ndarray, recal: Recalibration, rng: np.random.Generator,
                           prior: float | None = None) -> np.ndarray:
    """New priorities after ``recal``: geometric pull towards ``prior`` (default: the median of the
    positive priorities), then log-normal noise. Zeros stay zero; shape and dtype float64 as input.
    Raises ReportError for a NaN, infinite or negative priority or prior (nothing is computed then)."""
    p = np.asarray(priorities, dtype=np.float64)
    if p.size and not (np.all(np.isfinite(p)) and p.min() >= 0.0):
        raise ReportError("recalibrate_priorities: priorities must be finite and >= 0")
    if prior is not None and not (math.isfinite(prior) and prior > 0.0):
        raise ReportError(f"recalibrate_priorities: prior must be finite and > 0, got {prior!r}")
    out = p.copy()
    pos = p > 0
    if not pos.any():
        return out
    if prior is None:
        prior = float(np.median(p[pos]))
    f = recal.reset_fraction
    logp = np.log(p[pos])
    logp = (1.0 - f) * logp + f * math.log(prior)
    if recal.noise > 0:
        logp = logp + recal.noise * rng.standard_normal(logp.shape)
    out[pos] = np.exp(logp)
    return out
