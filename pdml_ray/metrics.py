"""Priorities exported with ``ray.util.metrics``, so users watch them in the Ray dashboard/Prometheus.

Ray prefixes custom metrics with ``ray_`` on the Prometheus endpoint: ``pdml_batch_size`` is scraped
as ``ray_pdml_batch_size``. Gauges are created inside the scheduler actor's process.
"""

from __future__ import annotations

from typing import Any


class PriorityGauges:
    """One gauge per priority quantity; per-worker ones are tagged by worker and accelerator type."""

    def __init__(self, run_name: str):
        from ray.util.metrics import Gauge

        per_worker = ("run", "worker", "accelerator_type")
        self.run_name = run_name
        self.node_priority = Gauge("pdml_node_priority", "node priority: the worker's share of the global batch", per_worker)
        self.batch_size = Gauge("pdml_batch_size", "the worker's batch size (samples per step)", per_worker)
        self.grad_weight = Gauge("pdml_grad_weight", "the worker's gradient weight in the all-reduce", per_worker)
        self.throughput = Gauge("pdml_worker_throughput", "EMA of the worker's compute throughput (samples/s)", per_worker)
        self.version = Gauge("pdml_decision_version", "version of the current node decision", ("run",))
        self.rejected = Gauge("pdml_reports_rejected", "worker reports rejected so far", ("run",))
        self.sample_ess = Gauge("pdml_sample_normalized_ess", "normalised effective sample size of sample priorities", ("run",))
        self.recalibrations = Gauge("pdml_continuity_recalibrations", "continuity recalibrations so far", ("run",))

    def export(self, stats: dict[str, Any]) -> None:
        """Set every gauge from ``Scheduler.stats()``."""
        run = {"run": self.run_name}
        for i, (share, size, weight, rate, accel) in enumerate(zip(
                stats["shares"], stats["batch_sizes"], stats["grad_weights"], stats["rates"], stats["accelerator_types"])):
            tags = {**run, "worker": str(i), "accelerator_type": accel}
            self.node_priority.set(share, tags)
            self.batch_size.set(size, tags)
            self.grad_weight.set(weight, tags)
            if stats["rate_source"] == "measured":
                self.throughput.set(rate, tags)
        self.version.set(stats["version"], run)
        self.rejected.set(stats["reports_rejected"], run)
        sample = stats.get("sample_priority")
        if sample:
            if "normalized_ess" in sample:
                self.sample_ess.set(sample["normalized_ess"], run)
            if "recalibrations" in sample:
                self.recalibrations.set(sample["recalibrations"], run)
