"""Switch priority sampling on only while it is measured to pay: a direct A/B against uniform draws.

Why not a predicted gain alone. The rule before this one compared the variance reduction that
importance sampling predicts from the scores (Katharopoulos & Fleuret, 2018) with its cost. On clean
balanced data that prediction grows as the model learns (2.6 at first, 470 to 2,500 once most samples
are well classified: a few boundary samples then hold all the loss), so the switch never turned off,
while the benchmark's balanced control showed priority draws reaching the target no sooner than
uniform ones. A predicted variance reduction of the loss is not a faster-falling loss.

Measure. The yardstick is the data set's mean training loss (under rho-loss the mean reducible loss,
what that mode ranks by), estimated from every interval's own reported losses with Horvitz-Thompson
weights, ``mean_j l_j / (N p_j)`` (p_j: the sample's draw probability in that interval, 1 / N for
uniform draws), unbiased whichever way the interval drew. The table's scores s serve as a regression
control variate (``IntervalRecord.mean_loss``): ``mean_j s_j / (N p_j)`` estimates the table's mean
score S, which is known, and the estimate's error on it corrects the loss's, in proportion to how far
the losses follow the scores. A rare high-loss sample that a uniform interval happens to draw then
moves the estimate little once its score is known (at imbalance 1,000 the plain estimate's noise hid
the gain); where the scores are stale the correction fades by itself. L_k is interval k's. An
interval is one ``plans`` call (the scheduler's decision interval). The progress of two consecutive
intervals a, b drawn the same way is ``(L_a - L_b) / seconds``: each step's losses are taken before its
update, so the difference spans updates of a and b only; seconds are the pair's mean interval wall
time, the reported step time times its steps plus the table's own selection seconds in it, so the
cost of selection is inside the rate.

A/B. The switch runs in its state (``on``: priority draws) and every so often draws ``PROBE_LEN`` (2)
intervals the other way: a probe. Its rate is compared with the rates of the two intervals before
and the two after it, both in the state's own mode: their geometric mean (their mean if either is
<= 0), which is the rate in between for a loss falling exponentially or by a constant amount per
second (a loss curve's fall slows; the plain mean of the rates around would overrate it).
``gain = priority rate / uniform rate`` (+inf when only priority's loss falls, 0 when priority's does
not fall) is reported. The verdict is a test, not a point estimate: each interval's mean has a
standard error from its own terms' spread, and with P and U the priority and uniform rates,
``D = P - c U`` must stand more than ``SIGNIFICANCE_Z`` (2) standard errors from 0 for the state to
change: priority on turns off when ``D < 0`` with c = ``pay_threshold``, off turns on when ``D > 0``
with c = ``pay_threshold * (1 + HYSTERESIS)`` and priority's own loss falls (``P`` as far above 0): where
uniform's loss rose over its pairs (noise around a converged model), ``D > 0`` alone would turn priority
on with nothing gained (it did, on a balanced control seed: a probe with gain 0 turned it on). Where
the loss barely falls (a converged model) the rates are noise and nothing switches. Each switch is counted. A verdict that keeps the state doubles
the gap to the next probe (``MIN_GAP`` 4 up to ``MAX_GAP`` 32 intervals), a switch resets it: probes
are frequent while the answer is in doubt and cost little once it is settled (a probe is 2 intervals
in 2 + gap).

Cost while off. With priority draws off the table takes only the losses of the intervals a probe
reads (``wants_losses``: the pair before the probe, the probe's pair and the pair after). The plans
of the other intervals say so (``SamplePlan.feedback`` False): the workers neither copy those losses
off the device nor send them (counted, ``skipped_losses``), and the table skips any that come
anyway, so while off it costs a uniform draw per interval and little else. The pair before a
priority probe refreshes the scores it draws by, and scores kept up to date through the probe keep
its A/B's control variate tight (measuring those intervals without writing their scores left a 2.6x
gain short of significance in the unit test of a paying probe).

Start and gate. With a threshold the table starts with uniform draws (nothing is known to pay yet)
and the first probe comes after ``FIRST_PROBE`` (4) intervals. A probe of priority draws is only run
where it could pay: the predicted variance reduction of the unbiased sampler (``predicted_gain``, over
``GAIN_ITEMS`` seen samples drawn from the sum-tree, the unseen ones as one group at their common
score: early on, when most draws are still of unseen samples, the draws are nearly uniform and the
gain near 1) divided by the cost factor (``1 + selection
seconds per step / step seconds``) must reach the bar a probe must clear to turn priority on,
``pay_threshold * (1 + HYSTERESIS)``; flat scores (a predicted gain of 1) skip the probe.

What this measures and what not. The mean training loss is what an unbiased sampler speeds up; a
biased mode (annealed) may pay on another metric (a rare class's recall) with no faster fall of the
mean loss, and the switch then turns it off. Intervals whose losses never arrive (a
report lost) leave a pair unmeasured: its verdict waits, and is skipped after ``_VERDICT_PATIENCE``
intervals.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

GAIN_ITEMS = 1024
"""Seen samples drawn to estimate the predicted gain: relative error ~1/sqrt(1024) = 3% for light tails."""
HYSTERESIS = 0.1
"""Back on only above pay_threshold * 1.1, so a gain near the threshold does not flip every probe."""
PROBE_LEN = 2
"""Intervals a probe draws the other way: one pair, the least a rate can be measured from."""
FIRST_PROBE = 4
"""Interval of the first probe: two pairs in the starting mode before it (the first as warm-up)."""
MIN_GAP, MAX_GAP = 4, 32
"""Intervals in the state's own mode between a verdict and the next probe: at least the pair after
one probe and the pair before the next; doubled after each verdict that keeps the state."""
_VERDICT_PATIENCE = 8
"""Intervals a verdict waits for the losses of its last interval before it is given up."""
SIGNIFICANCE_Z = 2.0
"""Standard errors the measured difference must stand from 0 for a switch (one-sided, ~98%)."""
_MIN_LOSSES = 16
"""Losses an interval needs before its mean counts as measured."""
_STEP_EMA = 0.2
"""Weight of the newest step time in the step-seconds EMA."""
_KEEP = 16
"""Interval records kept (the A/B reads at most the last 6)."""
_VERDICTS_KEPT = 64
"""Recent verdicts kept for inspection (``PaySwitch.verdicts``)."""


def predicted_gain(scores: np.ndarray, relative_p: np.ndarray, relative_q: np.ndarray | None = None,
                   group: tuple[float, float, float] | None = None) -> float:
    """``E[s^2] / E[s^2 / (N p)]`` over samples' scores s (>= 0) and N p (their probability times N),
    the samples drawn uniformly, or from q with ``relative_q`` = n q (each term divided by it).
    ``group``: (share, s, N p) of a group of alike samples, ``share`` of the data set, that the given
    samples leave out (the table's unseen samples: their share dilutes the gain towards 1)."""
    q = np.ones_like(scores) if relative_q is None else np.maximum(relative_q, 1e-300)
    square = scores * scores / q
    second = float(np.mean(square))
    weighted = float(np.mean(square / np.maximum(relative_p, 1e-300)))
    if group is not None:
        share, s, relative = group
        second = (1.0 - share) * second + share * s * s
        weighted = (1.0 - share) * weighted + share * s * s / max(relative, 1e-300)
    return second / weighted if weighted > 0 else 1.0


@dataclass(slots=True)
class IntervalRecord:
    """One interval (a ``plans`` call): its steps, how it drew, and what was measured of it."""

    first_step: int
    num_steps: int
    priority: bool
    selection_s: float = 0.0   # the table's plans and updates attributed to it (s)
    losses: int = 0             # losses reported for it
    # sums over its losses of a = l / (N p), b = s / (N p) (s: the sample's score), their squares and
    # product, and of the table's mean score S when each loss arrived
    sums: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(6))

    def _moments(self) -> tuple[float, float, float, float, float, float]:
        sa, sb, saa, sbb, sab, st = (float(x) for x in self.sums)
        n = self.losses
        a, b = sa / n, sb / n
        return a, b, saa / n - a * a, max(sbb / n - b * b, 0.0), sab / n - a * b, st / n

    def mean_loss(self) -> float:
        """The mean training loss, by Horvitz-Thompson with the table as a regression control variate:
        ``mean(a) - beta (mean(b) - S)``, beta = cov(a, b) / var(b) (nan while too few losses)."""
        if self.losses < _MIN_LOSSES:
            return math.nan
        a, b, _, var_b, cov, table = self._moments()
        return a - (cov / var_b if var_b > 0 else 0.0) * (b - table)

    def variance_of_mean(self) -> float:
        """The squared standard error of ``mean_loss``: var(a - beta b) / (n - 1)."""
        if self.losses < _MIN_LOSSES:
            return math.nan
        _, _, var_a, var_b, cov, _ = self._moments()
        return max(var_a - (cov * cov / var_b if var_b > 0 else 0.0), 0.0) / (self.losses - 1)


