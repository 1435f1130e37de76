"""Step-time fits behind node priorities: per-worker lines ``t(b) = c + b / r`` and their uncertainty.

``StepTimeFit`` holds every worker's recency-weighted least-squares line (the measure step of
``pdml_ray.priority.node``, whose deriver decides from it), ``LineFit`` is one worker's fitted line
with its covariance, ``FittedLines`` every worker's as arrays, ``fit_lines`` the fit itself (one
vectorised pass over any number of workers), and ``student_quantile`` the t quantile the deriver's noise
gate uses while a fit's noise estimate rests on few reports. Pure numpy; deterministic given the reports.

Identifiability. A worker that has run one batch size only (or too little spread) does not tell its
fixed cost from its rate. A ridge prior on c, centred on 0 with a standard deviation of half the
worker's mean step time, shrinks the fit towards the proportional model in that case; it is a
proper Gaussian prior against the fit's own noise estimate, so it fades as soon as the data's spread
identifies c (noise-free data with any spread is fitted exactly once the noise prior below is
forgotten) and holds while it does not. With
one batch size the fit is exactly ``c = 0, r = b / mean(t)``: the old rate model.

Noise. Each fit estimates its residual variance (unbiased for the effective number of observations
``n_eff = (sum w)^2 / sum w^2``), starting from a weak prior worth two reports of 10% step-time noise
that is forgotten like a report, so the first decisions are not taken on two lucky identical steps.
Parameter covariances follow from the same quantities. A report more than 3 standard deviations (and
more than 10%) off its worker's line is clipped to that bound before it is folded in (winsorised
least squares): one step slowed by contention, garbage collection or I/O moves the fit by a bounded
amount, while a lasting change of speed still comes through within a couple of dozen reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdml_ray.errors import StateError, UsageError

NOISE_PRIOR_REPORTS = 2.0
"""Weight of the noise prior in reports (forgotten like a report)."""
NOISE_PRIOR_FRACTION = 0.1
"""Prior step-time noise (standard deviation) as a fraction of the worker's mean step time."""
FIXED_COST_PRIOR_FRACTION = 0.5
"""Standard deviation of the ridge prior on c (centred on 0), as a fraction of the mean step time."""
OUTLIER_SIGMAS = 3.0
"""A report's time is clipped to its line's prediction plus or minus this many standard deviations
(one step's noise and the line's own uncertainty) before it is folded in (winsorised least squares)."""
OUTLIER_FLOOR = 0.1
"""... but never closer than this fraction of the prediction, so that a noise-free fit still follows a
real change of speed within a few reports."""
MIN_SLOPE_FRACTION = 1e-3
"""The per-sample part of a step is at least this fraction of the mean step time (keeps r finite)."""
REFIT_ONE_BY_ONE = 16
"""Up to this many stale lines are refitted one at a time on floats, more in one pass over arrays
(``fit_lines``: ~10 us a line on floats; ~150 us a pass on arrays, about as much for 1 line as for
1,024: numpy's fixed cost per operation). A batch of one node's reports refits 8 lines at most."""


def student_quantile(z: float, dof: np.ndarray) -> np.ndarray:
    """The Student-t quantile with ``dof`` degrees of freedom (each element of it) at the normal quantile
    ``z`` (Cornish-Fisher expansion: within 4% for dof >= 3; below that smaller than the exact quantile,
    7.2 instead of 12.7 for z = 1.96 at dof = 1, where ``dof`` is floored).

    The gate estimates the noise from few reports early on; a t quantile keeps its false-switch rate
    near that of ``z`` standard errors with a known noise."""
    nu = np.maximum(dof, 1.0)
    return z + (z ** 3 + z) / (4 * nu) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * nu ** 2)


