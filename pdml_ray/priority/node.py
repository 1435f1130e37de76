"""Node priorities: per-worker batch sizes and gradient weights that balance predicted step times.

measure -> derive -> decide:

Measure. Each worker's compute time is modelled as an affine function of its batch size,
``t_i(b) = c_i + b / r_i``: a fixed cost per step (kernel launches, the optimizer, Python) plus a
per-sample rate. A proportional model ``b / r`` cannot tell the two apart, so with fixed costs it
mispredicts every batch size but the one measured, and one noisy step moves it a lot. The line is
fitted per worker from the batch sizes it has actually run (as Cannikin does), by recency-weighted
least squares (``StepTimeFit``): each report (b, t) is folded into exponentially forgotten
sufficient statistics (weight, means of b and t, their centred scatter; O(1) per report), older
reports counting ``1 - ema_alpha`` times less per report. Reports from the first ``warmup_steps``
steps are ignored. The constraints are c >= 0 and r > 0.

Identifiability. A worker that has run one batch size only (or too little spread) does not tell its
fixed cost from its rate. A ridge prior on c, centred on 0 with a standard deviation of half the
worker's mean step time, shrinks the fit towards the proportional model in that case; it is a
proper Gaussian prior against the fit's own noise estimate, so it fades as soon as the data's spread
identifies c (noise-free data with any spread is fitted exactly once the noise prior below is
forgotten) and holds while it does not. With
one batch size the fit is exactly ``c = 0, r = b / mean(t)``: the old rate model. Before a worker's
first measurement the accelerator prior stands in (relative speeds, no fixed cost), as before.

Noise. Each fit estimates its residual variance (unbiased for the effective number of observations
``n_eff = (sum w)^2 / sum w^2``), starting from a weak prior worth two reports of 10% step-time noise
that is forgotten like a report, so the first decisions are not taken on two lucky identical steps.
Parameter covariances follow from the same quantities. A report more than 3 standard deviations (and
more than 10%) off its worker's line is clipped to that bound before it is folded in (winsorised
least squares): one step slowed by contention, garbage collection or I/O moves the fit by a bounded
amount, while a lasting change of speed still comes through within a couple of dozen reports.

Balance. Real-valued sizes that minimise the predicted step time ``max_i c_i + b_i / r_i`` within
``[min_batch, max_batch]`` come from water-filling on the level T (``batching.balance_affine``);
``round_to_batch_sizes`` turns them into integers that sum exactly to B (largest remainder). The
real-valued sizes over B are the decision's ``shares``; gradient weights are ``b_i / B``, so the
weighted SUM all-reduce of per-worker mean gradients equals the mean gradient over the global batch.

Decide (the noise gate). A measured candidate replaces the current sizes only if it is predicted
faster with confidence. Let j be the slowest, by prediction, of the workers whose size changes (an
unchanged worker runs the same batch either way, so it cannot tell the two apart). Every other
changed worker i must be predicted, under the candidate, below j's current time by more than
``decision_confidence`` standard errors of that difference, from the uncertainty of both workers'
fitted times at their current sizes (each fit's residual variance over its effective number of
reports); while those variances rest on few reports, the Student-t quantile that corresponds to
``decision_confidence`` replaces it (Welch's degrees of freedom). j's own time only falls when it
gives samples away. The slopes count at their estimates:
adding the slopes' uncertainty to the gate held sizes away from the optimum after a worker's speed
changed without reducing churn, in simulation. The gain must also exceed ``hysteresis`` times the
current predicted step time: a floor for gains too small to be worth a switch even when certain.
A changed prior (a worker said its type) is not noise and is published without the gate. With
``ema_alpha = 1`` (newest report only) there is no noise estimate and only the floor applies.

Idle workers. With ``min_batch = 0`` a worker can be given 0 samples; its reports (0 samples) measure
nothing, so its line would never learn that it became fast. After ``PROBE_AFTER`` boundaries at 0 it
is given 1 sample (taken from the largest batch) for one interval without the noise gate, and its old
line is replaced by one fitted from the probe's reports; a probe that leaves it idle doubles the wait.

Limits. At a fixed point of the balance every worker runs one batch size; the spread that identified
c is then forgotten and the fit shrinks back to the proportional model, which has the same fixed
point (equal step times), so decisions hold; ``NodeStats.fixed_costs`` then reads ~0. After a
worker's speed changes, its line through old and new sizes mixes both regimes until the old reports
are forgotten (about ``2 / ema_alpha`` reports), and decisions in that window can miss the optimum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdml_ray.batching import balance_affine, predicted_step_s, round_to_batch_sizes
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, NodeDecision, WorkerReport
from pdml_ray.errors import StateError
from pdml_ray.priority.base import Deriver, GaugeValue

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
PROBE_AFTER = 10
"""With ``min_batch = 0``, a worker rounded to 0 samples measures nothing; after this many boundaries
at 0 it gets 1 sample for one interval (a probe), its stale line is dropped and refitted from the
probe's reports. Each probe that leaves it idle again doubles the wait (up to ``PROBE_AFTER_MAX``)."""
PROBE_AFTER_MAX = 640


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
    """

    FIELDS = ("w", "w2", "mean_b", "mean_t", "bb", "bt", "tt", "noise_prior")

    def __init__(self, num_workers: int, alpha: float) -> None:
        self.forget = 1.0 - float(alpha)
        self.stats = {name: np.zeros(num_workers) for name in self.FIELDS}
        self.stats["noise_prior"][:] = NOISE_PRIOR_REPORTS

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

    def reset(self, i: int) -> None:
        """Forget worker i's reports (its next report starts a fresh line, with a fresh noise prior)."""
        for name, v in self.stats.items():
            v[i] = NOISE_PRIOR_REPORTS if name == "noise_prior" else 0.0

    def fit(self, i: int) -> LineFit:
        """The worker's line; requires at least one report."""
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


