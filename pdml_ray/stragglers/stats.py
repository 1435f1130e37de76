"""What the straggler-tolerant runtime exports per run (``pdml_ray.runtime.stragglers``): its typed
stats record.

``StragglerRunStats`` folds each step in and says it as ``GaugeValue``s, which
``pdml_ray.metrics.PriorityGauges`` exports (tagged with the policy): the last step's wall time, and
counts of steps, worker deaths and *dropped results*: replies the aggregator took that no update
used, because the worker was cut short by the next step's call, its result came from an older step,
or the policy left it out (a straggler's, a surplus backup's). A synchronous policy drops none; what a
tolerant policy drops is the work it chose not to wait for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdml_ray.priority.base import GaugeValue


@dataclass(slots=True)
class StragglerRunStats:
    """One straggler runtime's figures, cumulative over its steps."""

    policy: str
    emulated: str = "none"
    """What the run EMULATES, as the ``emulated`` tag of every series: ``none``, or a comma list of
    ``compute`` (workers sleep per-sample compute times), ``stragglers`` (a delay model slows workers)."""
    steps: int = 0
    results_dropped: int = 0
    worker_deaths: int = 0
    step_s: float = math.nan

    def observe(self, step_s: float, dropped: int, dead: int) -> None:
        """Fold one completed step in: its wall time, the results it dropped, the dead workers so far."""
        self.steps += 1
        self.results_dropped += max(0, dropped)
        self.worker_deaths = max(self.worker_deaths, dead)
        self.step_s = step_s

    def gauges(self) -> list[GaugeValue]:
        tags = (("policy", self.policy), ("emulated", self.emulated))
        return [GaugeValue("pdml_straggler_results_dropped_total", "tasks whose result the update did not use "
                           "(cut short, or left out by the policy)", self.results_dropped, tags),
                GaugeValue("pdml_straggler_step_seconds", "wall time of the last step; the emulated tag says what "
                           "of it is EMULATED (compute: slept per-sample times; stragglers: slept delays)",
                           self.step_s, tags),
                GaugeValue("pdml_straggler_steps_total", "steps run", self.steps, tags),
                GaugeValue("pdml_straggler_worker_deaths_total", "worker actors found dead", self.worker_deaths, tags)]
