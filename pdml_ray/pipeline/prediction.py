"""What a plan expects each executor to be busy for, and how far a step ran from it: the re-plan
signal of a schedule that plans a step ahead.

The runtimes ask for step t+1's plan while step t runs, so an adaptive schedule plans t+1 on
measurements through step t-1 (``pdml_ray.runtime.pipeline_plans``). When a replica's speed shifts at
step t (throttled, or recovered), the plan already made for t+1 rests on the speeds before the shift,
and the step runs on a stale view. So osprey's plans carry their prediction
(``OspreyDecision.predicted_busy_s``: per executor, the sum of its actions' predicted seconds on the
estimates the plan was made with, ``predicted_busy``), and after each step the runtime compares what
each executor measured with it (``busy_shift``). Where one ran off by more than
``OspreyConfig.jump_threshold`` (the level shift osprey's estimates jump on), the runtime asks for
step t+1's plan again, after step t's latencies, and waits for it: only the step after a shift waits
for planning. Pure: plans, estimates and latency rows in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdml_ray.pipeline.plan import KIND_INDEX, Plan

Busy = tuple[tuple[int, int, float], ...]
"""(rank, replica, seconds) per executor, in ``Plan.orders`` key order (sorted)."""


def predicted_busy(plan: Plan, est: Sequence[Sequence[Sequence[float]]],
                   relative_cost: Sequence[Sequence[float]] | None = None) -> Busy:
    """Each executor's predicted busy seconds under ``plan``: the sum over its actions of
    ``est[rank][replica][KIND_INDEX[kind]]`` (a chunk of a two-chunk plan at its share of the rank), times
    the micro-batch's ``relative_cost[rank][microbatch]`` where the step's sizes were known."""
    chunks = 1 if plan.stage_rank is None else max(1, plan.num_stages // len(est))
    out = []
    for (rank, replica), actions in sorted(plan.orders.items()):
        row = est[rank][replica]
        if relative_cost is None:
            total = sum(row[KIND_INDEX[a.kind]] for a in actions)
        else:
            cost = relative_cost[rank]
            total = sum(row[KIND_INDEX[a.kind]] * cost[a.microbatch] for a in actions)
        out.append((int(rank), int(replica), float(total) / chunks))
    return tuple(out)


def busy_shift(plan: Plan, predicted: Busy, rows: Sequence[tuple]) -> float:
    """The largest relative gap ``|measured / predicted - 1|`` over the executors, where ``rows`` are one
    step's latencies as (stage, replica, kind, microbatch, seconds) and ``predicted`` is ``predicted_busy``
    of the plan that ran it. Executors predicted idle, or without rows, are left out; 0.0 when none is left."""
    measured: dict[tuple[int, int], float] = {}
    for stage, replica, _kind, _microbatch, seconds in rows:
        if 0 <= stage < plan.num_stages:
            key = plan.slot(stage, replica)
            measured[key] = measured.get(key, 0.0) + float(seconds)
    worst = 0.0
    for rank, replica, seconds in predicted:
        got = measured.get((rank, replica))
        if got is not None and seconds > 0.0:
            worst = max(worst, abs(got / seconds - 1.0))
    return worst


def replan_due(plan: Plan, record: Mapping | None, rows: Sequence[tuple], threshold: float) -> bool:
    """Whether the step that ``plan`` (with its decision ``record``, as it came over the wire) ran was far
    enough from the plan's prediction that the next plan, made a step ago, should be made again:
    ``busy_shift`` above ``threshold`` (> 0). A plan without a prediction (a static schedule's) never is."""
    predicted = record.get("predicted_busy_s") if record else None
    if not threshold > 0.0 or not predicted:
        return False
    return busy_shift(plan, tuple((int(k), int(r), float(s)) for k, r, s in predicted), rows) > threshold
