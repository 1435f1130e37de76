"""Sample priorities: draw each step's global batch by per-sample loss, with importance weights.

This module holds the table (``SamplePrioritizer``: scores, feedback, staleness, continuity,
checkpoints) and its stats record; the distribution p, the draws and the plans with their importance
weights are its drawing half (``SampleDraws``, ``pdml_ray.priority.sample_draws``), and the
scheduler's "sample" deriver around one table is ``pdml_ray.priority.sample_deriver``.

Bad input. Per-sample losses are checked whole before anything is written (``feedback_problem``):
indices in [0, N), and no loss above ``max_loss``, the largest whose weight s^alpha keeps every sum
over the table finite (1e300 / N, to the power 1 / alpha for alpha > 1). The scheduler runs the same
check per report (``SamplePriorityDeriver.report_rejection``), so a refused report is counted and the
rest of its batch applied; a checkpoint's scores are checked the same way before they are loaded.

Robust scores. A loss that passes is still clipped where it enters, to ``CLIP_FACTOR`` (10^6) times
the table's robust scale: the median of up to ``SCALE_ITEMS`` (256) scores of seen samples drawn at
random (with the batch's own losses while fewer than 64 samples are seen; the mean where the median
is 0). One diverged loss (1e18 among losses near 1) then enters as the highest score, drawn first
and replaced by its next loss, instead of holding every digit of the table's sums. Scores are never negative (a negative loss
counts as 0, the staleness decay is a convex mix of two non-negative numbers) and never above
``max_loss``, so the decay cannot make an update fail and every state the table saves loads back.
The sum of scores (the mean the decay and the gradient deriver read) is a ``RunningSum``: updated
with each batch, and recomputed from the scores (O(N)) whenever the magnitude it has taken in and
given out since its last exact sum could have cost it precision, so it cannot drift; the sum-tree
recomputes its internal sums from their children on every write.

Staleness. Scores not refreshed for ``stale_after`` steps decay towards the mean score:
``s <- mean + (s - mean) * (1 - staleness_decay)^steps``. The decay is applied in sweeps over a
cursor that visits N / stale_after samples per step, so each sample is touched once per
``stale_after`` steps and a step costs O((N / stale_after) log N), not O(N).

Epochs. Under priority sampling an epoch is N draws (``stats()['epoch']``), not one pass over every
sample: some samples are drawn many times in an epoch and some not at all. When sample priorities
are off (``PDMLConfig.sample_priority is None``) none of this code runs; the uniform seeded
permutation path is used instead.

Continuity. Every ``continuity.check_interval`` steps the priority part of the distribution
(s^alpha over the seen samples; the uniform floor is ours and would mask a collapse of the scores)
goes through ``ContinuityMonitor.check_sums``: the tree's total and the sum of squares of its leaves
give the exact normalised ESS, peaks included, at any N. The sum of squares is one pass over the
leaves per check (O(N); ~70 us at N = 20,000 between training steps), or, for tables of at least
``continuity.running_sums_from`` items, a running sum kept up to date with every tree write
(``RunningSquares``: O(B) per update, O(1) per check; a pass costs 4-8 ms at N = 10^7). Its
bookkeeping counts as continuity cost (``continuity_seconds``, ``continuity_update_seconds``). On a collapse the scores are perturbed and
pulled towards their median (O(N), only on a collapse), and the uniform mix is raised for
``recalibration_steps`` steps.
A collapse seen again while that raised mix holds is counted but not acted on twice.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from pdml_ray.config import ContinuityConfig, SamplePriorityConfig
from pdml_ray.errors import ConfigError, ReportError, StateError
from pdml_ray.priority.continuity import (ContinuityMonitor, ContinuityVerdict, RunningSquares, RunningSum, dot,
                                          recalibrate_priorities)
from pdml_ray.priority.estimators import EMA, median
from pdml_ray.priority.sample_draws import SampleDraws
from pdml_ray.priority.sample_modes import irreducible_problem, mode_rule
from pdml_ray.priority.sample_stats import SampleStats
from pdml_ray.priority.sample_switch import PaySwitch
from pdml_ray.priority.selective_backprop import LossWindow
from pdml_ray.priority.sumtree import SumTree

CLIP_FACTOR = 1e6
"""A loss enters the table as at most this many times the table's robust scale (module docstring): a
peak of a million times the median still enters whole (judging peaks is the continuity check's job),
and a loss beyond it is a diverged one."""
SCALE_ITEMS = 256
"""Seen scores sampled for the robust scale: the median of 256 draws is within ~6 percentile points."""
_SCALE_MIN_SEEN = 64
"""Below this many sampled seen scores the batch's own losses join the scale's reference."""

_MAX_MASS = 1e300
"""Largest total sampling mass (sum of s^alpha, and sum of scores) the table lets in: below float64's
overflow with room for the unseen group's mass, so no sum the sampler or a checkpoint holds is inf."""


class SamplePrioritizer(SampleDraws):
    """The cluster-wide per-sample score table and the sampler built on it (pure numpy, no Ray)."""

    def __init__(self, num_samples: int, config: SamplePriorityConfig | None = None,
                 continuity: ContinuityConfig | None = None, seed: int = 0) -> None:
        if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise ConfigError(f"SamplePrioritizer needs num_samples >= 1 (the data set size), got {num_samples!r}")
        self.num_samples = n = int(num_samples)
        self.config = config if config is not None else SamplePriorityConfig()
        self.rule = mode_rule(self.config.mode)
        self.switch = PaySwitch(self.config.pay_threshold)
        self.switch_rng = np.random.default_rng(seed + 5)     # the pay switch's sample (not the draws' stream)
        # (N,) irreducible loss per sample (rho-loss; 0 where none was given): the score is loss minus it
        self.irreducible = np.zeros(n) if self.rule.reducible else None
        self._irreducible_mean = 0.0 if self.irreducible is not None else float("nan")  # kept for stats(): O(1)
        # selective-backprop: the cluster's recent losses, whose percentile the plans hand out (not saved:
        # a resumed run refills it from the next reports)
        self.recent_losses = (LossWindow(self.config.percentile_window) if self.config.mode == "selective-backprop"
                              else None)
        self.monitor = ContinuityMonitor(continuity, seed=seed + 1, name="sample priorities") if continuity else None
        self.rng = np.random.default_rng(seed)
        self.scale_rng = np.random.default_rng(seed + 3)      # the robust scale's sample (not the draws' stream)
        # (N,) per-sample scores, valid where seen: the newest loss, or an EMA of the losses
        self._scores = EMA(n, self.config.score_ema if self.config.score == "loss_ema" else 1.0, prior=0.0)  # 0 unseen
        self.last_step = np.zeros(n, dtype=np.int64)          # (N,) step of the last loss for the sample
        self.tree = SumTree(n, 0.0)                           # s^alpha of seen samples, 0 for unseen
        self._unseen_list = np.arange(n, dtype=np.int64)      # superset of the unseen samples
        self.unseen_count = n
        self.max_score = 0.0                                  # M: the score unseen samples get
        self._score_sum = RunningSum()                        # sum of seen scores (for the mean); unseen are 0
        self._score_sum.reset(np.zeros(0))
        self.clipped = 0                                      # losses clipped to the robust cap so far
        self.skipped_losses = 0                               # losses left out while priority draws were off
        self.recal_mix = 0.0
        self.recal_until = -1
        self._chunk = math.ceil(n / self.config.stale_after)  # samples the staleness sweep visits per step
        self._cycle = math.ceil(n / self._chunk)              # steps for one full sweep
        self._cursor = 0
        self._last_sweep_step: int | None = None
        self._last_check_step: int | None = None
        self.samples_drawn = 0
        self.recalibrations = 0
        self.uniform_fallbacks = 0
        self.distinct_shortfalls = 0  # replacement=False plans larger than the data set (drawn with repeats)
        # The largest loss the table takes: every score's s^alpha, and the sums over N of them, stay finite.
        a = self.config.exponent
        self.max_loss = _MAX_MASS / n if a <= 1.0 else (_MAX_MASS / n) ** (1.0 / a)
        self.check_seconds = 0.0                              # wall time of continuity checks + bookkeeping (s)
        self.squares_seconds = 0.0                            # the bookkeeping part of check_seconds (s)
        # Running sum of squared tree leaves for the check's ESS, on large tables only (None: a pass per check)
        self.squares: RunningSquares | None = None
        if self.monitor is not None and n >= self.monitor.config.running_sums_from:
            self.squares = RunningSquares()
            self.squares.reset(np.zeros(0))                   # the tree starts all zero
        self.recalibration_seconds = 0.0                      # wall time of recalibrations (s), O(N) each
        self._last_mix = self.config.uniform_mix
        self._last_beta = self.beta(0)

    @property
    def scores(self) -> np.ndarray:
        """(N,) float64 scores; meaningful where ``seen``."""
        return self._scores.values

    @property
    def seen(self) -> np.ndarray:
        """(N,) bool: the sample has reported a loss at least once."""
        return self._scores.measured

    @property
    def seen_sum(self) -> float:
        """Sum of the seen samples' scores (the unseen hold 0), to the precision of an exact sum."""
        total = self._score_sum.value
        if total is None:
            self._score_sum.reset(self.scores)  # O(N), rare: after a huge score came and went
            total = self._score_sum.total
        return total

    # ------------------------------------------------------------------ distribution (p, draws: SampleDraws)
    def _weight(self, scores: np.ndarray | float) -> np.ndarray:
        return np.power(scores, self.config.exponent, dtype=np.float64)

    # ------------------------------------------------------------------ feedback
    def set_irreducible_losses(self, indices: np.ndarray, losses: np.ndarray) -> None:
        """rho-loss: the irreducible-loss model's loss on samples ``indices`` (int (K,), float (K,), finite,
        >= 0); a sample's score is then max(loss - irreducible, 0). Samples never given one count 0."""
        if self.irreducible is None:
            raise ConfigError(f"set_irreducible_losses needs sample_priority.mode='rho-loss', this table's mode is "
                              f"{self.config.mode!r}")
        idx = np.asarray(indices, dtype=np.int64).ravel()
        il = np.asarray(losses, dtype=np.float64).ravel()
        if idx.shape != il.shape or (idx.size and (idx.min() < 0 or idx.max() >= self.num_samples)):
            raise ReportError(f"set_irreducible_losses: one loss per index, indices in [0, {self.num_samples}); got "
                              f"{idx.size} indices and {il.size} losses")
        problem = irreducible_problem(il)
        if problem is not None:
            raise ReportError(f"set_irreducible_losses: {problem}")
        self.irreducible[idx] = il
        self._irreducible_mean = float(self.irreducible.mean())

    def note_step_seconds(self, seconds: float) -> None:
        """A training step's wall time (s), the pay switch's cost reference."""
        self.switch.note_step_seconds(seconds)

    def update(self, indices: np.ndarray, losses: np.ndarray, step: int) -> ContinuityVerdict | None:
        """Record per-sample losses from ``step`` (int (B,), float (B,)). Duplicates: the last one wins.

        Non-finite losses are dropped; negative ones count as 0 (a score is a sampling weight); a loss
        above ``max_loss`` (its weight or the table's sums would overflow) refuses the whole update with
        ReportError before anything is written (``feedback_problem``). Under rho-loss the score is the
        loss minus the sample's irreducible loss. Returns the continuity verdict if a check ran at this
        step. Its wall time counts as selection cost (the pay switch's). While the pay switch has
        priority draws off, the plans of intervals no probe measures ask for no losses
        (``SamplePlan.feedback``, counted in ``skipped_losses``); any reported anyway are checked and
        skipped (``PaySwitch.wants_losses``).
        """
        t0 = time.perf_counter()
        try:
            return self._ingest(indices, losses, step)
        finally:
            self.switch.record_selection(time.perf_counter() - t0, step=step)

    def _measure(self, idx: np.ndarray, loss: np.ndarray, step: int) -> None:
        """The pay switch's yardstick for these losses (the reducible ones under rho-loss), read before
        they are written: l / (N p) and s / (N p) of each (s: the sample's score, the unseen at the score
        they are drawn at; p: its draw probability in the interval holding ``step``, 1 / N where it drew
        uniformly) and the table's mean score, the control variate's known mean (``sample_switch``)."""
        priority = self.switch.current_priority(step)
        if priority is None:
            return
        seen = self.num_samples - self.unseen_count
        unseen = (self.seen_sum / seen if seen else 0.0) if self.config.unseen_score == "mean" else self.max_score
        table_mean = (self.seen_sum + self.unseen_count * unseen) / self.num_samples
        scores = np.where(self.seen[idx], self.scores[idx], unseen)
        relative_p = self.num_samples * self.probabilities(idx, step) if priority else 1.0
        self.switch.record_losses(step, loss / relative_p, scores / relative_p, table_mean)

    def _ingest(self, indices: np.ndarray, losses: np.ndarray, step: int) -> ContinuityVerdict | None:
        idx = np.asarray(indices, dtype=np.int64).ravel()
        loss = np.asarray(losses, dtype=np.float64).ravel()
        problem = self.feedback_problem(idx, loss)
        if problem is not None:
            raise ReportError(f"update: {problem}")
        if not self.switch.wants_losses(step):  # priority off, no probe measuring: checked, nothing to score
            return None  # (counted in skipped_losses when planned: the plan did not ask for them)
        ok = np.isfinite(loss)
        idx, loss = idx[ok], np.maximum(loss[ok], 0.0)
        if self.recent_losses is not None:
            self.recent_losses.add(loss)
        if self.irreducible is not None:  # rho-loss: the reducible part, never below 0
            loss = np.maximum(loss - self.irreducible[idx], 0.0)
        if self.switch.threshold is not None and self.rule.prioritised and idx.size:
            self._measure(idx, loss, step)
        if idx.size:
            cap = self.score_cap(loss)
            self.clipped += int(np.count_nonzero(loss > cap))
            loss = np.minimum(loss, cap)
            uniq, first_rev = np.unique(idx[::-1], return_index=True)
            loss = loss[::-1][first_rev]
            was_seen = self.seen[uniq]
            old = self.scores[uniq]
            self._scores.update(uniq, loss)
            new = self.scores[uniq]
            self._score_sum.replace(old, new)  # an unseen sample's old score is 0
            self.last_step[uniq] = step
            self.unseen_count -= int(np.count_nonzero(~was_seen))
            self.max_score = max(self.max_score, float(new.max()))
            # The leaves before the write are s^alpha of the seen, 0 of the unseen (whose scores are 0):
            # for alpha = 1 they are ``old``, at hand (no second gather from a table beyond the cache).
            self._set_weights(uniq, self._weight(new), old if self.config.exponent == 1.0 else None)
            if self.unseen_count and self.unseen_count * 2 < self._unseen_list.size:
                self._unseen_list = self._unseen_list[~self.seen[self._unseen_list]]
        if self.config.staleness_decay > 0:
            self._decay_stale(step)
        if self.monitor is not None and self.monitor.due(step, self._last_check_step):
            self._last_check_step = step
            t0, recal_before = time.perf_counter(), self.recalibration_seconds
            verdict = self.check(step)
            self.check_seconds += time.perf_counter() - t0 - (self.recalibration_seconds - recal_before)
            return verdict
        return None

    def feedback_problem(self, indices: np.ndarray, losses: np.ndarray) -> str | None:
        """Why per-sample feedback (int (B,), float (B,)) must not enter the table, or None. Checked in
        full before ``update`` writes anything, and by the scheduler per report."""
        if indices.shape != losses.shape:
            return f"{indices.size} indices vs {losses.size} losses; pass one loss per index"
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_samples):
            return f"sample indices must lie in [0, {self.num_samples}) (positions in the data set)"
        with np.errstate(invalid="ignore"):
            too_large = losses[np.isfinite(losses)] > self.max_loss
        if too_large.any():
            return (f"a per-sample loss of {float(losses[np.isfinite(losses)][too_large][0]):.4g} exceeds "
                    f"{self.max_loss:.4g}, the largest this table takes at sample_priority.exponent="
                    f"{self.config.exponent:g} over {self.num_samples} samples (its weight would overflow); the "
                    "worker's loss diverged or is not a per-sample loss")
        return None

    def score_cap(self, losses: np.ndarray) -> float:
        """The largest score a loss of this batch (float (B,), finite, >= 0) may set: ``CLIP_FACTOR`` times
        the median of ``SCALE_ITEMS`` seen scores at random (with the batch's own losses while fewer than
        ``_SCALE_MIN_SEEN`` are seen; the mean where the median is 0), or ``max_loss`` while there is no
        scale (every reference value 0). O(SCALE_ITEMS + B)."""
        sub = self.scale_rng.integers(0, self.num_samples, size=SCALE_ITEMS)
        ref = self.scores[sub[self.seen[sub]]]
        if ref.size < _SCALE_MIN_SEEN:
            ref = np.concatenate([ref, losses])
        scale = median(ref)
        if not scale > 0.0:
            scale = float(ref.mean())
        return min(CLIP_FACTOR * scale, self.max_loss) if scale > 0.0 else self.max_loss

    def _decay_stale(self, step: int) -> None:
        if self._last_sweep_step is None:
            self._last_sweep_step = step
            return
        steps = min(step - self._last_sweep_step, self._cycle)
        if steps <= 0:
            return
        self._last_sweep_step = step
        count = min(steps * self._chunk, self.num_samples)
        idx = (self._cursor + np.arange(count, dtype=np.int64)) % self.num_samples
        self._cursor = int((self._cursor + count) % self.num_samples)
        idx = np.sort(idx[self.seen[idx]])
        overdue = step - self.last_step[idx] - self.config.stale_after
        idx, overdue = idx[overdue > 0], overdue[overdue > 0]
        seen_total = self.num_samples - self.unseen_count
        if idx.size == 0 or seen_total == 0:
            return
        mean = min(max(self.seen_sum / seen_total, 0.0), self.max_loss)
        # Decay for the steps since the previous visit (one cycle ago) or since the score went stale:
        # a convex mix of the score and the mean, both in [0, max_loss] (clipped for rounding's sake).
        factor = np.power(1.0 - self.config.staleness_decay, np.minimum(overdue, self._cycle))
        old = self.scores[idx]
        new = np.clip(mean + (old - mean) * factor, 0.0, self.max_loss)
        self._score_sum.replace(old, new)
        self.scores[idx] = new
        self._set_weights(idx, self._weight(new), old if self.config.exponent == 1.0 else None)

    def _set_weights(self, indices: np.ndarray, weights: np.ndarray, old: np.ndarray | None = None) -> None:
        """Write s^alpha of distinct ``indices`` into the tree, keeping the running sum of squares (the
        continuity check's) up to date: O(B), timed as continuity cost. ``old``: the leaves' values
        before the write if the caller has them (else they are read from the tree)."""
        if self.squares is not None:
            t0 = time.perf_counter()
            self.squares.replace(self.tree.levels[-1][indices] if old is None else old, weights)
            dt = time.perf_counter() - t0
            self.squares_seconds += dt
            self.check_seconds += dt
        self.tree.update(indices, weights, unique=True)

    def _set_all_weights(self, weights: np.ndarray) -> None:
        """Replace every leaf (O(N), recalibration and restore only) and recompute the sum of squares."""
        self.tree.set_all(weights)
        if self.squares is not None:
            self.squares.reset(self.tree.leaves)

    # ------------------------------------------------------------------ continuity
    def check(self, step: int) -> ContinuityVerdict | None:
        """Run the continuity check now on s^alpha of the seen samples; recalibrate on a collapse."""
        if self.monitor is None:
            return None
        seen = self.num_samples - self.unseen_count
        if seen < 16:  # too little feedback yet to judge a distribution
            return None
        # Sums over the tree's leaves (0 for unseen samples) are sums over the seen.
        total, square = self.tree.total, self.leaf_square_sum()
        if square is None:  # huge scores: the ESS does not change with the scale
            leaves = self.tree.leaves / total
            total, square = 1.0, dot(leaves, leaves)
        verdict = self.monitor.check_sums(seen, total, square, step, self._tie_items)
        # While a recalibration is held, a repeated detection is counted but not acted on again: the
        # scores need fresh losses to recover, and stacking noise would only randomise them.
        if verdict.recalibration is not None and step >= self.recal_until:
            t0 = time.perf_counter()
            self._recalibrate(verdict)
            self.recalibration_seconds += time.perf_counter() - t0
        return verdict

    def leaf_square_sum(self) -> float | None:
        """sum of the squared tree leaves (s^alpha of the seen samples), as the continuity check reads
        it: one pass over the leaves, or on a table of at least ``continuity.running_sums_from`` items
        the running sum (recomputed exactly when its accumulated change could have cost precision).
        None when the scores are so large (total > 1e150) that the square could overflow."""
        if self.tree.total > 1e150:
            return None
        if self.squares is None:
            return dot(self.tree.leaves, self.tree.leaves)
        square = self.squares.value
        if square is None:
            self.squares.reset(self.tree.leaves)  # O(N), rare
            square = self.squares.value
        return square

    def _tie_items(self) -> np.ndarray:
        """s^alpha of about 2,048 seen samples at random (the tie count needs no more); all if few are seen."""
        assert self.monitor is not None  # called by the monitor's own check
        sub = self.monitor.rng.integers(0, self.num_samples, size=4096)
        sub = sub[self.seen[sub]]
        return self.tree.values(sub if sub.size >= 1024 else np.flatnonzero(self.seen))

    def _recalibrate(self, verdict: ContinuityVerdict) -> None:
        recal = verdict.recalibration
        assert recal is not None  # called only for a verdict that asks for one
        seen = np.flatnonzero(self.seen)
        new = np.clip(recalibrate_priorities(self.scores[seen], recal, self.rng), 0.0, self.max_loss)
        self.scores[seen] = new
        self._score_sum.reset(self.scores)
        self.max_score = float(new.max()) if new.size else 0.0
        weights = np.zeros(self.num_samples)
        weights[seen] = self._weight(new)
        self._set_all_weights(weights)  # O(N), only on a collapse
        self.recal_mix, self.recal_until = recal.uniform_mix, recal.until_step
        self.recalibrations += 1

    def stats(self) -> SampleStats:
        nan = float("nan")
        mon = self.monitor
        m = mon.last.measures if mon is not None and mon.last is not None else None
        return SampleStats(
            normalized_ess=m.normalized_ess if m else nan, normalized_entropy=m.normalized_entropy if m else nan,
            tie_fraction=m.tie_fraction if m else nan, recalibrations=self.recalibrations,
            collapsed_flat=mon.collapsed_flat if mon else 0, collapsed_peaked=mon.collapsed_peaked if mon else 0,
            continuity_checks=mon.checks if mon else 0, uniform_mix=float(self._last_mix), beta=float(self._last_beta),
            seen_fraction=1.0 - self.unseen_count / self.num_samples, epoch=self.samples_drawn / self.num_samples,
            uniform_fallbacks=self.uniform_fallbacks, continuity_seconds=self.check_seconds,
            recalibration_seconds=self.recalibration_seconds, continuity_update_seconds=self.squares_seconds,
            distinct_shortfalls=self.distinct_shortfalls, clipped_losses=self.clipped, mode=self.config.mode,
            priority_on=self.rule.prioritised and self.switch.on, switches_off=self.switch.switches_off,
            switches_on=self.switch.switches_on, predicted_gain=self.switch.predicted, cost_factor=self.switch.cost,
            measured_gain=self.switch.gain, probes=self.switch.probes,
            selection_seconds=self.switch.selection_s, skipped_losses=self.skipped_losses,
            irreducible_mean=self._irreducible_mean)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: numpy arrays and plain values (the sum-tree is rebuilt)."""
        d: dict[str, Any] = {
            "num_samples": self.num_samples, "scores": self.scores.copy(), "seen": self.seen.copy(),
            "last_step": self.last_step.copy(), "max_score": self.max_score, "recal_mix": self.recal_mix,
            "recal_until": self.recal_until, "cursor": self._cursor, "last_sweep_step": self._last_sweep_step,
            "last_check_step": self._last_check_step, "samples_drawn": self.samples_drawn,
            "recalibrations": self.recalibrations, "uniform_fallbacks": self.uniform_fallbacks,
            "distinct_shortfalls": self.distinct_shortfalls, "rng": self.rng.bit_generator.state,
            "scale_rng": self.scale_rng.bit_generator.state, "clipped": self.clipped,
            "skipped_losses": self.skipped_losses,
            "switch": self.switch.state_dict(), "switch_rng": self.switch_rng.bit_generator.state,
        }
        if self.irreducible is not None:
            d["irreducible"] = self.irreducible.copy()
        if self.monitor is not None:
            d["monitor"] = {"checks": self.monitor.checks, "collapsed_flat": self.monitor.collapsed_flat,
                            "collapsed_peaked": self.monitor.collapsed_peaked,
                            "rng": self.monitor.rng.bit_generator.state}
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if int(d["num_samples"]) != self.num_samples:
            raise StateError(f"checkpoint has a table of {d['num_samples']} samples, this data set has "
                             f"{self.num_samples}; sample priorities only resume on the same data set")
        # Validate everything before anything is written: a refused checkpoint leaves the table as it was.
        n = self.num_samples
        scores, seen = np.asarray(d["scores"], dtype=np.float64), np.asarray(d["seen"], dtype=bool)
        last_step = np.asarray(d["last_step"], dtype=np.int64)
        if scores.shape != (n,) or seen.shape != (n,) or last_step.shape != (n,):
            raise StateError(f"checkpoint's sample table arrays have shapes {scores.shape}, {seen.shape}, "
                             f"{last_step.shape}; expected ({n},) each")
        if seen.any() and not (np.all(np.isfinite(scores[seen])) and scores[seen].min() >= 0.0
                               and scores[seen].max() <= self.max_loss):
            raise StateError(f"checkpoint's sample scores must be finite and in [0, {self.max_loss:.4g}]; this one "
                             "was written before bad losses were refused: resume without its sample table")
        irreducible = d.get("irreducible")
        if self.irreducible is not None and irreducible is not None:
            irreducible = np.asarray(irreducible, dtype=np.float64)
            if irreducible.shape != (n,) or not (np.all(np.isfinite(irreducible)) and irreducible.min() >= 0.0):
                raise StateError(f"checkpoint's irreducible losses must be ({n},), finite and >= 0; resume from a "
                                 "state written by SamplePrioritizer.state_dict()")
        max_score = float(d["max_score"])
        if not (math.isfinite(max_score) and 0.0 <= max_score <= self.max_loss):
            raise StateError(f"checkpoint's max_score {max_score!r} must be finite and in [0, {self.max_loss:.4g}]; "
                             "resume from a state written by SamplePrioritizer.state_dict()")
        self._scores.load_state_dict({"values": scores, "measured": seen})  # the arrays checked above
        self.scores[~self.seen] = 0.0  # as in a fresh table: the running sum of squares relies on it
        self.last_step = np.array(d["last_step"], dtype=np.int64)
        self.max_score, self.recal_mix, self.recal_until = max_score, float(d["recal_mix"]), int(d["recal_until"])
        self._cursor, self._last_sweep_step = int(d["cursor"]), d["last_sweep_step"]
        self._last_check_step, self.samples_drawn = d["last_check_step"], int(d["samples_drawn"])
        self.recalibrations, self.uniform_fallbacks = int(d["recalibrations"]), int(d["uniform_fallbacks"])
        self.distinct_shortfalls = int(d.get("distinct_shortfalls", 0))
        self.rng.bit_generator.state = d["rng"]
        if "scale_rng" in d:  # absent in states written before losses were clipped
            self.scale_rng.bit_generator.state = d["scale_rng"]
        self.clipped = int(d.get("clipped", 0))
        self.skipped_losses = int(d.get("skipped_losses", 0))
        if "switch" in d:  # absent in states written before the pay switch
            self.switch.load_state_dict(d["switch"])
            self.switch_rng.bit_generator.state = d["switch_rng"]
        if self.irreducible is not None and irreducible is not None:
            self.irreducible[:] = irreducible
            self._irreducible_mean = float(irreducible.mean())
        self._unseen_list = np.flatnonzero(~self.seen).astype(np.int64)
        self.unseen_count = int(self._unseen_list.size)
        self._score_sum.reset(self.scores)
        self._set_all_weights(np.where(self.seen, self._weight(self.scores), 0.0))
        if self.monitor is not None and "monitor" in d:
            m = d["monitor"]
            self.monitor.checks, self.monitor.collapsed_flat = int(m["checks"]), int(m["collapsed_flat"])
            self.monitor.collapsed_peaked = int(m["collapsed_peaked"])
            self.monitor.rng.bit_generator.state = m["rng"]
