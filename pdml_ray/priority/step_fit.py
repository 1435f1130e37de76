"""Step-time fits behind node priorities: per-worker lines ``t(b) = c + b / r`` and their uncertainty.

``StepTimeFit`` holds every worker's recency-weighted least-squares line (the measure step of
``pdml_ray.priority.node``, whose deriver decides from it), ``LineFit`` is one worker's fitted line
with its covariance, and ``student_quantile`` the t quantile the deriver's noise gate uses while a
fit's noise estimate rests on few reports. Pure numpy; deterministic given the reports.

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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdml_ray.errors import StateError

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


def student_quantile(z: float, dof: float) -> float:
    """The Student-t quantile with ``dof`` degrees of freedom at the normal quantile ``z`` (Cornish-Fisher
    expansion: within 4% for dof >= 3; below that smaller than the exact quantile, 7.2 instead of 12.7
    for z = 1.96 at dof = 1, where ``dof`` is floored).

    The gate estimates the noise from few reports early on; a t quantile keeps its false-switch rate
    near that of ``z`` standard errors with a known noise."""
    nu = max(dof, 1.0)
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


class StepTimeFit:
    """Per-worker recency-weighted least-squares lines ``t = c + b * s`` (s = 1/r, c >= 0, r > 0).

    Sufficient statistics per worker, each report forgotten by ``1 - alpha`` per later report:
    total weight ``w`` and squared weight ``w2`` (for n_eff), weighted means of b and t, and the
    centred scatter ``bb, bt, tt`` (West's update, stable where raw sums cancel). ``noise_prior`` is
    the decaying weight of the noise prior. O(1) per report; deterministic given the reports.
    Each worker's fitted line is kept until its next report (a decision or a stats read at 256 workers
    refitted all 256 lines, ~3 ms, where between decisions a fraction of the workers reported).
    """

    FIELDS = ("w", "w2", "mean_b", "mean_t", "bb", "bt", "tt", "noise_prior")

    def __init__(self, num_workers: int, alpha: float) -> None:
        self.forget = 1.0 - float(alpha)
        self.stats = {name: np.zeros(num_workers) for name in self.FIELDS}
        self.stats["noise_prior"][:] = NOISE_PRIOR_REPORTS
        self._lines: list[LineFit | None] = [None] * num_workers  # fitted lines, until the worker's next report

    @property
    def measured(self) -> np.ndarray:
        return self.stats["w"] > 0

    @property
    def all_measured(self) -> bool:
        return bool(self.measured.all())

    @property
    def values(self) -> np.ndarray:
        """Per-sample rates r_i (samples/s), NaN until measured (the view the EMA used to give)."""
        return np.array([self.fit(i).rate if m else np.nan for i, m in enumerate(self.measured)])

    def update(self, i: int, b: float, t: float, line: LineFit | None = None) -> None:
        """Fold one report in; a time far off the worker's line is first pulled back to the clip bound.
        ``line`` is the worker's fit to clip against (default: fitted now); ``ingest`` passes the fit as
        of the start of a batch of reports, one fit per worker per batch rather than one per report."""
        s, lam = self.stats, self.forget
        if s["w"][i] > 0:
            line = line or self.fit(i)
            if line.noise_dof > 0.0:  # without a noise estimate (ema_alpha = 1) nothing is an outlier
                pred = line.predict(b)
                bound = max(OUTLIER_SIGMAS * math.sqrt(line.noise_var + line.predict_var(b)), OUTLIER_FLOOR * pred)
                t = min(max(t, pred - bound), pred + bound)
        old_w = lam * s["w"][i]
        w = old_w + 1.0
        db, dt = b - s["mean_b"][i], t - s["mean_t"][i]
        f = old_w / w
        s["bb"][i] = lam * s["bb"][i] + f * db * db
        s["bt"][i] = lam * s["bt"][i] + f * db * dt
        s["tt"][i] = lam * s["tt"][i] + f * dt * dt
        s["mean_b"][i] += db / w
        s["mean_t"][i] += dt / w
        s["w"][i] = w
        s["w2"][i] = lam * lam * s["w2"][i] + 1.0
        s["noise_prior"][i] *= lam
        self._lines[i] = None

    def reset(self, i: int) -> None:
        """Forget worker i's reports (its next report starts a fresh line, with a fresh noise prior)."""
        for name, v in self.stats.items():
            v[i] = NOISE_PRIOR_REPORTS if name == "noise_prior" else 0.0
        self._lines[i] = None

    def fit(self, i: int) -> LineFit:
        """The worker's line; requires at least one report."""
        line = self._lines[i]
        if line is None:
            line = self._lines[i] = self._fit(i)
        return line

    def _fit(self, i: int) -> LineFit:
        s = {name: float(v[i]) for name, v in self.stats.items()}
        w, bb, bt, tt, b0, t0 = s["w"], s["bb"], s["bt"], s["tt"], s["mean_b"], s["mean_t"]
        bb = max(bb, 0.0)
        n_eff = w * w / s["w2"]
        prior_var = (NOISE_PRIOR_FRACTION * t0) ** 2
        ridge_sd2 = (FIXED_COST_PRIOR_FRACTION * t0) ** 2
        prop = t0 / b0  # slope of the proportional model through the mean
        noise_var = prior_var
        fixed = slope = ridge = noise_dof = 0.0
        for _ in range(3):  # the ridge's strength follows the noise estimate, which follows the fit
            # Posterior of (c, s) with prior c ~ N(0, ridge_sd2): the forgetting weights are not
            # inverse variances, so the information of the weighted sums is scaled by n_eff / w.
            ridge = noise_var * w / (n_eff * ridge_sd2)
            kappa = w * ridge / (w + ridge)  # what is left of the ridge once c is eliminated
            spread = bb + kappa * b0 * b0  # 0 only with one batch size and no noise: then c = 0
            slope = prop + (bt - prop * bb) / spread if spread > 0 else prop
            fixed = w / (w + ridge) * (t0 - b0 * slope)
            if fixed < 0.0:  # c >= 0: the best line through the origin
                fixed, slope = 0.0, (bt + w * b0 * t0) / (bb + w * b0 * b0)
            if slope < MIN_SLOPE_FRACTION * prop:  # r finite: the per-sample part cannot vanish
                slope = MIN_SLOPE_FRACTION * prop
                fixed = max(w / (w + ridge) * (t0 - b0 * slope), 0.0)
            rss = max(tt - 2.0 * slope * bt + slope * slope * bb + w * (t0 - fixed - slope * b0) ** 2, 0.0)
            params = 1.0 + (bb / (bb + kappa * b0 * b0) if bb > 0 else 0.0)  # the slope counts once identified
            dof = max(n_eff - params, 0.0)
            noise_dof = s["noise_prior"] + dof
            noise_var = (s["noise_prior"] * prior_var + rss * n_eff / w) / noise_dof if noise_dof > 1e-12 else 0.0
        # Covariance of (c, s): noise_var * (w / n_eff) * (M + ridge e0 e0^T)^-1 with
        # M = [[w, w b0], [w b0, bb + w b0^2]] (the normal equations in raw moments).
        m00, m01, m11 = w + ridge, w * b0, bb + w * b0 * b0
        det = m00 * m11 - m01 * m01
        scale = noise_var * w / n_eff
        if scale > 0.0 and det > 0.0:
            cov = (scale * m11 / det, -scale * m01 / det, scale * m00 / det)
        else:
            cov = (0.0, 0.0, 0.0)
        return LineFit(fixed_s=fixed, slope=slope, mean_b=b0, mean_t=t0, noise_var=noise_var, noise_dof=noise_dof,
                       cov=cov)

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
        self._lines = [None] * len(self._lines)
