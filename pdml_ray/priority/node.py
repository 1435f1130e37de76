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
steps are ignored. The constraints are c >= 0 and r > 0. The fit, how it tells the fixed cost from
the rate (identifiability) and how it estimates its noise, is in ``pdml_ray.priority.step_fit``.
Before a worker's first measurement the accelerator prior stands in (relative speeds, no fixed
cost), as before.

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

Batch floor. A model whose BatchNorm layers normalise over each worker's own batch needs enough samples
per worker for those statistics to hold; ``prepare_model`` announces a floor for it
(``NodePriorityConfig.batchnorm_min_batch``) through ``Scheduler.set_shape("node", {"min_batch": n})``,
capped at the uniform share ``B // n`` (node priorities never make the statistics worse than uniform
shares would). Every later decision keeps every worker at or above it, and a decision in force that is
below it is re-derived at the next boundary without the noise gate (it is a constraint, not noise).

Forward-only samples. Under Selective-Backprop a worker's loop may forward its whole batch and run
backward on the high-loss share only; the rest cost a forward pass (``WorkerReport.forward_only``). The
fit's batch axis is then cost in trained-sample equivalents, ``u = trained + phi * forward_only`` with
``phi = FORWARD_COST_SHARE``, so each line's rate is the worker's speed whatever share of its batch
it trained, and a worker that skipped more backward passes is not taken for a faster one and
over-fed. phi is a constant, not fitted: fitting it per worker needs reports whose forward-only share
varies apart from the batch size, and with each worker's own percentile that share stays near
``1 - backprop_share`` at every step, so it cannot be told from the rate; a constant is right wherever
the model's backward costs about twice its forward. The balance needs lines over samples: the lines
are read at the cluster's recent cost per sample, ``m = sum u / sum b`` over every worker's reports
(each worker's forgotten like its fit), ``t_i(b) = c_i + b m / r_i``. The share of a worker's next
batch that trains is the data's (the cluster's percentile trains the high-loss samples wherever they
fall), so one m for every worker; with no forward-only sample reported m = 1 and every decision is
what it was without them. ``ctx.step`` reports them where the loop picks its rows with
``step.backprop_rows`` (the batch forwarded without gradients, the chosen rows forwarded and
backpropagated again, the paper's loop; ``pdml_ray.train.step``), none in its masked form (backward
over the whole batch). That loop pays phi more per trained sample than u counts; the lines absorb
that into the rate, so workers whose forward-only shares differ a lot are
then balanced within ~12% (f = 0 against 0.7), where counting every sample as trained is 2x off.

Limits. At a fixed point of the balance every worker runs one batch size; the spread that identified
c is then forgotten and the fit shrinks back to the proportional model, which has the same fixed
point (equal step times), so decisions hold; ``NodeStats.fixed_costs`` then reads ~0. After a
worker's speed changes, its line through old and new sizes mixes both regimes until the old reports
are forgotten (about ``2 / ema_alpha`` reports), and decisions in that window can miss the optimum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdml_ray.batching import balance_affine, predicted_step_s, round_to_batch_sizes
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, NodeDecision, WorkerReport
from pdml_ray.errors import ReportError, StateError, shown
from pdml_ray.priority.base import Deriver, GaugeValue
from pdml_ray.priority.step_fit import FittedLines, StepTimeFit, student_quantile

PROBE_AFTER = 10
"""With ``min_batch = 0``, a worker rounded to 0 samples measures nothing; after this many boundaries
at 0 it gets 1 sample for one interval (a probe), its stale line is dropped and refitted from the
probe's reports. Each probe that leaves it idle again doubles the wait (up to ``PROBE_AFTER_MAX``)."""
PROBE_AFTER_MAX = 640
FORWARD_COST_SHARE = 1.0 / 3.0
"""phi: a forward-only sample's compute time as a fraction of a trained one's (forward + backward).
Backward costs about twice the forward (gradients for the activations and for the weights): 1/3.
Measured on an MLP on the CPU: a no-grad forward takes 0.32 of a forward + backward."""


def trained_equivalents(report: WorkerReport) -> float:
    """The report's cost in trained samples: ``trained + phi * forward_only`` (module docstring)."""
    fo = report.forward_only
    return float(report.samples) if fo == 0 else float(report.samples - fo) + FORWARD_COST_SHARE * fo


