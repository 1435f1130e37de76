"""Gradient priorities: which workers' gradients a straggler-tolerant step applies first, and how many.

One priority per worker (its gradient of the step is the unit of work), combined from three signals,
each normalised by a running statistic of its own, so every term is a unit-free ratio near 1:

    grad_i = g_i / mean(g)      g_i: the worker's smoothed gradient norm (or ``priority_fn(report)``);
                                mean(g): a running mean over all workers' recent reports.
                                Higher = the worker's batch moves the model more = higher priority.
    data_i = l_i / mean(l)      with sample priorities on, l_i is the mean sample-table score (loss) of
                                the samples the worker last trained on and mean(l) the table's mean
                                score; without, l_i is the worker's smoothed reported loss over a
                                running mean of all reported losses. Higher loss = more difficult data
                                = higher priority.
    node_i = r_i / max_j r_j    r_i: the node deriver's per-sample rate (measured, or the accelerator
                                prior), in (0, 1]. Faster (healthier) = higher priority: in an
                                asynchronous step a slow node's gradient was computed on older
                                parameters, and a node that straggled tends to straggle again; the
                                term is bounded by 1, so it tilts but never dominates, and the
                                no-starvation bound below still applies every slow node's gradient.

    priority_i = alpha * grad_i + beta * data_i + gamma * node_i        (>= 0; (alpha, beta, gamma) on
                                                                        the simplex)

(The guide divides gradient norms by the mean of past *priorities*, which mixes units; here each
signal has its own normaliser. A worker not yet measured gets the neutral ratio 1.)

Weights. ``bandit.WeightBandit`` (discounted UCB over the prior and a small simplex grid) pulls one
weight vector per decision interval and is rewarded with the loss decrease per second between the
mean losses of consecutive intervals (seconds: the slowest worker's compute time per step, summed over
the interval's steps; no clocks). After every boundary's priorities are computed, the continuity
check (``ContinuityMonitor`` with ``GradientPriorityConfig.continuity``, defaults for few items) judges
them; when they are collapsed (too flat: the same priority for every worker; too peaked: effectively
fewer than 1.5 workers hold the mass) the bandit forgets its rewards, the weights return to the prior
for ``collapse_hold`` boundaries, the priorities are recomputed with the prior, and the reset is counted.
Until a runtime acts on the priorities (the straggler runtime's ``topk`` / ``async`` policies), the
rewards do not depend on the arm and the bandit only explores.

K. The convergence rate is the relative loss decrease per step between intervals, smoothed
(``progress_ema``); against the fastest smoothed rate seen so far, ``q = clip(rate / best, 0, 1)``:
``K = k_max - (k_max - k_min) * q``. Fast progress applies only the top gradients (tolerates
stragglers); as progress slows, K grows towards applying all of them (averaging more gradients cuts
the gradient noise that dominates near convergence). Before any progress is measured, K = k_max.

Selection (``select_topk``, pure): of the workers whose gradient arrived, every one not applied for
``max_wait`` steps is applied (no starvation), then the highest priorities up to ceil(K * arrived);
staleness (``staleness_weight``, pure): an async policy weighs a gradient s steps stale by 1 / (1 + s)
(a fresh one 1; the staleness-dependent step of Zhang et al. 2016) and refuses it (weight 0) beyond S.

Validation figure: at each boundary the workers are split at the median priority; the ratio of the
mean gradient norm of the top half to the bottom half, accumulated over boundaries, is in the stats
(the guide expects > 1.5 when gradient priorities carry information).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdml_ray.config import GradientPriorityConfig, PDMLConfig
from pdml_ray.config.gradient import load_priority_fn
from pdml_ray.decisions import Boundary, Decision, GradientDecision, Rejection, WorkerReport
from pdml_ray.errors import PlanError, ReportError, StateError
from pdml_ray.priority.bandit import WeightBandit, simplex_arms
from pdml_ray.priority.base import Deriver, GaugeValue
from pdml_ray.priority.continuity import ContinuityMonitor
from pdml_ray.priority.estimators import EMA

TERMS = ("grad", "data", "node")
INTERVAL_STEPS = 4096
"""Steps of the current decision interval whose slowest compute time is kept one by one (a late report
can still raise its step's maximum); beyond, the oldest half is folded into a count and a sum, so a run
that reports without boundaries holds at most this many (300,000 distinct steps grew it by 21 MB)."""


# -- normalisers ------------------------------------------------------------------------------------
class RunningMean:
    """Bias-corrected exponential moving average of a scalar stream (the newest value weighs ``alpha``):
    ``m <- (1 - a) m + a x``, ``w <- (1 - a) w + a``, value ``m / w``; so the first value is the mean at
    once, not ``a`` times it. NaN before any value."""

    def __init__(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self.total = 0.0
        self.weight = 0.0

    def update(self, x: float) -> None:
        self.total = (1.0 - self.alpha) * self.total + self.alpha * float(x)
        self.weight = (1.0 - self.alpha) * self.weight + self.alpha

    @property
    def value(self) -> float:
        return self.total / self.weight if self.weight > 0 else math.nan

    def state_dict(self) -> dict[str, float]:
        return {"total": self.total, "weight": self.weight}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.total, self.weight = float(state["total"]), float(state["weight"])


def relative_to_mean(values: np.ndarray, mean: float) -> np.ndarray:
    """``values / mean`` (shape (N,)); NaN values (unmeasured) and an unknown or zero mean give 1.0."""
    v = np.asarray(values, dtype=np.float64)
    if not (math.isfinite(mean) and mean > 0):
        return np.ones_like(v)
    return np.where(np.isfinite(v), np.maximum(v, 0.0) / mean, 1.0)


def relative_to_best(rates: np.ndarray) -> np.ndarray:
    """``rates / max(rates)`` in (0, 1] (shape (N,)); NaN rates (unmeasured) count as the best."""
    r = np.asarray(rates, dtype=np.float64)
    ok = np.isfinite(r) & (r > 0)
    if not ok.any():
        return np.ones_like(r)
    return np.where(ok, np.where(ok, r, 0.0) / float(r[ok].max()), 1.0)


def combine(terms: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Priorities (N,) = weights (3,) @ terms (3, N)."""
    return np.asarray(weights, dtype=np.float64) @ np.asarray(terms, dtype=np.float64)


def k_from_progress(rate: float, best_rate: float, k_min: float, k_max: float) -> float:
    """K = k_max - (k_max - k_min) * clip(rate / best_rate, 0, 1); k_max without a positive best rate."""
    if not (math.isfinite(rate) and math.isfinite(best_rate) and best_rate > 0):
        return k_max
    q = min(max(rate / best_rate, 0.0), 1.0)
    return k_max - (k_max - k_min) * q


# -- what a runtime policy calls --------------------------------------------------------------------
def select_topk(priorities: Sequence[float], arrived: Sequence[int], k_fraction: float,
                last_applied_step: Sequence[int], step: int, max_wait: int) -> tuple[int, ...]:
    """Workers whose arrived gradients to apply at ``step`` (sorted ids).

    Every arrived worker whose last application was ``max_wait`` or more steps ago (``last_applied_step``
    -1: never, as if applied at step -1) is chosen (the no-starvation bound: an arriving worker is
    applied at least once in any ``max_wait`` consecutive steps); the rest of the
    ``max(1, ceil(k_fraction * len(arrived)))`` places go to the highest priorities (ties: the longest
    waiting, then the lowest id). More than K workers are chosen when more are due.
    """
    p = np.asarray(priorities, dtype=np.float64)
    last = np.asarray(last_applied_step, dtype=np.int64)
    if p.shape != last.shape or p.ndim != 1:
        raise PlanError(f"select_topk: {p.shape} priorities vs {last.shape} last-applied steps; one of each per worker")
    if not (0.0 < k_fraction <= 1.0) or max_wait < 1:
        raise PlanError(f"select_topk: k_fraction {k_fraction} must be in (0, 1] and max_wait {max_wait} >= 1")
    ids = sorted({int(i) for i in arrived})
    if ids and (ids[0] < 0 or ids[-1] >= p.size):
        raise PlanError(f"select_topk: arrived workers {ids} outside 0..{p.size - 1}")
    if not ids:
        return ()
    k = max(1, math.ceil(k_fraction * len(ids) - 1e-9))
    due = [i for i in ids if step - last[i] >= max_wait]
    due_set = set(due)
    rest = sorted((i for i in ids if i not in due_set), key=lambda i: (-p[i], last[i], i))
    return tuple(sorted(due + rest[:max(0, k - len(due))]))


def mark_applied(last_applied_step: Sequence[int], chosen: Sequence[int], step: int) -> np.ndarray:
    """A copy of ``last_applied_step`` (int64 (N,)) with the ``chosen`` workers applied at ``step``."""
    out = np.array(last_applied_step, dtype=np.int64)
    out[list(chosen)] = step
    return out


def staleness_weight(staleness: int, max_staleness: int) -> float:
    """Weight of a gradient ``staleness`` steps old: 1 / (1 + s) for s <= S; 0.0 beyond: refused, drop it."""
    if isinstance(staleness, bool) or not isinstance(staleness, (int, np.integer)) or staleness < 0:
        raise PlanError(f"staleness must be an integer >= 0 steps (the step applied minus the step the gradient "
                        f"was computed on), got {staleness!r}")
    if max_staleness < 0:
        raise PlanError(f"max_staleness must be >= 0 steps, got {max_staleness!r}")
    return 1.0 / (1.0 + int(staleness)) if staleness <= max_staleness else 0.0


# -- stats ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GradientStats:
    """What the gradient deriver knows: the priorities, their terms, the weights, K, the resets."""

    priorities: tuple[float, ...]
    grad_terms: tuple[float, ...]
    """g_i / running mean of gradient norms."""
    data_terms: tuple[float, ...]
    """Loss (or sample-table score) over its running (or table) mean."""
    node_terms: tuple[float, ...]
    """r_i / max r."""
    weights: tuple[float, float, float]
    prior_weights: tuple[float, float, float]
    k_fraction: float
    collapse_resets: int
    collapsed_flat: int
    collapsed_peaked: int
    high_low_grad_norm_ratio: float
    """Mean gradient norm of the higher-priority half of the workers over the lower half, accumulated
    over boundaries (nan before a measured boundary; the guide expects > 1.5)."""
    progress_rate: float
    """Smoothed relative loss decrease per step (nan before two intervals with losses)."""
    last_reward: float
    """Loss decrease per second credited to the bandit at the last boundary (nan if none)."""
    arm: int
    arm_pulls: tuple[int, ...]
    data_source: str
    """'sample table' or 'reported loss'."""
    node_source: str
    """'measured', 'prior' or 'reported throughput'."""

    def summary_lines(self) -> list[str]:
        a, b, g = self.weights
        pa, pb, pg = self.prior_weights
        lines = [f"gradient priorities: weights ({a:.2f}, {b:.2f}, {g:.2f}) arm {self.arm} (prior "
                 f"({pa:.2f}, {pb:.2f}, {pg:.2f})), K {self.k_fraction:.2f}, collapse resets {self.collapse_resets} "
                 f"(flat {self.collapsed_flat}, peaked {self.collapsed_peaked}), high/low grad-norm ratio "
                 f"{self.high_low_grad_norm_ratio:.3g}; data: {self.data_source}, node: {self.node_source}",
                 f"{'worker':>6} {'priority':>8} {'grad':>6} {'data':>6} {'node':>6}"]
        for i, (p, gt, dt, nt) in enumerate(zip(self.priorities, self.grad_terms, self.data_terms, self.node_terms)):
            lines.append(f"{i:>6} {p:>8.3f} {gt:>6.3f} {dt:>6.3f} {nt:>6.3f}")
        return lines

    def gauges(self) -> list[GaugeValue]:
        out = [GaugeValue("pdml_gradient_priority", "gradient priority of the worker's gradients (a score; "
                          "higher is applied first)", p, (("worker", str(i)),)) for i, p in enumerate(self.priorities)]
        out += [GaugeValue("pdml_gradient_term_weight", "weight of a term in the gradient priority (alpha: grad, "
                           "beta: data, gamma: node)", w, (("term", t),)) for t, w in zip(TERMS, self.weights)]
        out += [GaugeValue("pdml_gradient_k_ratio", "fraction K of arrived gradients a top-K policy applies (0-1)",
                           self.k_fraction),
                GaugeValue("pdml_gradient_collapse_resets_total", "gradient priority weights reset to the prior after "
                           "a collapse", self.collapse_resets)]
        if math.isfinite(self.high_low_grad_norm_ratio):
            out.append(GaugeValue("pdml_gradient_high_low_norm_ratio", "mean gradient norm of high- over "
                                  "low-priority workers", self.high_low_grad_norm_ratio))
        return out


# -- the deriver ------------------------------------------------------------------------------------
class GradientPriorityDeriver(Deriver):
    """The scheduler's "gradient" deriver: per-worker priorities, K, and the bounds, as a GradientDecision.
    Reads the node deriver's rates and the sample deriver's table through ``bind``. Pure: no Ray, no clocks."""

    name = "gradient"

    def __init__(self, config: PDMLConfig, num_workers: int) -> None:
        super().__init__(config, num_workers)
        assert config.gradient_priority is not None  # the registry builds this deriver only when enabled
        cfg: GradientPriorityConfig = config.gradient_priority
        self.cfg = cfg
        self.priority_fn: Callable[[Any], float] | None = (load_priority_fn(cfg.priority_fn)
                                                           if cfg.priority_fn is not None else None)
        n = num_workers
        self.grad_mean, self.loss_mean = RunningMean(cfg.normaliser_ema), RunningMean(cfg.normaliser_ema)
        self.worker_grad = EMA(n, cfg.worker_ema)       # (N,) raw gradient signal per worker
        self.worker_loss = EMA(n, cfg.worker_ema)       # (N,) reported loss per worker
        self.worker_rate = EMA(n, cfg.worker_ema)       # (N,) samples/s, when no node deriver is bound
        self.worker_norm = EMA(n, cfg.worker_ema)       # (N,) reported gradient norm (the validation figure)
        self.last_indices: list[np.ndarray | None] = [None] * n  # the worker's last batch (sample table)
        self.bandit = WeightBandit(simplex_arms(cfg.prior_weights, cfg.simplex_resolution), cfg.bandit_discount,
                                   cfg.bandit_exploration)
        self.monitor = ContinuityMonitor(cfg.continuity, seed=config.seed + 2, name="gradient priorities")
        self.hold_left = 0                              # boundaries the prior is still held after a reset
        self.collapse_resets = 0
        # the current decision interval: loss sum and count, slowest compute time per step (s)
        self.interval_loss = [0.0, 0]
        self.interval_step_s: dict[int, float] = {}
        self.interval_folded = (0, 0.0, -1)  # (steps, seconds) folded out of interval_step_s, and the newest such step
        self.previous: tuple[float, int, float] | None = None  # (mean loss, steps, seconds) of the last interval
        self.progress = math.nan                        # smoothed relative loss decrease per step
        self.best_progress = math.nan
        self.last_reward = math.nan
        self.ratio_sums = [0.0, 0.0, 0.0, 0.0]          # grad norm sum and count: high half, low half
        self.terms = np.ones((3, n))
        self.node_source = "reported throughput"
        self.data_source = "reported loss"
        self.node_peer: Any = None
        self.sample_peer: Any = None
        self.current = self._decision(np.full(n, 1.0), cfg.k_max, "initial: uniform")

    def bind(self, peers: Mapping[str, Deriver]) -> None:
        self.node_peer = peers.get("node")
        self.sample_peer = peers.get("sample")

    def initial(self) -> GradientDecision:
        return self.current

    # -- measure ----------------------------------------------------------------------------------
    def report_rejection(self, report: WorkerReport) -> Rejection | None:
        """The user's ``priority_fn`` must give a finite number >= 0 for this report; the scheduler asks
        before any deriver ingests it, so a report it cannot score is refused and counted, not
        half-applied (``ingest`` keeps the same check for direct callers)."""
        if self.priority_fn is None:
            return None
        try:
            signal = float(self.priority_fn(report))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the user's function: any failure (SystemExit too) refuses this report only
            return Rejection("priority_fn", f"worker {report.worker_id} step {report.step}: gradient_priority."
                                            f"priority_fn {self.cfg.priority_fn!r} raised {type(e).__name__}: {e}")
        if math.isfinite(signal) and signal >= 0:
            return None
        return Rejection("priority_fn", f"worker {report.worker_id} step {report.step}: gradient_priority.priority_fn "
                                        f"{self.cfg.priority_fn!r} returned {signal!r}; it must return a finite number >= 0")

    def ingest(self, reports: Sequence[WorkerReport]) -> None:
        """Fold a batch in. The user's ``priority_fn`` scores every report before anything is written: a
        score it refuses now (``report_rejection`` passed it before) raises ReportError with the batch untaken."""
        signals = [r.grad_norm for r in reports]
        if self.priority_fn is not None:
            for k, r in enumerate(reports):
                signals[k] = signal = float(self.priority_fn(r))
                if not (math.isfinite(signal) and signal >= 0):
                    raise ReportError(f"gradient_priority.priority_fn {self.cfg.priority_fn!r} returned {signal!r} "
                                      f"for worker {r.worker_id} step {r.step}; it must return a finite number >= 0")
        for r, signal in zip(reports, signals):
            i = r.worker_id
            if math.isfinite(signal) and signal >= 0:
                self.worker_grad.update(i, signal)
                self.grad_mean.update(signal)
            if math.isfinite(r.loss):
                self.worker_loss.update(i, r.loss)
                self.loss_mean.update(r.loss)
                self.interval_loss[0] += r.loss
                self.interval_loss[1] += 1
            if math.isfinite(r.grad_norm):
                self.worker_norm.update(i, r.grad_norm)
            self.worker_rate.update(i, r.throughput)
            if r.step > self.interval_folded[2]:  # a late report for a folded step is not a step of its own
                self.interval_step_s[r.step] = max(self.interval_step_s.get(r.step, 0.0), r.compute_s)
            if r.sample_indices is not None:
                self.last_indices[i] = np.asarray(r.sample_indices, dtype=np.int64)
        if len(self.interval_step_s) > INTERVAL_STEPS:
            self._fold_interval_steps()

    def _fold_interval_steps(self) -> None:
        """Fold the oldest half of the interval's per-step times into its running count and sum."""
        oldest = sorted(self.interval_step_s)[:len(self.interval_step_s) // 2]
        steps, seconds, _ = self.interval_folded
        self.interval_folded = (steps + len(oldest), seconds + sum(self.interval_step_s.pop(s) for s in oldest),
                                oldest[-1])

    # -- derive -----------------------------------------------------------------------------------
    def current_terms(self) -> np.ndarray:
        """(3, N): grad, data and node terms from the current estimates (module docstring)."""
        grad = relative_to_mean(np.where(self.worker_grad.measured, self.worker_grad.values, np.nan),
                                self.grad_mean.value)
        data = relative_to_mean(np.where(self.worker_loss.measured, self.worker_loss.values, np.nan),
                                self.loss_mean.value)
        self.data_source = "reported loss"
        table = getattr(self.sample_peer, "table", None)
        if table is not None and table.num_samples > table.unseen_count:
            table_mean = table.seen_sum / (table.num_samples - table.unseen_count)
            scores = np.full(self.num_workers, np.nan)
            for i, idx in enumerate(self.last_indices):
                if idx is not None and idx.size and bool(table.seen[idx].any()):
                    scores[i] = float(table.scores[idx][table.seen[idx]].mean())
            if np.isfinite(scores).any():
                data = np.where(np.isfinite(scores), relative_to_mean(scores, table_mean), data)
                self.data_source = "sample table"
        if self.node_peer is not None and hasattr(self.node_peer, "rates"):
            rates, self.node_source = self.node_peer.rates()
        else:
            rates = np.where(self.worker_rate.measured, self.worker_rate.values, np.nan)
            self.node_source = "reported throughput"
        return np.stack([grad, data, relative_to_best(rates)])

    def _close_interval(self) -> None:
        """Credit the finished interval's loss decrease per second to the arm in force; update progress."""
        total, count = self.interval_loss
        folded_steps, folded_s, _ = self.interval_folded
        steps, seconds = len(self.interval_step_s) + folded_steps, float(sum(self.interval_step_s.values())) + folded_s
        self.interval_loss, self.interval_step_s, self.interval_folded = [0.0, 0], {}, (0, 0.0, -1)
        self.last_reward = math.nan
        if count == 0 or steps == 0:
            return
        loss = total / count
        if self.previous is not None:
            prev_loss, prev_steps, prev_seconds = self.previous
            # the two means sit at the middles of their intervals: half of each lies between them
            self.last_reward = (prev_loss - loss) / max(0.5 * (prev_seconds + seconds), 1e-12)
            self.bandit.update(self.bandit.current, self.last_reward)
            if prev_loss > 0:
                rate = (prev_loss - loss) / prev_loss / (0.5 * (prev_steps + steps))
                a = self.cfg.progress_ema
                self.progress = rate if math.isnan(self.progress) else (1 - a) * self.progress + a * rate
                self.best_progress = (self.progress if math.isnan(self.best_progress)
                                      else max(self.best_progress, self.progress))
        self.previous = (loss, steps, seconds)

    def decide(self, boundary: Boundary, earlier: Mapping[str, Decision]) -> GradientDecision | None:
        self._close_interval()
        if self.hold_left > 0:
            self.hold_left -= 1
            self.bandit.current = 0
        else:
            self.bandit.select()
        self.terms = terms = self.current_terms()
        weights = self.bandit.weights
        priorities = combine(terms, weights)
        reason = f"arm {self.bandit.current}"
        if bool(self.worker_grad.measured.all()) and self.num_workers >= 2:
            verdict = self.monitor.check(priorities, boundary.first_step)
            if verdict.collapse is not None:
                self.bandit.reset()
                self.hold_left = self.cfg.collapse_hold
                self.collapse_resets += 1
                priorities = combine(terms, self.bandit.weights)
                reason = f"collapse reset ({verdict.collapse}): prior weights"
            if bool(self.worker_norm.measured.all()):
                self._count_ratio(priorities)
        k = k_from_progress(self.progress, self.best_progress, self.cfg.k_min, self.cfg.k_max)
        decision = self._decision(priorities, k, reason)
        if (decision.priorities, decision.k_fraction, decision.weights) == \
                (self.current.priorities, self.current.k_fraction, self.current.weights):
            return None
        self.current = decision
        return decision

    def _count_ratio(self, priorities: np.ndarray) -> None:
        order = np.argsort(-priorities, kind="stable")
        half = self.num_workers // 2
        norms = self.worker_norm.values
        self.ratio_sums[0] += float(norms[order[:half]].sum())
        self.ratio_sums[1] += half
        self.ratio_sums[2] += float(norms[order[-half:]].sum())
        self.ratio_sums[3] += half

    def high_low_ratio(self) -> float:
        hs, hn, ls, ln = self.ratio_sums
        return (hs / hn) / (ls / ln) if hn and ln and ls > 0 else math.nan

    def _decision(self, priorities: np.ndarray, k: float, reason: str) -> GradientDecision:
        w = self.bandit.weights
        return GradientDecision(version=0, effective_step=0, priorities=tuple(float(p) for p in priorities),
                                k_fraction=float(k), weights=(w[0], w[1], w[2]), max_wait=self.cfg.max_wait,
                                max_staleness=self.cfg.max_staleness, reason=reason)

    def stats(self) -> GradientStats:
        d = self.current
        return GradientStats(
            priorities=d.priorities, grad_terms=tuple(map(float, self.terms[0])),
            data_terms=tuple(map(float, self.terms[1])), node_terms=tuple(map(float, self.terms[2])),
            weights=d.weights, prior_weights=self.cfg.prior_weights, k_fraction=d.k_fraction,
            collapse_resets=self.collapse_resets, collapsed_flat=self.monitor.collapsed_flat,
            collapsed_peaked=self.monitor.collapsed_peaked, high_low_grad_norm_ratio=self.high_low_ratio(),
            progress_rate=self.progress, last_reward=self.last_reward, arm=self.bandit.current,
            arm_pulls=tuple(int(p) for p in self.bandit.pulls), data_source=self.data_source,
            node_source=self.node_source)

    # -- checkpoint -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything but the workers' last batch indices (the data term reads the reported loss until
        their next reports)."""
        return {"num_workers": self.num_workers, "grad_mean": self.grad_mean.state_dict(),
                "loss_mean": self.loss_mean.state_dict(), "worker_grad": self.worker_grad.state_dict(),
                "worker_loss": self.worker_loss.state_dict(), "worker_rate": self.worker_rate.state_dict(),
                "worker_norm": self.worker_norm.state_dict(),
                "bandit": self.bandit.state_dict(), "hold_left": self.hold_left,
                "collapse_resets": self.collapse_resets,
                "monitor": {"checks": self.monitor.checks, "collapsed_flat": self.monitor.collapsed_flat,
                            "collapsed_peaked": self.monitor.collapsed_peaked},
                "interval_loss": list(self.interval_loss), "interval_step_s": sorted(self.interval_step_s.items()),
                "interval_folded": list(self.interval_folded),
                "previous": list(self.previous) if self.previous is not None else None,
                "progress": self.progress, "best_progress": self.best_progress, "last_reward": self.last_reward,
                "ratio_sums": list(self.ratio_sums), "terms": self.terms.tolist(), "decision": self.current.to_dict(),
                "sources": [self.data_source, self.node_source]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_workers"]) != self.num_workers:
            raise StateError(f"saved gradient priority state is for {state['num_workers']} workers, this run has "
                             f"{self.num_workers}; resume with the same number of workers")
        self.grad_mean.load_state_dict(state["grad_mean"])
        self.loss_mean.load_state_dict(state["loss_mean"])
        self.worker_grad.load_state_dict(state["worker_grad"])
        self.worker_loss.load_state_dict(state["worker_loss"])
        self.worker_rate.load_state_dict(state["worker_rate"])
        self.worker_norm.load_state_dict(state["worker_norm"])
        self.bandit.load_state_dict(state["bandit"])
        self.hold_left, self.collapse_resets = int(state["hold_left"]), int(state["collapse_resets"])
        m = state["monitor"]
        self.monitor.checks, self.monitor.collapsed_flat = int(m["checks"]), int(m["collapsed_flat"])
        self.monitor.collapsed_peaked = int(m["collapsed_peaked"])
        self.interval_loss = [float(state["interval_loss"][0]), int(state["interval_loss"][1])]
        self.interval_step_s = {int(s): float(t) for s, t in state["interval_step_s"]}
        folded = state.get("interval_folded", (0, 0.0, -1))  # absent in states written before it was bounded
        self.interval_folded = (int(folded[0]), float(folded[1]), int(folded[2]))
        if len(self.interval_step_s) > INTERVAL_STEPS:
            self._fold_interval_steps()
        prev = state["previous"]
        self.previous = (float(prev[0]), int(prev[1]), float(prev[2])) if prev is not None else None
        self.progress, self.best_progress = float(state["progress"]), float(state["best_progress"])
        self.last_reward = float(state["last_reward"])
        rs = state["ratio_sums"]
        self.ratio_sums = [float(x) for x in rs]
        self.terms = np.array(state["terms"], dtype=np.float64)
        self.current = GradientDecision.from_dict(state["decision"])
        self.data_source, self.node_source = state["sources"]
