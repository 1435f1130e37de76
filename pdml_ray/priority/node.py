"""Node priorities: per-worker batch sizes and gradient weights that follow measured throughput.

measure -> derive -> decide:
  each worker's compute throughput (samples/s, collective waits excluded) is an EMA of its reports;
  before a worker has been measured, the accelerator prior stands in for it;
  shares r_i / sum(r) of the fixed global batch B become integer batch sizes that sum exactly to B
  (caps and floors by water-filling, then largest-remainder rounding);
  a new decision is published only if it cuts the predicted step time max_i(b_i / r_i) by more than
  the hysteresis threshold, so sizes do not thrash on noise.
Gradient weights are b_i / B: the weighted SUM all-reduce of per-worker mean gradients equals the
mean gradient over the global batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from pdml_ray.config import NodePriorityConfig
from pdml_ray.telemetry import NodeDecision, WorkerReport

log = logging.getLogger(__name__)


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
        raise ValueError("round_to_batch_sizes needs at least one share")
    if not np.all(np.isfinite(s)) or np.any(s < 0) or s.sum() <= 0:
        raise ValueError(f"shares must be finite, >= 0 and not all zero, got {s.tolist()}")
    cap = total if max_batch is None else max_batch
    if n * min_batch > total or n * cap < total:
        raise ValueError(f"cannot split {total} samples over {n} workers within [{min_batch}, {max_batch}]")

    # Water-filling: the level T with sum(clip(T * s, lo, cap)) == total. The sum is non-decreasing in
    # T, so bisection finds it; zero shares get a vanishing weight so they only grow when they must.
    s = np.maximum(s / s.max(), 1e-12)
    low, high = 0.0, cap / s.min()
    for _ in range(200):
        mid = 0.5 * (low + high)
        if np.clip(mid * s, min_batch, cap).sum() < total:
            low = mid
        else:
            high = mid
    target = np.clip(high * s, min_batch, cap)

    sizes = np.clip(np.floor(target + 1e-9), min_batch, cap).astype(np.int64)
    short = int(total - sizes.sum())
    if short > 0:  # largest remainder among workers below their cap; stable sort breaks ties by index
        remainder = np.where(sizes < cap, target - sizes, -np.inf)
        sizes[np.argsort(-remainder, kind="stable")[:short]] += 1
    elif short < 0:  # target overshot by rounding noise: take back from the smallest remainders
        remainder = np.where(sizes > min_batch, target - sizes, np.inf)
        sizes[np.argsort(remainder, kind="stable")[:-short]] -= 1
    return sizes


def predicted_step_s(batch_sizes: Sequence[int], rates: Sequence[float]) -> float:
    """Compute time of a synchronous step: the slowest worker's batch over its rate (seconds)."""
    return max(b / r for b, r in zip(batch_sizes, rates) if b > 0) if sum(batch_sizes) else 0.0


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


class ThroughputEMA:
    """Exponential moving average of each worker's throughput (samples/s); NaN until measured."""

    def __init__(self, num_workers: int, alpha: float):
        self.alpha = alpha
        self.rates = np.full(num_workers, np.nan)

    def update(self, worker_id: int, rate: float) -> None:
        old = self.rates[worker_id]
        self.rates[worker_id] = rate if math.isnan(old) else (1 - self.alpha) * old + self.alpha * rate

    @property
    def all_measured(self) -> bool:
        return bool(np.all(np.isfinite(self.rates)))


class NodePriorityDeriver:
    """Turns worker reports into NodeDecisions. Pure: no Ray, no clocks, no I/O."""

    def __init__(self, config: NodePriorityConfig, num_workers: int,
                 accelerator_types: Sequence[str] | None = None):
        config.check_workers(num_workers)
        self.config = config
        self.num_workers = num_workers
        self.accelerator_types = list(accelerator_types or ["CPU"] * num_workers)
        self.throughput = ThroughputEMA(num_workers, config.ema_alpha)
        self.rejected: list[str] = []
        self.decision = self._decide_from(self.prior_rates(), 0, 0, "prior")

    # -- measure ---------------------------------------------------------------------------------
    def set_accelerator(self, worker_id: int, accelerator_type: str) -> NodeDecision | None:
        """Record a worker's accelerator type; while still on the prior, re-derive it (new version)."""
        self.accelerator_types[worker_id] = accelerator_type
        if self.throughput.all_measured:
            return None
        prior = self._decide_from(self.prior_rates(), self.decision.version + 1, self.decision.effective_step, "prior")
        if prior.batch_sizes == self.decision.batch_sizes:
            return None
        self.decision = prior
        return prior

    def prior_rates(self) -> np.ndarray:
        """Relative speeds from the accelerator prior; unknown types count as the median known speed."""
        table = self.config.accelerator_prior()
        known = [table[a] for a in self.accelerator_types if a in table]
        fallback = float(np.median(known)) if known else 1.0
        return np.array([table.get(a, fallback) for a in self.accelerator_types], dtype=np.float64)

    def ingest(self, report: WorkerReport) -> str | None:
        """Fold a report into the estimates; returns why it was rejected, or None if accepted."""
        problem = report.problem(self.num_workers)
        if problem is not None:
            self.rejected.append(problem)
            log.warning("rejected report: %s", problem)
            return problem
        if report.step < self.config.warmup_steps:
            return None  # warm-up timings are not representative; accepted but not used
        self.throughput.update(report.worker_id, report.throughput)
        return None

    # -- derive ----------------------------------------------------------------------------------
    def rates(self) -> tuple[np.ndarray, str]:
        """Current relative rates and where they come from ('measured' or 'prior')."""
        if self.throughput.all_measured:
            return self.throughput.rates.copy(), "measured"
        return self.prior_rates(), "prior"

    # -- decide ----------------------------------------------------------------------------------
    def decide(self, step: int) -> NodeDecision | None:
        """A new decision effective from ``step`` if it beats the current one by the hysteresis margin."""
        if not self.config.enabled:
            return None
        rates, source = self.rates()
        candidate = self._decide_from(rates, self.decision.version + 1, step, source)
        if candidate.batch_sizes == self.decision.batch_sizes:
            return None
        before = predicted_step_s(self.decision.batch_sizes, rates)
        after = predicted_step_s(candidate.batch_sizes, rates)
        if after >= before * (1.0 - self.config.hysteresis):
            return None  # not worth a switch: keeps sizes from thrashing on measurement noise
        self.decision = candidate
        return candidate

    def _decide_from(self, rates: np.ndarray, version: int, step: int, source: str) -> NodeDecision:
        cfg = self.config
        if not cfg.enabled:
            rates = np.ones(self.num_workers)
            source = "uniform (node priorities disabled)"
        shares = rates / rates.sum()
        sizes = round_to_batch_sizes(shares, cfg.global_batch_size, cfg.min_batch, cfg.max_batch)
        return NodeDecision.from_sizes(version, step, sizes, shares, reason=source)

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"rates": self.throughput.rates.tolist(), "decision": self.decision.to_dict(),
                "accelerator_types": list(self.accelerator_types)}

    def load_state_dict(self, state: dict) -> None:
        self.throughput.rates = np.asarray(state["rates"], dtype=np.float64)
        self.decision = NodeDecision.from_dict(state["decision"])
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