@dataclass(frozen=True, slots=True)
class NodeStats:
    """What the node deriver knows: the current decision's sizes and the step-time model behind them."""

    batch_sizes: tuple[int, ...]
    grad_weights: tuple[float, ...]
    shares: tuple[float, ...]
    """Un-rounded shares of the global batch (sum to 1): each worker's node priority."""
    rates: tuple[float, ...]
    """Per-sample rates r_i (samples/s) of the model t_i(b) = c_i + b / r_i, or the accelerator prior's
    relative speeds. With a fixed cost a worker's throughput at batch b, b / t_i(b), is below r_i."""
    fixed_costs: tuple[float, ...]
    """Fixed costs c_i (seconds per step) of the same model; zeros on the prior."""
    rate_source: str
    """'measured' once every worker has been measured, else 'prior'."""
    accelerator_types: tuple[str, ...]

    def summary_lines(self) -> list[str]:
        lines = [f"node priorities (step time c + b / r, {self.rate_source})",
                 f"{'worker':>6}  {'accelerator':<12} {'priority':>8} {'batch':>6} {'grad weight':>11} "
                 f"{'rate r':>10} {'fixed c (s)':>11}"]
        for i, (accel, share, size, weight, rate, fixed) in enumerate(zip(
                self.accelerator_types, self.shares, self.batch_sizes, self.grad_weights, self.rates, self.fixed_costs)):
            lines.append(f"{i:>6}  {accel:<12} {share:>8.3f} {size:>6} {weight:>11.4f} {rate:>10.4g} {fixed:>11.4g}")
        return lines

    def gauges(self) -> list[GaugeValue]:
        out = []
        for i, (share, size, weight, rate, fixed, accel) in enumerate(zip(
                self.shares, self.batch_sizes, self.grad_weights, self.rates, self.fixed_costs, self.accelerator_types)):
            tags = (("worker", str(i)), ("accelerator_type", accel))
            out += [GaugeValue("pdml_node_priority_ratio", "node priority: the worker's share of the global batch "
                               "(0-1)", share, tags),
                    GaugeValue("pdml_batch_size_samples", "the worker's batch size (samples per step)", size, tags),
                    GaugeValue("pdml_grad_weight_ratio", "the worker's gradient weight b_i/B in the all-reduce (0-1)",
                               weight, tags)]
            if self.rate_source == "measured":
                out += [GaugeValue("pdml_worker_rate_samples_per_second",
                                   "per-sample compute rate r of the worker's step time c + b / r", rate, tags),
                        GaugeValue("pdml_worker_fixed_cost_seconds",
                                   "fixed compute cost c per step of the worker's step time c + b / r", fixed, tags)]
        return out


@dataclass(frozen=True, slots=True)
class StepModel:
    """Per-worker step-time lines the deriver decides from, and where they come from."""

    fixed_s: np.ndarray
    rates: np.ndarray
    source: str
    lines: tuple[LineFit, ...] = ()
    """The fits, when measured (their uncertainty drives the noise gate)."""


