"""Priorities exported with ``ray.util.metrics``, so users watch them in the Ray dashboard/Prometheus.

The gauges are whatever the scheduler's typed stats records say (``SchedulerStats.gauges()``, each
deriver's stats record adding its own): a new priority axis brings its gauges with its stats record
and nothing here changes. Every series is tagged with the run (the scheduler's name); per-worker
ones also with ``worker`` and ``accelerator_type``.

Ray prefixes custom metrics with ``ray_`` on the Prometheus endpoint: ``pdml_batch_size`` is scraped
as ``ray_pdml_batch_size``. Gauges are created inside the scheduler actor's process.
"""

from __future__ import annotations

from typing import Any

from pdml_ray.scheduler import SchedulerStats


class PriorityGauges:
    """One ``ray.util.metrics.Gauge`` per metric name, created when the name is first exported."""

    def __init__(self, run_name: str):
        self.run_name = run_name
        self._gauges: dict[str, Any] = {}
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}  # what each series was set to

    def export(self, stats: SchedulerStats) -> None:
        """Set every gauge the stats records name whose value changed since the last export (a gauge
        keeps its value; each ``Gauge.set`` costs CPU and, in Ray 2.60, memory that grew ~0.5 MB/s at
        256 workers exported once a second, so unchanged series are not set again)."""
        from ray.util.metrics import Gauge

        for g in stats.gauges():
            key = (g.name, g.tags)
            if self._last.get(key) == g.value:
                continue
            gauge = self._gauges.get(g.name)
            if gauge is None:
                gauge = self._gauges[g.name] = Gauge(g.name, g.description, ("run", *(k for k, _ in g.tags)))
            gauge.set(g.value, {"run": self.run_name, **dict(g.tags)})
            self._last[key] = g.value
