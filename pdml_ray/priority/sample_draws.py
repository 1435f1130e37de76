"""Sample priorities, the drawing half: the distribution p over the table's scores, draws, plans.

``SampleDraws`` is mixed into ``SamplePrioritizer`` (``pdml_ray.priority.sample``), which owns the table
these methods read (scores, sum-tree, unseen group, the recalibration's mix) and initialises it.

Sampling distribution over the N samples of the data set::

    p_i = (1 - mix) * s_i^alpha / sum_j s_j^alpha + mix / N

with s_i the sample's score (its last loss, or an EMA of its losses), alpha the temperature
(``SamplePriorityConfig.exponent``) and ``mix`` the uniform floor (raised for a while after a
continuity collapse). Importance weights ``w_i = (N p_i)^(-beta)`` are divided by their maximum over
the step; beta anneals linearly from ``is_exponent_start`` to ``is_exponent_end`` (default 1) over
``is_anneal_steps``.

Unbiasedness. With replacement (the default) the draws are i.i.d. from p, so with beta = 1
``mean_j f(x_j) / (N p(x_j))`` is an exactly unbiased estimate of ``mean_i f(i)`` for any per-sample
quantity f (a loss, a gradient). The max-normalisation of the weights multiplies that estimate by
one positive number per step (a learning-rate factor; ``probabilities`` gives the raw p). Without
replacement (``replacement=False``) a step's indices are distinct and the same weights are used: a
small bias that vanishes as B / N -> 0. (A step larger than the data set takes every sample, some more
than once, and is counted in ``distinct_shortfalls``: plans keep coming.)

Never-seen samples score the maximum score seen so far (``unseen_score='max'``, the default), so
they are drawn early: the first epoch visits (nearly) every sample before the sampler can focus.
``unseen_score='mean'`` gives them the mean seen score instead, so high-loss samples are exploited
as soon as they are found. Either way the unseen samples form one group (count U, each weighing
M^alpha) outside the sum-tree, so a new maximum costs O(1), not O(N); a draw from the group picks
uniformly among unseen samples by rejection from a lazily compacted list.

Modes and the pay switch. The mode (``pdml_ray.priority.sample_modes``) gives beta's schedule and
whether draws follow the scores at all; a plan is drawn uniformly, every weight 1, under
selective-backprop and while the pay switch (``pdml_ray.priority.sample_switch``) has priority draws
off. Each ``plans`` call is one interval of the switch's A/B, and the call's wall time counts as
selection cost.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pdml_ray.config import SamplePriorityConfig
from pdml_ray.decisions import MAX_STEP, SamplePlan
from pdml_ray.errors import PlanError, shown
from pdml_ray.priority.sample_modes import ModeRule
from pdml_ray.priority.sample_switch import GAIN_ITEMS, PaySwitch, predicted_gain
from pdml_ray.priority.selective_backprop import LossWindow
from pdml_ray.priority.sumtree import SumTree

logger = logging.getLogger(__name__)

_MAX_PLAN_SAMPLES = 1 << 28  # indices one plans() call may hand out (2 GiB of int64 plus weights)

_MAX_REJECTION_ROUNDS = 64
_MIN_THRESHOLD_LOSSES = 64  # losses the cluster's percentile needs before plans carry it (fewer: noise)


class SampleDraws:
    """The sampler of ``SamplePrioritizer``: p, its i.i.d. and distinct draws, the plans and their
    importance weights. A mixin: the state below is the table's, set up by ``SamplePrioritizer``."""

    num_samples: int
    config: SamplePriorityConfig
    rng: np.random.Generator
    tree: SumTree
    _unseen_list: np.ndarray
    unseen_count: int
    skipped_losses: int
    max_score: float
    recal_mix: float
    recal_until: int
    samples_drawn: int
    uniform_fallbacks: int
    distinct_shortfalls: int
    _last_mix: float
    _last_beta: float
    rule: ModeRule
    switch: PaySwitch
    switch_rng: np.random.Generator
    recent_losses: LossWindow | None

    if TYPE_CHECKING:
        @property
        def seen(self) -> np.ndarray: ...

        @property
        def seen_sum(self) -> float: ...

        @property
        def scores(self) -> np.ndarray: ...

    # ------------------------------------------------------------------ distribution
    def _unseen_weight(self) -> float:
        if self.config.unseen_score == "mean":
            seen = self.num_samples - self.unseen_count
            score = self.seen_sum / seen if seen else 0.0
        else:
            score = self.max_score
        # Before any loss arrives (or while all are 0) every unseen sample weighs 1: uniform among them.
        return float(score) ** self.config.exponent if score > 0 else 1.0

    def mix(self, step: int) -> float:
        """Uniform mix in effect at ``step`` (raised while a recalibration holds)."""
        return max(self.config.uniform_mix, self.recal_mix) if step < self.recal_until else self.config.uniform_mix

    def beta(self, step: int) -> float:
        """Importance-weight exponent at ``step``, as the mode schedules it (``sample_modes``)."""
        return self.rule.beta(self.config, step)

    def priority_draws(self, step: int, num_steps: int = 1) -> bool:
        """Whether the plans of the interval from ``step`` (``num_steps`` steps) follow the scores: the mode
        draws by priority and the pay switch (``sample_switch``: a measured A/B against uniform draws) has
        them on or probes them now. A priority probe from the off state first needs the predicted gain
        over its cost to reach the bar for turning on (its gate, ``_predicted_gate``)."""
        if not self.rule.prioritised:
            return False
        gate = self._predicted_gate(step) if self.switch.probe_due() and not self.switch.on else None
        return self.switch.begin_interval(step, num_steps, gate)

    def _predicted_gate(self, step: int) -> float | None:
        """The predicted variance reduction over the cost factor (``PaySwitch.gate``), from ``GAIN_ITEMS``
        seen samples drawn from the tree and the unseen ones as one group; None with nothing seen."""
        seen, total = self.num_samples - self.unseen_count, self.tree.total
        if seen == 0 or not total > 0:  # no seen score above 0: nothing to judge by
            return None
        # GAIN_ITEMS seen samples drawn from the tree (q ~ s^alpha), so the heavy ones are in (sample_switch)
        sub = self.tree.draw(GAIN_ITEMS, self.switch_rng)
        relative_q = seen * self.tree.values(sub) / total
        proxy = self.scores[sub]
        # the unseen group: its score (mean or max seen, as drawn) and N p of one of its samples
        unseen = self.seen_sum / seen if self.config.unseen_score == "mean" else self.max_score
        mix, z = self.mix(step), sum(self._mass())
        unseen_np = self.num_samples * (1.0 - mix) * self._unseen_weight() / z + mix
        if self.config.gain_proxy == "logit-gradient":  # cross-entropy: |d loss / d logit| = 1 - exp(-loss)
            proxy, unseen = -np.expm1(-proxy), -math.expm1(-unseen)
        group = (self.unseen_count / self.num_samples, unseen, unseen_np)
        return self.switch.gate(predicted_gain(proxy, self.num_samples * self.probabilities(sub, step), relative_q, group))

    def _mass(self) -> tuple[float, float]:
        """(tree mass, unseen-group mass): sum of s^alpha over seen samples, U * M^alpha."""
        return self.tree.total, self.unseen_count * self._unseen_weight()

    def backprop_threshold(self) -> float | None:
        """selective-backprop: the cluster's ``1 - backprop_share`` quantile of the last
        ``percentile_window`` losses the table took from every worker, which the plans carry (None in
        other modes, and while fewer than 64 losses arrived: each worker then uses its own)."""
        if self.recent_losses is None or len(self.recent_losses) < _MIN_THRESHOLD_LOSSES:
            return None
        return self.recent_losses.threshold(1.0 - self.config.backprop_share)

    def probabilities(self, indices: np.ndarray, step: int) -> np.ndarray:
        """p_i of ``indices`` (float64, same shape) under the distribution used at ``step``."""
        idx = np.asarray(indices, dtype=np.int64)
        mix = self.mix(step)
        tree_mass, unseen_mass = self._mass()
        z = tree_mass + unseen_mass
        if not z > 0:
            return np.full(idx.shape, 1.0 / self.num_samples)
        w = np.where(self.seen[idx], self.tree.values(idx), self._unseen_weight())
        return (1.0 - mix) * w / z + mix / self.num_samples

    # ------------------------------------------------------------------ drawing
    def _draw_unseen(self, count: int) -> np.ndarray:
        """``count`` unseen samples, uniform among the unseen, with replacement."""
        out, have = np.empty(count, dtype=np.int64), 0
        while have < count:
            cand = self._unseen_list[self.rng.integers(0, self._unseen_list.size, size=2 * (count - have))]
            cand = cand[~self.seen[cand]][:count - have]  # list holds >= 1/2 unseen (compacted in update)
            out[have:have + cand.size] = cand
            have += cand.size
        return out

    def _draw(self, count: int, mix: float) -> np.ndarray:
        """``count`` i.i.d. draws from p (int64, (count,)), in random order."""
        tree_mass, unseen_mass = self._mass()
        z = tree_mass + unseen_mass
        if not z > 0:  # every score is 0 and nothing unseen: no priority information, sample uniformly
            self.uniform_fallbacks += 1
            mix = 1.0
        n_uniform = int(self.rng.binomial(count, mix)) if mix < 1.0 else count
        n_unseen = int(self.rng.binomial(count - n_uniform, unseen_mass / z)) if z > 0 else 0
        n_tree = count - n_uniform - n_unseen
        parts = [self.rng.integers(0, self.num_samples, size=n_uniform)]
        if n_unseen:
            parts.append(self._draw_unseen(n_unseen))
        if n_tree:
            parts.append(self.tree.draw(n_tree, self.rng))
        return self.rng.permutation(np.concatenate(parts))

    def _draw_distinct(self, count: int, mix: float) -> np.ndarray:
        """``count`` distinct samples: repeated draws from p, duplicates rejected (``replacement=False``).

        A step larger than the data set cannot be distinct: it gets every sample ``count // N`` times
        (in random order) plus ``count % N`` distinct draws, i.e. as distinct as it can be, and the
        shortfall is counted (``distinct_shortfalls``) rather than failing every plan."""
        n = self.num_samples
        if count > n:
            if self.distinct_shortfalls == 0:
                logger.warning("sample_priority.replacement=False but a step takes %d samples from a data set of %d: "
                               "each sample is used about %d times per step; raise the data set size or lower the "
                               "global batch size", count, n, count // n)
            self.distinct_shortfalls += 1
            whole = [self.rng.permutation(n) for _ in range(count // n)]
            return self.rng.permutation(np.concatenate(whole + [self._draw_distinct(count % n, mix)]))
        taken = np.zeros(self.num_samples, dtype=bool)
        chosen = np.empty(0, dtype=np.int64)
        for _ in range(_MAX_REJECTION_ROUNDS):
            need = count - chosen.size
            if need == 0:
                break
            cand = self._draw(2 * need, mix)
            cand = cand[~taken[cand]]
            _, first = np.unique(cand, return_index=True)
            cand = cand[np.sort(first)][:need]  # keep draw order among the new distinct ones
            taken[cand] = True
            chosen = np.concatenate([chosen, cand])
        if chosen.size < count:  # a very peaked p keeps redrawing the same items: fill uniformly
            rest = np.flatnonzero(~taken)
            chosen = np.concatenate([chosen, self.rng.choice(rest, size=count - chosen.size, replace=False)])
        return chosen

    def plan(self, step: int, batch_sizes: Sequence[int]) -> SamplePlan:
        """Indices and importance weights for every worker at ``step``; worker i gets ``batch_sizes[i]``."""
        return self.plans(step, 1, batch_sizes)[0]

    def plans(self, first_step: int, num_steps: int, batch_sizes: Sequence[int]) -> list[SamplePlan]:
        """Plans for ``num_steps`` consecutive steps from the current scores, as a scheduler hands them
        out once per decision interval. With replacement all of them come from one draw (one tree
        descent instead of one per step); the distribution, including the uniform mix, is the one in
        effect at ``first_step``, and beta is annealed per step."""
        def integer(x: object) -> bool:
            return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))

        if not (isinstance(batch_sizes, (list, tuple, np.ndarray)) and len(batch_sizes) >= 1
                and all(integer(b) and b >= 0 for b in batch_sizes)):
            raise PlanError(f"batch_sizes must be a non-empty sequence of integers >= 0 (one per worker), "
                            f"got {batch_sizes!r}")
        if not (integer(num_steps) and num_steps >= 1):
            raise PlanError(f"num_steps must be an integer >= 1, got {shown(num_steps)}")
        if not (integer(first_step) and 0 <= first_step <= MAX_STEP and num_steps <= MAX_STEP - first_step):
            raise PlanError(f"first_step must be an integer in [0, {MAX_STEP}] (steps are int64), and the plans' last "
                            f"step too, got first_step {shown(first_step)} and num_steps {shown(num_steps)}")
        sizes = [int(b) for b in batch_sizes]
        total = sum(sizes)
        if total * num_steps > _MAX_PLAN_SAMPLES:
            raise PlanError(f"plans for {num_steps} steps of {total} samples ({total * num_steps} indices) exceed "
                            f"{_MAX_PLAN_SAMPLES}; lower the decision interval or the global batch size")
        t0 = time.perf_counter()
        prioritised = self.priority_draws(first_step, num_steps)
        mix = self.mix(first_step) if prioritised else 1.0
        if not prioritised:  # uniform draws, every weight 1
            drawn = (self.rng.integers(0, self.num_samples, size=total * num_steps) if self.config.replacement
                     else np.concatenate([self._uniform_distinct(total) for _ in range(num_steps)]))
        elif self.config.replacement:
            drawn = self._draw(total * num_steps, mix)
            p_drawn = self.probabilities(drawn, first_step)
        bounds = [0, *itertools.accumulate(sizes)]  # worker i gets [bounds[i], bounds[i+1])
        threshold = self.backprop_threshold()
        feedback = self.switch.wants_losses(first_step)  # one interval: one answer for all its steps
        if not feedback:
            self.skipped_losses += total * num_steps
        out = []
        for k in range(num_steps):
            if not prioritised:
                indices, weights = drawn[k * total:(k + 1) * total], np.ones(total, dtype=np.float32)
            else:
                if self.config.replacement:
                    indices, p = drawn[k * total:(k + 1) * total], p_drawn[k * total:(k + 1) * total]
                else:
                    indices = self._draw_distinct(total, mix)
                    p = self.probabilities(indices, first_step)
                # (N p)^-beta; the floor only matters for a uniform fill of replacement=False at mix 0 (p = 0)
                weights = np.power(np.maximum(self.num_samples * p, 1e-12), -self.beta(first_step + k))
                if weights.size:
                    weights /= weights.max()
                weights = weights.astype(np.float32)
            out.append(SamplePlan(step=first_step + k, indices=tuple(indices[a:b] for a, b in zip(bounds, bounds[1:])),
                                  weights=tuple(weights[a:b] for a, b in zip(bounds, bounds[1:])),
                                  backprop_threshold=threshold, feedback=feedback, uniform=not prioritised))
        self.samples_drawn += total * num_steps
        self._last_mix, self._last_beta = mix, self.beta(first_step + num_steps - 1) if prioritised else 0.0
        self.switch.record_selection(time.perf_counter() - t0, num_steps)
        return out

    def _uniform_distinct(self, count: int) -> np.ndarray:
        """``count`` samples uniformly, distinct where the data set has enough (else every sample
        ``count // N`` times plus distinct ones, as ``_draw_distinct`` does)."""
        n = self.num_samples
        whole = [self.rng.permutation(n) for _ in range(count // n)]
        return np.concatenate(whole + [self.rng.choice(n, size=count % n, replace=False)]).astype(np.int64)