class NodePriorityDeriver(Deriver):
    """Turns worker reports into NodeDecisions. Pure: no Ray, no clocks, no I/O."""

    name = "node"

    def __init__(self, config: PDMLConfig, num_workers: int, accelerator_types: Sequence[str] | None = None):
        super().__init__(config, num_workers)
        self.node_config = cfg = config.node_priority
        cfg.check_workers(num_workers)
        self.accelerator_types = list(accelerator_types or ["CPU"] * num_workers)
        self.fit = StepTimeFit(num_workers, cfg.ema_alpha)
        self.current = self._decide_from(self.step_model())
        self.idle_boundaries = np.zeros(num_workers, dtype=np.int64)  # boundaries each worker has had 0 samples
        self.probe_after = np.full(num_workers, PROBE_AFTER, dtype=np.int64)
        self.refit = np.zeros(num_workers, dtype=bool)  # probed: drop the stale line at its next measurement

    # -- measure ---------------------------------------------------------------------------------
    def on_register(self, worker_id: int, accelerator_type: str) -> None:
        """Record a worker's accelerator type; while on the prior, the next boundary re-derives it."""
        self.accelerator_types[worker_id] = accelerator_type

    def prior_rates(self) -> np.ndarray:
        """Relative speeds from the accelerator prior; unknown types count as the median known speed."""
        table = self.node_config.accelerator_prior()
        known = [table[a] for a in self.accelerator_types if a in table]
        fallback = float(np.median(known)) if known else 1.0
        return np.array([table.get(a, fallback) for a in self.accelerator_types], dtype=np.float64)

    def ingest(self, reports: Sequence[WorkerReport]) -> None:
        """Fold accepted reports into the step-time fits (warm-up steps are not representative)."""
        lines: dict[int, LineFit] = {}  # each worker's fit at the start of this batch: the clip reference
        for r in reports:
            if r.accelerator_type != self.accelerator_types[r.worker_id]:  # e.g. after a restart
                self.on_register(r.worker_id, r.accelerator_type)
            if r.step >= self.node_config.warmup_steps:
                w = r.worker_id
                if self.refit[w] and r.samples > 0:  # the first measurement of a probe: a fresh line
                    self.fit.reset(w)
                    self.refit[w] = False
                    lines.pop(w, None)
                if w not in lines and self.fit.stats["w"][w] > 0:
                    lines[w] = self.fit.fit(w)
                self.fit.update(w, float(r.samples), float(r.compute_s), lines.get(w))

    # -- derive ----------------------------------------------------------------------------------
    def step_model(self) -> StepModel:
        """The per-worker lines: fitted once every worker has been measured, else the prior's speeds."""
        if self.fit.all_measured:
            lines = tuple(self.fit.fit(i) for i in range(self.num_workers))
            return StepModel(fixed_s=np.array([f.fixed_s for f in lines]), rates=np.array([f.rate for f in lines]),
                             source="measured", lines=lines)
        return StepModel(fixed_s=np.zeros(self.num_workers), rates=self.prior_rates(), source="prior")

    def rates(self) -> tuple[np.ndarray, str]:
        """Current per-sample rates (samples/s, or the prior's relative speeds) and their source."""
        model = self.step_model()
        return model.rates, model.source

    # -- decide ----------------------------------------------------------------------------------
    def initial(self) -> NodeDecision:
        return self.current

    def decide(self, boundary: Boundary, earlier: Mapping[str, Decision]) -> NodeDecision | None:
        """New sizes if they beat the current ones beyond the noise gate (a changed prior always)."""
        if not self.node_config.enabled:
            return None
        probe = self._probe()
        if probe is not None:
            self.current = probe
            return probe
        model = self.step_model()
        candidate = self._decide_from(model)
        if candidate.batch_sizes == self.current.batch_sizes:
            return None
        # a prior that changed (a worker said its type) is not noise: no gate
        if model.source == "measured" and not self.worth_switching(model, self.current.batch_sizes,
                                                                   candidate.batch_sizes):
            return None
        self.current = candidate
        self.probe_after[np.asarray(candidate.batch_sizes) > 0] = PROBE_AFTER  # measured again: back to the start
        return candidate

    def _probe(self) -> NodeDecision | None:
        """The current sizes with 1 sample for every worker idle for its ``probe_after`` boundaries (taken
        from the largest batches), or None when none is due (module docstring, "Idle workers")."""
        sizes = np.array(self.current.batch_sizes, dtype=np.int64)
        idle = sizes == 0
        self.idle_boundaries = np.where(idle, self.idle_boundaries + 1, 0)
        due = np.flatnonzero(idle & (self.idle_boundaries >= self.probe_after))
        if due.size == 0:
            return None
        for w in due:
            donor = int(np.argmax(sizes))
            if sizes[donor] <= max(self.node_config.min_batch, 1):
                break  # nothing left to give (cannot happen while some worker is idle and B >= 1)
            sizes[donor] -= 1
            sizes[w] = 1
            self.refit[w] = True
            self.probe_after[w] = min(2 * self.probe_after[w], PROBE_AFTER_MAX)
            self.idle_boundaries[w] = 0
        total = int(sizes.sum())
        return NodeDecision.from_sizes(0, 0, sizes, sizes / total,
                                       reason=f"probe: re-measuring idle workers {due.tolist()}")

    def worth_switching(self, model: StepModel, current: Sequence[int], candidate: Sequence[int]) -> bool:
        """The noise gate (module docstring): is ``candidate`` predicted faster beyond the fits'
        uncertainty and by more than the hysteresis floor?"""
        cfg = self.node_config
        changed = [i for i in range(self.num_workers) if candidate[i] != current[i]]
        if not changed:
            return False
        lines = model.lines
        now = {i: lines[i].predict(current[i]) for i in changed}
        j = max(changed, key=lambda i: (now[i], -i))  # the slowest changed worker, as things stand
        step_now = predicted_step_s(current, model.rates, model.fixed_s)
        gains = []
        for i in changed:
            gain = now[j] - lines[i].predict(candidate[i])
            if i != j:  # j's own time can only fall: the others decide whether the gain is noise
                var_j, var_i = lines[j].predict_var(current[j]), lines[i].predict_var(current[i])
                if var_i + var_j > 0.0:
                    # Welch-Satterthwaite degrees of freedom of the difference
                    dof = (var_i + var_j) ** 2 / (var_j ** 2 / max(lines[j].noise_dof, 1e-12)
                                                   + var_i ** 2 / max(lines[i].noise_dof, 1e-12))
                    if gain <= student_quantile(cfg.decision_confidence, dof) * math.sqrt(var_i + var_j):
                        return False
            gains.append(gain)
        return min(gains) > cfg.hysteresis * step_now

    def _decide_from(self, model: StepModel) -> NodeDecision:
        """An unstamped decision (version and effective step 0: the scheduler stamps them)."""
        cfg = self.node_config
        fixed, rates, source = model.fixed_s, model.rates, model.source
        if not cfg.enabled:
            fixed, rates = np.zeros(self.num_workers), np.ones(self.num_workers)
            source = "uniform (node priorities disabled)"
        target = balance_affine(fixed, rates, cfg.batch, cfg.min_batch, cfg.max_batch)
        shares = target / target.sum()
        sizes = round_to_batch_sizes(shares, cfg.batch, cfg.min_batch, cfg.max_batch)
        return NodeDecision.from_sizes(0, 0, sizes, shares, reason=source)

    def stats(self) -> NodeStats:
        model = self.step_model()
        d = self.current
        return NodeStats(batch_sizes=d.batch_sizes, grad_weights=d.grad_weights, shares=d.shares,
                         rates=tuple(float(r) for r in model.rates),
                         fixed_costs=tuple(float(c) for c in model.fixed_s), rate_source=model.source,
                         accelerator_types=tuple(self.accelerator_types))

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"fit": self.fit.state_dict(), "decision": self.current.to_dict(),
                "accelerator_types": list(self.accelerator_types),
                "idle": {"boundaries": self.idle_boundaries.tolist(), "probe_after": self.probe_after.tolist(),
                         "refit": self.refit.tolist()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        decision = NodeDecision.from_dict(state["decision"])
        if len(decision.batch_sizes) != self.num_workers or len(state["accelerator_types"]) != self.num_workers:
            raise StateError(f"saved node state is for {len(decision.batch_sizes)} workers, this run has "
                             f"{self.num_workers}; resume with the same number of workers")
        if "fit" in state:
            self.fit.load_state_dict(state["fit"])
        else:  # a checkpoint from the rate-EMA era: one proportional observation per measured worker
            self.fit = StepTimeFit(self.num_workers, self.node_config.ema_alpha)
            saved = state["throughput"]
            for i, (rate, seen) in enumerate(zip(saved["values"], saved["measured"])):
                if seen and decision.batch_sizes[i] > 0:
                    self.fit.update(i, decision.batch_sizes[i], decision.batch_sizes[i] / rate)
        idle = state.get("idle")  # absent in states written before idle workers were probed
        if idle is not None:
            arrays = (np.asarray(idle["boundaries"], dtype=np.int64), np.asarray(idle["probe_after"], dtype=np.int64),
                      np.asarray(idle["refit"], dtype=bool))
            if any(a.shape != (self.num_workers,) for a in arrays):
                raise StateError(f"saved idle-worker state is not for {self.num_workers} workers; resume with the "
                                 "same number of workers")
            self.idle_boundaries, self.probe_after, self.refit = arrays
        self.current = decision
        self.accelerator_types = list(state["accelerator_types"])


def accelerator_from_gpu_name(gpu_name: str, known: Sequence[str]) -> str:
    """Map a device name like 'NVIDIA H100 80GB HBM3' to a prior key ('H100'); 'unknown:<name>' if none fits."""
    upper = gpu_name.upper()
    for key in sorted(known, key=len, reverse=True):  # longest first: 'L40S' before 'L4'
        if key.upper() in upper:
            return key
    return f"unknown:{gpu_name}"


def accelerator_from_resources(resources: dict[str, float]) -> str | None:
    """The accelerator type a Ray node advertises as an ``accelerator_type:X`` resource, if any."""
    for name in sorted(resources):
        if name.startswith("accelerator_type:"):
            return name.split(":", 1)[1]
    return None
