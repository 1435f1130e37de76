"""What the pipeline runtime exports per run (``pdml_ray.runtime.pipeline``): its typed stats record.

``PipelineRunStats`` folds each global step in and says it as ``GaugeValue``s, which
``pdml_ray.metrics.PriorityGauges`` exports (tagged with the schedule): the last step's wall time
and measured bubble fraction, and counts of steps, replica deaths and re-run micro-batches.

The measured bubble fraction of a step is ``1 - busy / (wall x replicas)``: busy is the sum of
every action's worker-side latency (compute plus any EMULATED slowdown), wall the driver's step time
(planning and the gradient exchange included), replicas the live replicas. It is what a schedule
leaves idle on this run's hardware, the measured counterpart of the simulator's predicted bubble
(``pdml_ray.pipeline.auto``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdml_ray.pipeline.plan import Measurement
from pdml_ray.priority.base import GaugeValue


def bubble_ratio(measurements: Sequence[Measurement], wall_s: float, replicas: int) -> float:
    """The fraction of ``replicas`` x ``wall_s`` no action was running (0-1); nan without a wall time."""
    if not wall_s > 0 or replicas < 1:
        return math.nan
    busy = sum(m.latency_s for m in measurements)
    return min(1.0, max(0.0, 1.0 - busy / (wall_s * replicas)))


@dataclass(slots=True)
class PipelineRunStats:
    """One pipeline runtime's figures, cumulative over its steps."""

    schedule: str = ""
    emulated: str = "none"
    """What the run EMULATES, as the ``emulated`` tag of every series: ``none``, or a comma list of
    ``compute`` (actions sleep per-sample compute times), ``speeds`` (slow replicas sleep after compute)."""
    steps: int = 0
    replica_deaths: int = 0
    rerun_microbatches: int = 0
    step_s: float = math.nan
    bubble: float = math.nan

    def observe(self, schedule: str, step_s: float, measurements: Sequence[Measurement], live_replicas: int,
                deaths: int = 0, reruns: int = 0) -> None:
        """Fold one completed step in."""
        self.schedule = schedule
        self.steps += 1
        self.replica_deaths += deaths
        self.rerun_microbatches += reruns
        self.step_s = step_s
        self.bubble = bubble_ratio(measurements, step_s, live_replicas)

    def gauges(self) -> list[GaugeValue]:
        tags = (("schedule", self.schedule), ("emulated", self.emulated))
        return [GaugeValue("pdml_pipeline_bubble_ratio", "measured fraction of the replicas' time the last step "
                           "left idle (0-1); the emulated tag says what is EMULATED (compute: slept per-sample "
                           "times; speeds: slow replicas sleep)", self.bubble, tags),
                GaugeValue("pdml_pipeline_step_seconds", "wall time of the last global step; the emulated tag says "
                           "what of it is EMULATED", self.step_s, tags),
                GaugeValue("pdml_pipeline_steps_total", "global steps run", self.steps, tags),
                GaugeValue("pdml_pipeline_replica_deaths_total", "stage replicas that died during a step and "
                           "were survived", self.replica_deaths, tags),
                GaugeValue("pdml_pipeline_rerun_microbatches_total", "micro-batch stages re-run on a survivor "
                           "after a replica died", self.rerun_microbatches, tags)]