def pair_rate(a: IntervalRecord, b: IntervalRecord, step_s: float) -> tuple[float, float]:
    """Loss drop per second over consecutive intervals a, b and its standard error (nan where either is
    unmeasured); per step where no step time was reported (``step_s`` nan: selection's cost left out)."""
    if step_s > 0:
        seconds = 0.5 * (a.num_steps * step_s + a.selection_s + b.num_steps * step_s + b.selection_s)
    else:
        seconds = 0.5 * (a.num_steps + b.num_steps)
    drop = a.mean_loss() - b.mean_loss()
    error = math.sqrt(a.variance_of_mean() + b.variance_of_mean())
    return (drop / seconds, error / seconds) if seconds > 0 else (math.nan, math.nan)


def trend_rate(before: tuple[float, float], after: tuple[float, float]) -> tuple[float, float]:
    """The rate between two measured around it, with its standard error: their geometric mean where both
    are > 0 (exact for a loss falling exponentially, or by a constant amount), else their mean."""
    (a, ea), (b, eb) = before, after
    if a > 0 and b > 0:
        g = math.sqrt(a * b)
        return g, 0.5 * g * math.sqrt((ea / a) ** 2 + (eb / b) ** 2)
    return 0.5 * (a + b), 0.5 * math.sqrt(ea * ea + eb * eb)


