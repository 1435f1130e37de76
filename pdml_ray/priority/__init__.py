"""Priority axes as derivers: each turns worker reports into decisions (measure -> derive -> decide).

    base.py           the seam: ``Deriver`` (ingest, decide, stats, state), ``GaugeValue``, stats protocol
    registry.py       ``DERIVERS``: name -> class and the ``PDMLConfig`` field that enables it
    node.py           node priorities: batch sizes and gradient weights from a fitted step-time model
    step_fit.py       that model: per-worker recency-weighted step-time lines and their uncertainty
    sample.py         sample priorities: the loss table (feedback, staleness, continuity, checkpoints)
    sample_draws.py   the table's drawing half: the distribution, draws, plans with importance weights
    sample_stats.py   what the table reports (``SampleStats``: status line, gauges, stats)
    sample_deriver.py the scheduler's "sample" deriver around one table
    p3.py             P3's slice size and credit window, for both P3 runtimes (config, or the rule over the measured link)
    sample_modes.py   the sample modes' registry (importance, annealed, selective-backprop, rho-loss)
    sample_switch.py  the pay switch: priority draws on only while a measured A/B against uniform draws shows they pay
    selective_backprop.py  Selective-Backprop's high-loss share, by the worker's or the cluster's percentile
    gradient.py       the gradient axis: which arrived gradients a straggler step applies, and how many
    bandit.py         the discounted-UCB bandit that tunes the gradient priority's weights
    pipeline.py       the pipeline axis: the configured schedule as a deriver, one ``MicroBatchPlan`` per step
    continuity.py     the continuity check: a collapsed (too flat / too peaked) distribution, recalibration
    estimators.py     the one exponential moving average (osprey's latencies, sample scores), a partition median
    sumtree.py        the sum-tree behind O(B log N) draws and updates

Pure numpy/torch: nothing here imports ray.
"""

from pdml_ray.priority.continuity import ContinuityMonitor, measure, recalibrate_priorities
from pdml_ray.priority.registry import DERIVERS
from pdml_ray.priority.sample import SamplePrioritizer

__all__ = ["DERIVERS", "ContinuityMonitor", "SamplePrioritizer", "measure", "recalibrate_priorities"]