@dataclass(frozen=True, slots=True)
class LineFit:
    """One worker's fitted step-time line ``t(b) = fixed_s + b * slope`` and its uncertainty."""

    fixed_s: float
    slope: float
    """Seconds per sample (1 / rate)."""
    mean_b: float
    mean_t: float
    noise_var: float
    """Residual variance of one step's time (s^2); 0 without an estimate."""
    noise_dof: float
    """Degrees of freedom behind ``noise_var`` (the prior's weight plus the residual's)."""
    cov: tuple[float, float, float]
    """(var c, cov(c, slope), var slope) of the estimates."""

    @property
    def rate(self) -> float:
        return 1.0 / self.slope

    def predict(self, b: float) -> float:
        return self.fixed_s + b * self.slope if b > 0 else 0.0

    def predict_var(self, b: float) -> float:
        """Variance of the predicted step time at batch b (the line's uncertainty, not one step's noise)."""
        vc, vcs, vs = self.cov
        return max(vc + 2.0 * b * vcs + b * b * vs, 0.0) if b > 0 else 0.0


@dataclass(frozen=True, slots=True)
class FittedLines:
    """Every worker's ``LineFit`` as arrays of shape (workers,); the rows of workers without a report
    are meaningless. ``predict`` and ``predict_var`` are ``LineFit``'s over several workers at once."""

    fixed_s: np.ndarray
    slope: np.ndarray
    mean_b: np.ndarray
    mean_t: np.ndarray
    noise_var: np.ndarray
    noise_dof: np.ndarray
    cov_cc: np.ndarray
    """var c (s^2)"""
    cov_cs: np.ndarray
    """cov(c, slope)"""
    cov_ss: np.ndarray
    """var slope"""

    @property
    def rates(self) -> np.ndarray:
        return 1.0 / self.slope

    def line(self, i: int) -> LineFit:
        return LineFit(fixed_s=float(self.fixed_s[i]), slope=float(self.slope[i]), mean_b=float(self.mean_b[i]),
                       mean_t=float(self.mean_t[i]), noise_var=float(self.noise_var[i]),
                       noise_dof=float(self.noise_dof[i]),
                       cov=(float(self.cov_cc[i]), float(self.cov_cs[i]), float(self.cov_ss[i])))

    def predict(self, workers: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Predicted step times (s) of ``workers`` at batch sizes ``b`` (0 for an idle worker)."""
        return np.where(b > 0, self.fixed_s[workers] + b * self.slope[workers], 0.0)

    def predict_var(self, workers: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Variances (s^2) of those predictions (the lines' uncertainty, not one step's noise)."""
        var = self.cov_cc[workers] + 2.0 * b * self.cov_cs[workers] + b * b * self.cov_ss[workers]
        return np.where(b > 0, np.maximum(var, 0.0), 0.0)

    def copy(self) -> FittedLines:
        return FittedLines(**{name: getattr(self, name).copy() for name in LINE_FIELDS})

    def per_sample(self, units_per_sample: float) -> FittedLines:
        """These lines, fitted over cost units u (trained-sample equivalents), as lines over samples at
        ``units_per_sample`` units each (u = m b): ``t = c + b (m s)``, so the slope and its covariances
        scale by m (m^2 for var slope) and the mean batch by 1 / m."""
        m = units_per_sample
        return FittedLines(fixed_s=self.fixed_s, slope=self.slope * m, mean_b=self.mean_b / m, mean_t=self.mean_t,
                           noise_var=self.noise_var, noise_dof=self.noise_dof, cov_cc=self.cov_cc,
                           cov_cs=self.cov_cs * m, cov_ss=self.cov_ss * (m * m))


LINE_FIELDS = tuple(f.name for f in dataclasses.fields(FittedLines))


class FloatOps:
    """``where`` and ``maximum`` on Python floats: ``fit_lines(s, FloatOps)`` fits one worker from its
    statistics as floats, in ~10 us where numpy's fixed cost per operation makes a pass over arrays
    cost ~150 us however few the workers (``REFIT_ONE_BY_ONE``)."""

    @staticmethod
    def where(condition: bool, a: float, b: float) -> float:
        return a if condition else b

    maximum = staticmethod(max)


def fit_lines(s: Mapping[str, Any], ops: Any = np) -> dict[str, Any]:
    """The lines of k workers (``LINE_FIELDS``, each of shape (k,)) from their sufficient statistics
    (``StepTimeFit.FIELDS``, each of shape (k,), every weight w > 0), in one vectorised pass; each row
    is the fit of the module docstring, branch for branch (``ops.where`` where it branches, both sides
    computed: no division by 0 on the side not taken). With ``ops=FloatOps`` and floats for arrays, the
    same arithmetic fits one worker."""
    w, w2, b0, t0, prior_w = s["w"], s["w2"], s["mean_b"], s["mean_t"], s["noise_prior"]
    bb, bt, tt = ops.maximum(s["bb"], 0.0), s["bt"], s["tt"]
    n_eff = w * w / w2
    prior_var = (NOISE_PRIOR_FRACTION * t0) ** 2
    ridge_sd2 = (FIXED_COST_PRIOR_FRACTION * t0) ** 2
    prop = t0 / b0  # slope of the proportional model through the mean (t0, b0 > 0: reports are checked)
    min_slope = MIN_SLOPE_FRACTION * prop
    spread_b = bb > 0.0
    noise_var = prior_var
    for _ in range(3):  # the ridge's strength follows the noise estimate, which follows the fit
        # Posterior of (c, s) with prior c ~ N(0, ridge_sd2): the forgetting weights are not
        # inverse variances, so the information of the weighted sums is scaled by n_eff / w.
        ridge = noise_var * w / (n_eff * ridge_sd2)
        kappa = w * ridge / (w + ridge)  # what is left of the ridge once c is eliminated
        spread = bb + kappa * b0 * b0  # 0 only with one batch size and no noise: then c = 0
        has_spread = spread > 0.0
        slope = ops.where(has_spread, prop + (bt - prop * bb) / ops.where(has_spread, spread, 1.0), prop)
        shrink = w / (w + ridge)
        fixed = shrink * (t0 - b0 * slope)
        negative = fixed < 0.0  # c >= 0: the best line through the origin
        fixed = ops.where(negative, 0.0, fixed)
        slope = ops.where(negative, (bt + w * b0 * t0) / (bb + w * b0 * b0), slope)
        flat = slope < min_slope  # r finite: the per-sample part cannot vanish
        slope = ops.where(flat, min_slope, slope)
        fixed = ops.where(flat, ops.maximum(shrink * (t0 - b0 * slope), 0.0), fixed)
        rss = ops.maximum(tt - 2.0 * slope * bt + slope * slope * bb + w * (t0 - fixed - slope * b0) ** 2, 0.0)
        # the slope counts as a parameter once identified
        params = 1.0 + ops.where(spread_b, bb / ops.where(spread_b, bb + kappa * b0 * b0, 1.0), 0.0)
        dof = ops.maximum(n_eff - params, 0.0)
        noise_dof = prior_w + dof
        has_dof = noise_dof > 1e-12
        noise_var = ops.where(has_dof, (prior_w * prior_var + rss * n_eff / w) / ops.where(has_dof, noise_dof, 1.0),
                              0.0)
    # Covariance of (c, s): noise_var * (w / n_eff) * (M + ridge e0 e0^T)^-1 with
    # M = [[w, w b0], [w b0, bb + w b0^2]] (the normal equations in raw moments).
    m00, m01, m11 = w + ridge, w * b0, bb + w * b0 * b0
    det = m00 * m11 - m01 * m01
    scale = noise_var * w / n_eff
    known = (scale > 0.0) & (det > 0.0)
    det = ops.where(known, det, 1.0)
    return {"fixed_s": fixed, "slope": slope, "mean_b": b0, "mean_t": t0, "noise_var": noise_var,
            "noise_dof": noise_dof, "cov_cc": ops.where(known, scale * m11 / det, 0.0),
            "cov_cs": ops.where(known, -scale * m01 / det, 0.0), "cov_ss": ops.where(known, scale * m00 / det, 0.0)}


class StepTimeFit:
    """Per-worker recency-weighted least-squares lines ``t = c + b * s`` (s = 1/r, c >= 0, r > 0).

    Sufficient statistics per worker, each report forgotten by ``1 - alpha`` per later report:
    total weight ``w`` and squared weight ``w2`` (for n_eff), weighted means of b and t, and the
    centred scatter ``bb, bt, tt`` (West's update, stable where raw sums cancel). ``noise_prior`` is
    the decaying weight of the noise prior. O(1) per report; deterministic given the reports.
    Each worker's fitted line is kept until its next report; the stale ones are refitted when lines are
    read, together in one vectorised pass (``fit_lines``) where they are many: a decision at 1,024
    workers, each of which reported since the last decision, refits all 1,024 in one pass; a batch of
    reports refits its own workers' lines.
    """

    FIELDS = ("w", "w2", "mean_b", "mean_t", "bb", "bt", "tt", "noise_prior")

    def __init__(self, num_workers: int, alpha: float) -> None:
        self.forget = 1.0 - float(alpha)
        self.stats = {name: np.zeros(num_workers) for name in self.FIELDS}
        self.stats["noise_prior"][:] = NOISE_PRIOR_REPORTS
        self._lines = FittedLines(**{name: np.zeros(num_workers) for name in LINE_FIELDS})  # valid where not stale
        self._stale = np.ones(num_workers, dtype=bool)  # reported since its line was fitted

    @property
    def measured(self) -> np.ndarray:
        return self.stats["w"] > 0

    @property
    def all_measured(self) -> bool:
        return bool(self.measured.all())

    @property
    def values(self) -> np.ndarray:
        """Per-sample rates r_i (samples/s), NaN until measured (the view the EMA used to give)."""
        self.refresh()
        measured = self.measured
        return np.divide(1.0, self._lines.slope, out=np.full(measured.shape, np.nan), where=measured)

    def update(self, i: int, b: float, t: float) -> None:
        """Fold one report in, its time clipped against the worker's line (``ingest`` for a batch)."""
        self.ingest([(i, b, t)])

    def ingest(self, reports: Sequence[tuple[int, float, float]]) -> None:
        """Fold reports (worker, batch size, seconds) in, in order, each time far off its worker's line as
        of the batch's start first pulled back to the clip bound (a worker's first report ever is taken as
        it is, and its others in the batch are clipped against the line through it). The batch's stale
        lines are refitted in one pass and every clip bound computed in one, not one report at a time."""
        w = self.stats["w"]
        later = []
        for row in reports:
            if w[row[0]] > 0:
                later.append(row)
            else:  # nothing to clip against yet
                self._fold(row[0], [(row[1], row[2])])
        if not later:
            return
        rows = np.array(later, dtype=np.float64)  # (reports, 3)
        workers, b, t = rows[:, 0].astype(np.int64), rows[:, 1], rows[:, 2]
        stale = self._stale[workers]
        if stale.any():  # usually none is: a decision refits every line, and a worker flushes once between two
            self.refresh(np.unique(workers[stale]))
        lines = self._lines
        pred = lines.predict(workers, b)
        bound = np.maximum(OUTLIER_SIGMAS * np.sqrt(lines.noise_var[workers] + lines.predict_var(workers, b)),
                           OUTLIER_FLOOR * pred)
        # without a noise estimate (ema_alpha = 1) nothing is an outlier
        t = np.where(lines.noise_dof[workers] > 0.0, np.minimum(np.maximum(t, pred - bound), pred + bound), t)
        # a worker's reports fold in order, each worker's apart from the others' (their statistics are
        # independent): one read and one write of its statistics per worker, not per report
        by_worker: dict[int, list[tuple[float, float]]] = {}
        for (i, b_i, _), t_i in zip(later, t.tolist()):
            by_worker.setdefault(i, []).append((b_i, t_i))
        for i, folds in by_worker.items():
            self._fold(i, folds)

    def _fold(self, i: int, folds: Sequence[tuple[float, float]]) -> None:
        """Fold worker i's (batch size, seconds) pairs in, in order, on Python floats (the same IEEE
        arithmetic as on numpy's float64 scalars, ~5x cheaper per report than indexing the arrays)."""
        lam = self.forget
        columns = [self.stats[name] for name in self.FIELDS]
        w, w2, mean_b, mean_t, bb, bt, tt, prior = (v.item(i) for v in columns)
        for b, t in folds:
            old_w = lam * w
            w = old_w + 1.0
            db, dt = b - mean_b, t - mean_t
            f = old_w / w
            bb = lam * bb + f * db * db
            bt = lam * bt + f * db * dt
            tt = lam * tt + f * dt * dt
            mean_b += db / w
            mean_t += dt / w
            w2 = lam * lam * w2 + 1.0
            prior *= lam
        for v, x in zip(columns, (w, w2, mean_b, mean_t, bb, bt, tt, prior)):
            v[i] = x
        self._stale[i] = True

    def reset(self, i: int) -> None:
        """Forget worker i's reports (its next report starts a fresh line, with a fresh noise prior)."""
        for name, v in self.stats.items():
            v[i] = NOISE_PRIOR_REPORTS if name == "noise_prior" else 0.0
        self._stale[i] = True

    def refresh(self, workers: np.ndarray | None = None) -> None:
        """Refit the stale lines of ``workers`` (distinct indices; default every worker) that have a report:
        in one pass over arrays, or one at a time on floats where they are few (``REFIT_ONE_BY_ONE``)."""
        if workers is None:
            self._refit(np.flatnonzero(self._stale & self.measured))
        else:
            self._refit(workers[self._stale[workers] & (self.stats["w"][workers] > 0)])

    def _refit(self, idx: np.ndarray) -> None:
        if idx.size > REFIT_ONE_BY_ONE:
            fitted = fit_lines({name: v[idx] for name, v in self.stats.items()})
            for name, v in fitted.items():
                getattr(self._lines, name)[idx] = v
        else:
            for i in idx.tolist():
                for name, x in fit_lines({name: float(v[i]) for name, v in self.stats.items()}, FloatOps).items():
                    getattr(self._lines, name)[i] = x
        self._stale[idx] = False

    def lines(self) -> FittedLines:
        """Every worker's line (a copy; rows of workers without a report are meaningless)."""
        self.refresh()
        return self._lines.copy()

    def fit(self, i: int) -> LineFit:
        """Worker i's line (refitted if stale); UsageError before its first report."""
        if not self.stats["w"][i] > 0:
            raise UsageError(f"StepTimeFit.fit({i}): worker {i} has no report yet, so no line (check .measured first)")
        if self._stale[i]:
            self._refit(np.array([i]))
        return self._lines.line(i)

    def state_dict(self) -> dict[str, Any]:
        return {name: v.tolist() for name, v in self.stats.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [name for name in self.FIELDS if name not in state]
        if missing:
            raise StateError(f"saved step-time fit lacks {missing}; it was written by another pdml-ray version")
        loaded = {name: np.asarray(state[name], dtype=np.float64) for name in self.FIELDS}
        for name, v in loaded.items():
            if v.shape != self.stats[name].shape:
                raise StateError(f"saved step-time fit has {v.shape[0] if v.ndim else 0} workers, this run has "
                                 f"{self.stats[name].shape[0]}; resume with the same number of workers")
        self.stats = loaded
        self._stale[:] = True
