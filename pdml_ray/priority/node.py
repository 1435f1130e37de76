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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdml_ray.batching import predicted_step_s, round_to_batch_sizes
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, NodeDecision, WorkerReport
from pdml_ray.priority.base import Deriver, GaugeValue
from pdml_ray.priority.estimators import EMA


@dataclass(frozen=True, slots=True)
class NodeStats:
    """What the node deriver knows: the current decision's sizes and the rates behind them."""

    batch_sizes: tuple[int, ...]
    grad_weights: tuple[float, ...]
    shares: tuple[float, ...]
    """Un-rounded throughput shares (sum to 1): each worker's node priority."""
    rates: tuple[float, ...]
    """Relative rates the shares come from: measured samples/s, or the accelerator prior's speeds."""
    rate_source: str
    """'measured' once every worker has been measured, else 'prior'."""
    accelerator_types: tuple[str, ...]

    def summary_lines(self) -> list[str]:
        lines = [f"node priorities (rates: {self.rate_source})",
                 f"{'worker':>6}  {'accelerator':<12} {'priority':>8} {'batch':>6} {'grad weight':>11} {'rate':>10}"]
        for i, (accel, share, size, weight, rate) in enumerate(zip(self.accelerator_types, self.shares,
                                                                     self.batch_sizes, self.grad_weights, self.rates)):
            lines.append(f"{i:>6}  {accel:<12} {share:>8.3f} {size:>6} {weight:>11.4f} {rate:>10.4g}")
        return lines

    def gauges(self) -> list[GaugeValue]:
        out = []
        for i, (share, size, weight, rate, accel) in enumerate(zip(
                self.shares, self.batch_sizes, self.grad_weights, self.rates, self.accelerator_types)):
            tags = (("worker", str(i)), ("accelerator_type", accel))
            out += [GaugeValue("pdml_node_priority", "node priority: the worker's share of the global batch", share, tags),
                    GaugeValue("pdml_batch_size", "the worker's batch size (samples per step)", size, tags),
                    GaugeValue("pdml_grad_weight", "the worker's gradient weight in the all-reduce", weight, tags)]
            if self.rate_source == "measured":
                out.append(GaugeValue("pdml_worker_throughput", "EMA of the worker's compute throughput (samples/s)",
                                      rate, tags))
        return out


class NodePriorityDeriver(Deriver):
    """Turns worker reports into NodeDecisions. Pure: no Ray, no clocks, no I/O."""

    name = "node"

    def __init__(self, config: PDMLConfig, num_workers: int, accelerator_types: Sequence[str] | None = None):
        super().__init__(config, num_workers)
        self.node_config = cfg = config.node_priority
        cfg.check_workers(num_workers)
        self.accelerator_types = list(accelerator_types or ["CPU"] * num_workers)
        self.throughput = EMA(num_workers, cfg.ema_alpha)  # samples/s per worker, NaN until measured
        self.current = self._decide_from(self.prior_rates(), "prior")

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
        """Fold accepted reports into the throughput estimates (warm-up steps are not representative)."""
        for r in reports:
            if r.accelerator_type != self.accelerator_types[r.worker_id]:  # e.g. after a restart
                self.on_register(r.worker_id, r.accelerator_type)
            if r.step >= self.node_config.warmup_steps:
                self.throughput.update(r.worker_id, r.throughput)

    # -- derive ----------------------------------------------------------------------------------
    def rates(self) -> tuple[np.ndarray, str]:
        """Current relative rates and where they come from ('measured' or 'prior')."""
        if self.throughput.all_measured:
            return self.throughput.values.copy(), "measured"
        return self.prior_rates(), "prior"

    # -- decide ----------------------------------------------------------------------------------
    def initial(self) -> NodeDecision:
        return self.current

    def decide(self, boundary: Boundary, earlier: Mapping[str, Decision]) -> NodeDecision | None:
        """New sizes if they beat the current ones by the hysteresis margin (a changed prior always)."""
        if not self.node_config.enabled:
            return None
        rates, source = self.rates()
        candidate = self._decide_from(rates, source)
        if candidate.batch_sizes == self.current.batch_sizes:
            return None
        if source == "measured":  # a prior that changed (a worker said its type) is not noise
            before = predicted_step_s(self.current.batch_sizes, rates)
            after = predicted_step_s(candidate.batch_sizes, rates)
            if after >= before * (1.0 - self.node_config.hysteresis):
                return None  # not worth a switch: keeps sizes from thrashing on measurement noise
        self.current = candidate
        return candidate

    def _decide_from(self, rates: np.ndarray, source: str) -> NodeDecision:
        """An unstamped decision (version and effective step 0: the scheduler stamps them)."""
        cfg = self.node_config
        if not cfg.enabled:
            rates = np.ones(self.num_workers)
            source = "uniform (node priorities disabled)"
        shares = rates / rates.sum()
        sizes = round_to_batch_sizes(shares, cfg.global_batch_size, cfg.min_batch, cfg.max_batch)
        return NodeDecision.from_sizes(0, 0, sizes, shares, reason=source)

    def stats(self) -> NodeStats:
        rates, source = self.rates()
        d = self.current
        return NodeStats(batch_sizes=d.batch_sizes, grad_weights=d.grad_weights, shares=d.shares,
                         rates=tuple(float(r) for r in rates), rate_source=source,
                         accelerator_types=tuple(self.accelerator_types))

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"throughput": self.throughput.state_dict(), "decision": self.current.to_dict(),
                "accelerator_types": list(self.accelerator_types)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.throughput.load_state_dict(state["throughput"])
        self.current = NodeDecision.from_dict(state["decision"])
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
