"""Decision boundaries spaced in seconds as well as in steps (``PDMLConfig.decision_interval_min_s``).

A boundary costs about the same however long the steps are: the ranks meet in a broadcast and a
gather, rank 0 makes one Ray call, and the scheduler actor spends 2-5 ms of CPU on it, most of it
Ray's own cost of a call (``pdml-ray bench hetero --decision-interval``; docs/observability.md). On
short steps a boundary every ``decision_interval`` steps is then a large share of the step, while the
shares would adapt fast enough with fewer. So at each boundary rank 0 may stretch the interval to the
next boundary to a whole number m of decision intervals, from its measured wall time per step, so
that boundaries are at least ``decision_interval_min_s`` apart; m travels in the boundary's broadcast,
every rank then skips the boundaries in between (no collective, no poll, no call: the reports wait
for the next boundary), and all ranks still switch decisions at the same steps.

Where m stays 1: with sample priorities (their plans and loss feedback follow every interval, and the
pay switch measures intervals), for the first ``SETTLING_BOUNDARIES`` boundaries of a run (and of a
resumed one), and with the bound at 0 (the default). m is at most ``max_stretch``: the boundary
gather's capacity (twice the reports of an interval, ``boundary_reports.MAX_ROWS`` at most) must hold
an interval's reports.
"""

from __future__ import annotations

import math

from pdml_ray.config import PDMLConfig
from pdml_ray.train.boundary_reports import MAX_ROWS


SETTLING_BOUNDARIES = 4
"""Boundaries a run starts with at every decision interval: a decision comes two or three boundaries
after the reports it is made from, so the first shares arrive as fast as without the bound (a trial on
~5 ms steps stretched to 20 intervals at the second boundary and switched no share in 64 steps)."""


def max_stretch(decision_interval: int) -> int:
    """The most decision intervals one boundary may span: its reports (one a step, some late) must fit
    the gather's capacity of ``MAX_ROWS`` rows a rank with room to spare, as at m = 1."""
    return max(1, MAX_ROWS // (2 * decision_interval))


def stretch(min_s: float, step_s: float, decision_interval: int) -> int:
    """How many decision intervals to the next boundary: the fewest m >= 1 with m intervals of
    ``step_s`` seconds a step lasting at least ``min_s`` seconds, at most ``max_stretch``; 1 when
    ``min_s`` is 0 or the step time is not known (NaN, 0)."""
    if not min_s > 0 or not step_s > 0 or not math.isfinite(step_s):
        return 1
    return min(max(1, math.ceil(min_s / (decision_interval * step_s) - 1e-9)), max_stretch(decision_interval))


def stretches(config: PDMLConfig) -> bool:
    """Whether a run's boundaries may be stretched: a bound in seconds, and no sample plans."""
    return config.decision_interval_min_s > 0 and config.sample_priority is None


def widest_interval(config: PDMLConfig) -> int:
    """Steps one boundary may span at most in this run (what its report gather is sized for)."""
    k = config.decision_interval
    return k * (max_stretch(k) if stretches(config) else 1)


def next_stretch(config: PDMLConfig, boundaries_run: int, step_s: float) -> int:
    """Rank 0, at a boundary: decision intervals to the next one, after ``boundaries_run`` boundaries
    at ``step_s`` seconds a step since the last (1 for the first ``SETTLING_BOUNDARIES``, and where the
    run does not stretch)."""
    if not stretches(config) or boundaries_run < SETTLING_BOUNDARIES:
        return 1
    return stretch(config.decision_interval_min_s, step_s, config.decision_interval)
