"""What a plan expects each executor to be busy for, and how far a step ran from it: the re-plan
signal of a schedule that plans a step ahead.

The runtimes ask for step t+1's plan while step t runs, so an adaptive schedule plans t+1 on
measurements through step t-1 (``pdml_ray.runtime.pipeline_plans``). When a replica's speed shifts at
step t (throttled, or recovered), the plan already made for t+1 rests on the speeds before the shift,
and the step runs on a stale view. So osprey's plans carry their prediction
(``OspreyDecision.predicted_busy_s``: per executor and action kind, the sum of its actions' predicted
seconds on the estimates the plan was made with, ``predicted_busy``), and after each step the runtime
compares what each executor measured with it (``busy_shift``). Where every kind one executor ran moved
the same way by more than ``OspreyConfig.jump_threshold`` (the level shift osprey's estimates jump on,
by the same rule), the runtime asks for step t+1's plan again, after step t's latencies, and waits
for it: only the step after a shift waits for planning. Pure: plans, estimates and latency rows in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdml_ray.pipeline.plan import KIND_INDEX, Plan

Busy = tuple[tuple[int, int, str, float], ...]
"""(rank, replica, kind, seconds) per executor and action kind it runs, in ``Plan.orders`` key order."""


def predicted_busy(plan: Plan, est: Sequence[Sequence[Sequence[float]]],
                   relative_cost: Sequence[Sequence[float]] | None = None) -> Busy:
    """Each executor's predicted busy seconds per action kind under ``plan``: the sum over its actions of
    that kind of ``est[rank][replica][KIND_INDEX[kind]]`` (a chunk of a two-chunk plan at its share of the
    rank), times the micro-batch's ``relative_cost[rank][microbatch]`` where the step's sizes were known."""
    chunks = 1 if plan.stage_rank is None else max(1, plan.num_stages // len(est))
    out = []
    for (rank, replica), actions in sorted(plan.orders.items()):
        row, cost = est[rank][replica], None if relative_cost is None else relative_cost[rank]
        totals: dict[str, float] = {}
        for a in actions:
            seconds = row[KIND_INDEX[a.kind]] * (1.0 if cost is None else cost[a.microbatch])
            totals[a.kind.value] = totals.get(a.kind.value, 0.0) + seconds
        out += [(int(rank), int(replica), kind, float(t) / chunks) for kind, t in totals.items()]
    return tuple(out)


def busy_shift(plan: Plan, predicted: Busy, rows: Sequence[tuple]) -> float:
    """How far one step ran from ``predicted`` (``predicted_busy`` of the plan that ran it), where ``rows``
    are its latencies as (stage, replica, kind, microbatch, seconds): per executor, the relative gap
    ``measured / predicted - 1`` of each action kind it ran; an executor shifted where every kind moved the
    same way, by the smallest of those gaps (a slowed or recovered device moves all its work, timing noise
    seldom does), else 0; the largest over executors. Kinds predicted idle or without rows are left out."""
    measured: dict[tuple[int, int, str], float] = {}
    for stage, replica, kind, _microbatch, seconds in rows:
        if 0 <= stage < plan.num_stages:
            rank, rep = plan.slot(stage, replica)
            measured[(rank, rep, kind)] = measured.get((rank, rep, kind), 0.0) + float(seconds)
    gaps: dict[tuple[int, int], list[float]] = {}
    for rank, replica, kind, seconds in predicted:
        got = measured.get((rank, replica, kind))
        if got is not None and seconds > 0.0:
            gaps.setdefault((rank, replica), []).append(got / seconds - 1.0)
    worst = 0.0
    for shifts in gaps.values():
        if all(g > 0 for g in shifts) or all(g < 0 for g in shifts):
            worst = max(worst, min(abs(g) for g in shifts))
    return worst


def replan_due(plan: Plan, record: Mapping | None, rows: Sequence[tuple], threshold: float) -> bool:
    """Whether the step that ``plan`` (with its decision ``record``, as it came over the wire) ran was far
    enough from the plan's prediction that the next plan, made a step ago, should be made again:
    ``busy_shift`` above ``threshold`` (> 0). A plan without a prediction (a static schedule's) never is."""
    predicted = record.get("predicted_busy_s") if record else None
    if not threshold > 0.0 or not predicted:
        return False
    return busy_shift(plan, tuple((int(k), int(r), str(kind), float(s)) for k, r, kind, s in predicted),
                      rows) > threshold