@dataclass(frozen=True, slots=True)
class NodeStats:
    """What the node deriver knows: the current decision's sizes and the step-time model behind them."""

    batch_sizes: tuple[int, ...]
    grad_weights: tuple[float, ...]
    shares: tuple[float, ...]
    """Un-rounded shares of the global batch (sum to 1): each worker's node priority."""
    rates: tuple[float, ...]
    """Per-sample rates r_i (samples/s) of the model t_i(b) = c_i + b / r_i, or the accelerator prior's
    relative speeds. With a fixed cost a worker's throughput at batch b, b / t_i(b), is below r_i. With
    forward-only samples, at the cluster's recent mix of them (``NodePriorityDeriver.units_per_sample``)."""
    fixed_costs: tuple[float, ...]
    """Fixed costs c_i (seconds per step) of the same model; zeros on the prior."""
    rate_source: str
    """'measured' once every worker has been measured, else 'prior'."""
    accelerator_types: tuple[str, ...]
    min_batch: int = 0
    """The smallest batch any worker gets: ``min_batch`` or a model's announced floor (BatchNorm), the larger."""

    def summary_lines(self) -> list[str]:
        lines = [f"node priorities (step time c + b / r, {self.rate_source}; every batch >= {self.min_batch})",
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
    lines: FittedLines | None = None
    """The fits, when measured (their uncertainty drives the noise gate)."""


class NodePriorityDeriver(Deriver):
    """Turns worker reports into NodeDecisions. Pure: no Ray, no clocks, no I/O."""

    name = "node"

    def __init__(self, config: PDMLConfig, num_workers: int, accelerator_types: Sequence[str] | None = None):
        super().__init__(config, num_workers)
        self.node_config = cfg = config.node
        cfg.check_workers(num_workers)
        self.accelerator_types = list(accelerator_types or ["CPU"] * num_workers)
        self.fit = StepTimeFit(num_workers, cfg.ema_alpha)
        # the cost mix: per worker, its reports' trained-sample equivalents and samples, forgotten like its fit
        # (Python floats: ~0.1 us a report where a numpy update costs ~1.7 us)
        self.mix: tuple[list[float], list[float]] = ([0.0] * num_workers, [0.0] * num_workers)
        self.floor = 0  # the model's announced batch floor (on_shape), already capped at B // n
        self.current = self._decide_from(self.step_model())
        self.idle_boundaries = np.zeros(num_workers, dtype=np.int64)  # boundaries each worker has had 0 samples
        self.probe_after = np.full(num_workers, PROBE_AFTER, dtype=np.int64)
        self.refit = np.zeros(num_workers, dtype=bool)  # probed: drop the stale line at its next measurement

    # -- measure ---------------------------------------------------------------------------------
    def on_register(self, worker_id: int, accelerator_type: str) -> None:
        """Record a worker's accelerator type; while on the prior, the next boundary re-derives it."""
        self.accelerator_types[worker_id] = accelerator_type

    def on_shape(self, shape: Mapping[str, Any]) -> None:
        """The model's batch floor, ``{"min_batch": n}`` (``prepare_model`` announces it for BatchNorm
        layers), capped at the uniform share ``B // num_workers``; the next boundary enforces it."""
        floor = shape.get("min_batch") if isinstance(shape, Mapping) and set(shape) == {"min_batch"} else None
        if not (isinstance(floor, int) and not isinstance(floor, bool) and 0 <= floor <= self.node_config.batch):
            raise ReportError("the node axis takes the shape {'min_batch': n}, a batch floor from 0 to the global "
                              f"batch size {self.node_config.batch}; got {shown(shape, 80)}")
        self.floor = min(floor, self.node_config.batch // self.num_workers)

    @property
    def min_batch(self) -> int:
        """The smallest batch a decision gives any worker: ``min_batch`` or the announced floor."""
        return max(self.node_config.min_batch, self.floor)

    def prior_rates(self) -> np.ndarray:
        """Relative speeds from the accelerator prior; unknown types count as the median known speed."""
        table = self.node_config.accelerator_prior()
        known = [table[a] for a in self.accelerator_types if a in table]
        fallback = float(np.median(known)) if known else 1.0
        return np.array([table.get(a, fallback) for a in self.accelerator_types], dtype=np.float64)

    def ingest(self, reports: Sequence[WorkerReport]) -> None:
        """Fold accepted reports into the step-time fits (warm-up steps are not representative)."""
        warmup, forget = self.node_config.warmup_steps, 1.0 - self.node_config.ema_alpha
        rows: list[tuple[int, float, float]] = []  # (worker, trained-sample equivalents, compute seconds)
        types, (mix_u, mix_b) = self.accelerator_types, self.mix
        probed = bool(self.refit.any())  # most batches have no probed worker: no numpy lookup per report then
        for r in reports:
            w = r.worker_id
            if r.accelerator_type != types[w]:  # e.g. after a restart
                self.on_register(w, r.accelerator_type)
            if r.step >= warmup:
                if probed and self.refit[w] and r.samples > 0:  # the first measurement of a probe: a fresh line
                    self.fit.reset(w)
                    self.refit[w] = False
                    rows = [row for row in rows if row[0] != w]  # what it reported before went with the old line
                units = trained_equivalents(r)
                rows.append((w, units, float(r.compute_s)))
                mix_u[w] = forget * mix_u[w] + units
                mix_b[w] = forget * mix_b[w] + r.samples
        self.fit.ingest(rows)

    # -- derive ----------------------------------------------------------------------------------
    @property
    def units_per_sample(self) -> float:
        """m: the cluster's recent cost of a sample in trained-sample equivalents (1 with no forward-only
        samples; 1 - (1 - phi) f with a share f forward-only)."""
        units, samples = sum(self.mix[0]), sum(self.mix[1])
        return units / samples if samples > 0 else 1.0

    def step_model(self) -> StepModel:
        """The per-worker lines over samples: fitted once every worker has been measured (read at the
        cluster's cost per sample, ``units_per_sample``), else the prior's speeds."""
        if self.fit.all_measured:
            lines = self.fit.lines()
            m = self.units_per_sample
            if m != 1.0:
                lines = lines.per_sample(m)
            return StepModel(fixed_s=lines.fixed_s, rates=lines.rates, source="measured", lines=lines)
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
        # a prior that changed (a worker said its type) is not noise, nor is a floor the current sizes break: no gate
        below_floor = min(self.current.batch_sizes) < self.min_batch
        if model.source == "measured" and not below_floor and not self.worth_switching(
                model, self.current.batch_sizes, candidate.batch_sizes):
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
            if sizes[donor] <= max(self.min_batch, 1):
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
        uncertainty and by more than the hysteresis floor? (Over the changed workers at once.)"""
        cfg = self.node_config
        lines = model.lines
        assert lines is not None, "the gate needs measured lines"
        b_now, b_new = np.asarray(current, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
        changed = np.flatnonzero(b_new != b_now)
        if changed.size == 0:
            return False
        b_now, b_new = b_now[changed], b_new[changed]
        now = lines.predict(changed, b_now)  # (changed,) predicted step times as things stand (s)
        k = int(np.argmax(now))  # the slowest changed worker, as things stand (the lowest index among equals)
        j = int(changed[k])
        gains = now[k] - lines.predict(changed, b_new)
        var = lines.predict_var(changed, b_now)  # (changed,) s^2
        total = var + var[k]
        # j's own time can only fall: the others decide whether the gain is noise
        gated = (changed != j) & (total > 0.0)
        if gated.any():
            # Welch-Satterthwaite degrees of freedom of the difference, from the variances' fractions of
            # their sum (in [0, 1], one of them >= 1/2): squaring the variances themselves underflowed to
            # 0 / 0 once noise-free fits had forgotten their noise prior (~1e-165 s^2; 64 workers, step ~3,400)
            total = total[gated]
            fj, fi = var[k] / total, var[gated] / total
            dof = 1.0 / (fj * fj / max(float(lines.noise_dof[j]), 1e-12)
                         + fi * fi / np.maximum(lines.noise_dof[changed[gated]], 1e-12))
            if np.any(gains[gated] <= student_quantile(cfg.decision_confidence, dof) * np.sqrt(total)):
                return False
        step_now = predicted_step_s(current, model.rates, model.fixed_s)
        return float(gains.min()) > cfg.hysteresis * step_now

    def _decide_from(self, model: StepModel) -> NodeDecision:
        """An unstamped decision (version and effective step 0: the scheduler stamps them)."""
        cfg = self.node_config
        fixed, rates, source = model.fixed_s, model.rates, model.source
        if not cfg.enabled:
            fixed, rates = np.zeros(self.num_workers), np.ones(self.num_workers)
            source = "uniform (node priorities disabled)"
        target = balance_affine(fixed, rates, cfg.batch, self.min_batch, cfg.max_batch)
        shares = target / target.sum()
        sizes = round_to_batch_sizes(shares, cfg.batch, self.min_batch, cfg.max_batch)
        sizes = shorten_bottleneck(sizes, fixed, rates, self.min_batch, cfg.max_batch)
        return NodeDecision.from_sizes(0, 0, sizes, shares, reason=source)

    def stats(self) -> NodeStats:
        model = self.step_model()
        d = self.current
        return NodeStats(batch_sizes=d.batch_sizes, grad_weights=d.grad_weights, shares=d.shares,
                         rates=tuple(float(r) for r in model.rates),
                         fixed_costs=tuple(float(c) for c in model.fixed_s), rate_source=model.source,
                         accelerator_types=tuple(self.accelerator_types), min_batch=self.min_batch)

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"fit": self.fit.state_dict(), "mix": [list(self.mix[0]), list(self.mix[1])],
                "decision": self.current.to_dict(), "accelerator_types": list(self.accelerator_types),
                "floor": self.floor,
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
        floor = state.get("floor", 0)  # absent in states written before models announced a floor
        if not (isinstance(floor, int) and not isinstance(floor, bool) and 0 <= floor <= self.node_config.batch):
            raise StateError(f"saved node state has batch floor {shown(floor)}; expected an integer from 0 to the "
                             f"global batch size {self.node_config.batch}")
        self.floor = min(floor, self.node_config.batch // self.num_workers)
        saved = state.get("mix")  # absent in states written before forward-only samples counted
        try:
            mix = np.zeros((2, self.num_workers)) if saved is None else np.asarray(saved, dtype=np.float64)
        except (TypeError, ValueError):
            mix = np.full(1, np.nan)
        units, samples = mix if mix.shape == (2, self.num_workers) else (np.array([np.nan]), np.array([np.nan]))
        # each report adds u in [phi b, b]: so does each worker's sum (1e-9: rounding)
        if not (np.all(samples >= 0.0) and np.all(samples < np.inf) and np.all(units <= samples * (1.0 + 1e-9))
                and np.all(units >= FORWARD_COST_SHARE * samples * (1.0 - 1e-9))):
            raise StateError(f"saved node state has cost mix {shown(saved)}; expected per worker [trained-sample "
                             f"equivalents u, samples b], {self.num_workers} each, with {FORWARD_COST_SHARE:.4g} b <= "
                             "u <= b")
        self.mix = (units.tolist(), samples.tolist())
        self.current = decision
        self.accelerator_types = list(state["accelerator_types"])


SHORTEN_MOVES = 32
"""Most one-sample moves ``shorten_bottleneck`` makes (each is O(workers)); rounding leaves a few."""


def shorten_bottleneck(sizes: np.ndarray, fixed_s: np.ndarray, rates: np.ndarray, min_batch: int,
                       max_batch: int | None) -> np.ndarray:
    """Integer sizes whose predicted step ``max_i c_i + b_i / r_i`` is no longer than that of ``sizes``:
    one sample at a time goes from the predicted slowest worker to the one that would be fastest with it,
    while that shortens the slowest worker's step. Rounding balanced shares by their remainders can give
    a worker of coarse samples (a slow rate: one sample is milliseconds) the one sample that makes it the
    bottleneck: at c = (0, 0, 20 ms), r = (8312, 304, 7951) samples/s and B = 360 it gave (260, 10, 90),
    32.9 ms, where (261, 9, 90) runs 31.4 ms, and as the current sizes were as slow, no switch paid."""
    b = np.asarray(sizes, dtype=np.int64).copy()
    hi = np.inf if max_batch is None else max_batch
    for _ in range(SHORTEN_MOVES):
        t = np.where(b > 0, fixed_s + b / rates, 0.0)
        j = int(np.argmax(t))
        up = np.where(b < hi, fixed_s + (b + 1) / rates, np.inf)
        up[j] = np.inf
        i = int(np.argmin(up))
        if b[j] <= min_batch or not up[i] < t[j]:
            break
        b[j] -= 1
        b[i] += 1
    return b


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