def significant(priority: tuple[float, float], uniform: tuple[float, float], c: float) -> int:
    """+1 where priority's rate exceeds c times uniform's by more than ``SIGNIFICANCE_Z`` standard errors,
    -1 where it falls short by as much, else 0 (rates as (value, standard error))."""
    d = priority[0] - c * uniform[0]
    error = math.sqrt(priority[1] ** 2 + (c * uniform[1]) ** 2)
    return 1 if d > SIGNIFICANCE_Z * error else -1 if d < -SIGNIFICANCE_Z * error else 0


def ab_gain(priority_rate: float, uniform_rate: float) -> float:
    """Priority's loss drop per second over uniform's: +inf when only priority's loss falls, 0 when
    priority's does not fall."""
    if not priority_rate > 0:
        return 0.0
    return priority_rate / uniform_rate if uniform_rate > 0 else math.inf


class PaySwitch:
    """Priority draws on or off, by a measured A/B against uniform draws (module docstring)."""

    def __init__(self, threshold: float | None) -> None:
        self.threshold = threshold
        self.on = threshold is None       # with a threshold: uniform until a probe shows priority pays
        self.switches_off = 0
        self.switches_on = 0
        self.probes = 0                   # probes run (verdicts given or pending)
        self.skipped_probes = 0           # priority probes not run: the predicted gain could not pay
        self.selection_s = 0.0            # table time in plans and updates, all along (s)
        self._on_selection_s = 0.0        # the part of it spent in priority intervals (s)
        self._on_steps = 0                # steps of priority intervals
        self.step_s = math.nan            # EMA of the workers' step time (s)
        self.gain = math.nan              # last measured gain (priority / uniform loss drop per second)
        self.predicted = math.nan         # last predicted variance reduction (the probe gate)
        self.cost = math.nan              # cost factor at the last gate
        self.interval = -1                # index of the newest interval
        self._probe_at = FIRST_PROBE      # interval the next probe starts at
        self._gap = MIN_GAP
        self._pending: int | None = None  # start of a probe whose verdict is due
        self._records: dict[int, IntervalRecord] = {}
        # the last verdicts: (first step of the probe, gain, on after it), for a benchmark's log
        self.verdicts: deque[tuple[int, float, bool]] = deque(maxlen=_VERDICTS_KEPT)

    # ------------------------------------------------------------------ schedule
    def probe_due(self) -> bool:
        """Whether the next interval starts a probe (the table asks before ``begin_interval`` to compute
        the predicted gain only when a priority probe needs its gate)."""
        return self.threshold is not None and self._pending is None and self.interval + 1 == self._probe_at

    def begin_interval(self, first_step: int, num_steps: int, gate: float | None = None) -> bool:
        """Open the next interval (steps ``first_step`` on) and return whether it draws by priority.
        ``gate``: the predicted gain over cost, where a probe of priority draws starts now."""
        if self.threshold is None:
            return True
        self.interval += 1
        i = self.interval
        if self._pending is not None and i >= self._pending + 2 * PROBE_LEN:
            self._verdict(i)
        bar = self.threshold * (1.0 + HYSTERESIS)  # what a probe from off must show to turn priority on
        if i == self._probe_at and self._pending is None and not self.on and gate is not None and gate < bar:
            self.skipped_probes += 1      # scores too flat for priority to pay: no probe
            self._probe_at = i + self._gap
        elif i == self._probe_at and self._pending is None:
            self._pending, self.probes = i, self.probes + 1
        priority = self.on != (self._pending is not None and self._pending <= i < self._pending + PROBE_LEN)
        self._records[i] = IntervalRecord(first_step, num_steps, priority)
        self._records.pop(i - _KEEP, None)
        return priority

    def _verdict(self, i: int) -> None:
        s = self._pending
        assert s is not None  # called only with a probe pending
        r = self._records
        pre, probe, post = (s - 2, s - 1), (s, s + 1), (s + 2, s + 3)
        nan = (math.nan, math.nan)
        rates = [pair_rate(r[a], r[b], self.step_s) if a in r and b in r else nan for a, b in (pre, probe, post)]
        if any(math.isnan(x[0]) or math.isnan(x[1]) for x in rates):
            if i < s + 2 * PROBE_LEN + _VERDICT_PATIENCE:
                return                    # losses of the pairs still to come
            self._pending, self._probe_at = None, i + self._gap  # given up: probe again later
            return
        own, other = trend_rate(rates[0], rates[2]), rates[1]
        priority, uniform = (own, other) if self.on else (other, own)
        self.gain = ab_gain(priority[0], uniform[0])
        self._pending = None
        assert self.threshold is not None  # no probes without one
        if self.on and significant(priority, uniform, self.threshold) < 0:
            self.on, self.switches_off, self._gap = False, self.switches_off + 1, MIN_GAP
        elif not self.on and significant(priority, uniform, self.threshold * (1.0 + HYSTERESIS)) > 0 \
                and significant(priority, (0.0, 0.0), 1.0) > 0:  # ... and priority's own loss falls
            self.on, self.switches_on, self._gap = True, self.switches_on + 1, MIN_GAP
        else:
            self._gap = min(2 * self._gap, MAX_GAP)
        self._probe_at = i + self._gap
        self.verdicts.append((r[s].first_step, self.gain, self.on))

    # ------------------------------------------------------------------ measurements
    def current_priority(self, step: int) -> bool | None:
        """How the interval holding ``step`` drew (None: no such interval kept)."""
        record = self._find(step)
        return None if record is None else record.priority

    def wants_losses(self, step: int) -> bool:
        """Whether the table should take the losses of ``step``: always without a threshold or while
        priority draws are on; while they are off only in the intervals a probe measures (the pair
        before it, its own pair and the pair after), whose losses also refresh the scores a priority
        probe draws by. Elsewhere the losses have no use while off, and skipping them is what keeps the
        table's cost near nothing then (the balanced control's overhead was this scoring). Losses of a
        step in no kept interval (before the first plan, or a late report) are taken."""
        if self.threshold is None or self.on:
            return True
        i = self._index(step)
        start = self._pending if self._pending is not None else self._probe_at
        return i is None or start - PROBE_LEN <= i < start + 2 * PROBE_LEN

    def _index(self, step: int) -> int | None:
        """The kept interval holding ``step`` (None: none is)."""
        for i in range(self.interval, self.interval - _KEEP, -1):
            rec = self._records.get(i)
            if rec is not None and rec.first_step <= step < rec.first_step + rec.num_steps:
                return i
        return None

    def _find(self, step: int) -> IntervalRecord | None:
        i = self._index(step)
        return None if i is None else self._records[i]

    def record_losses(self, step: int, weighted: np.ndarray, weighted_scores: np.ndarray, table_mean: float) -> None:
        """Reported losses of the interval holding ``step``: l / (N p) of each (float (B,)), s / (N p) of
        its score s (float (B,)) and the table's mean score S (its expectation under the draws)."""
        record = self._find(step)
        a, b = weighted, weighted_scores
        sums = np.array([a.sum(), b.sum(), a @ a, b @ b, a @ b, table_mean * a.size])
        if record is not None and np.all(np.isfinite(sums)):
            record.sums += sums
            record.losses += a.size

    def record_selection(self, seconds: float, steps: int = 0, step: int | None = None) -> None:
        """Table time spent on selection (``steps``: steps it planned, 0 for an update; ``step``: a step of
        the interval it belongs to, default the newest)."""
        self.selection_s += seconds
        record = self._find(step) if step is not None else self._records.get(self.interval)
        if record is not None:
            record.selection_s += seconds
        if record is None or record.priority:
            self._on_selection_s += seconds
            self._on_steps += steps

    def note_step_seconds(self, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            self.step_s = seconds if math.isnan(self.step_s) else (1 - _STEP_EMA) * self.step_s + _STEP_EMA * seconds

    def cost_factor(self) -> float:
        """1 + selection seconds per priority step / step seconds (1 before both are measured)."""
        if self._on_steps == 0 or not self.step_s > 0:
            return 1.0
        return 1.0 + self._on_selection_s / self._on_steps / self.step_s

    def gate(self, gain: float) -> float:
        """The predicted gain over the cost factor, recorded (a priority probe from off runs only where it
        reaches ``threshold * (1 + HYSTERESIS)``)."""
        self.predicted, self.cost = gain, self.cost_factor()
        return gain / self.cost

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The verdict, its counts and the probe schedule; not the measurements (a resumed run measures
        afresh, and a state holds no wall-clock figure that would make two saves of one run differ)."""
        return {"on": self.on, "switches_off": self.switches_off, "switches_on": self.switches_on,
                "probes": self.probes, "skipped_probes": self.skipped_probes, "gap": self._gap}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.on = bool(d["on"])
        self.switches_off, self.switches_on = int(d["switches_off"]), int(d["switches_on"])
        self.probes, self.skipped_probes = int(d.get("probes", 0)), int(d.get("skipped_probes", 0))
        self._gap = int(d.get("gap", MIN_GAP))
        # the resumed run's intervals count from 0 again: its first probe comes after two measured pairs
        self.interval, self._probe_at, self._pending, self._records = -1, FIRST_PROBE, None, {}
