"""Greedy list scheduling on predicted costs: how 1F1B, critical-path and osprey build their orders.

The generator runs the step on predicted per-action costs (seconds) and records the order in which
every replica started its actions; that recorded execution is a witness that the plan runs in order
without deadlock and within the memory caps, so every plan built here passes ``validate``.

Which action waits for which comes from ``plan.dependency_table`` (the one dependency rule): when an
action completes, each of its consumers receives the output ``transfer_s`` later on another stage, at
once on its own stage, and becomes ready when all its producers' outputs are there. What follows is
policy. An idle replica picks, among its eligible actions, the one with the smallest (rank,
micro-batch): ``ranks[k] = (rank of F, rank of B)`` at stage k encodes the priority rule (1F1B:
(1, 0), a ready backward first; critical path: minus the remaining path). Forwards are eligible only
while the replica holds fewer than ``caps[stage]`` activations; backwards never wait on memory (they
free it), which with work-conserving picks rules out deadlock (see ``dispatch``).

Placement of a micro-batch's forward at stage k is either fixed up front (``placement``, e.g.
round-robin or osprey's lanes) or decided when it is picked (``placement=None``): a replica takes a
ready forward only if no other replica of the stage is predicted to finish it earlier
(earliest-finish-time greedy); its other actions at stage k follow it there. Cost: O(A log A) for
A = 2 x stages x micro-batches actions.
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.plan import KIND_INDEX, Action, DependencyTable, Kind, dependency_table

F, B = Kind.FORWARD, Kind.BACKWARD
Costs = Sequence[Sequence[Sequence[float]]]  # [stage][replica][KIND_INDEX[kind]] -> s: (forward_s, backward_s)
Orders = dict[tuple[int, int], tuple[Action, ...]]
_DONE, _ARRIVE = 0, 1  # event types: an action completed / a producer's output reached a consumer


def _check_caps(caps: Sequence[float], num_stages: int) -> None:
    if len(caps) != num_stages or min(caps) < 1:
        raise PlanError(f"activation caps {list(caps)} need one entry >= 1 per stage ({num_stages}); "
                        "a cap of 0 would never admit a forward")


def list_schedule(num_stages: int, replicas: Sequence[int], num_microbatches: int, costs: Costs,
                  ranks: Sequence[Sequence[float]], caps: Sequence[int], *,
                  placement: dict[tuple[int, int], int] | None = None, transfer_s: float = 0.0,
                  materialize: bool = True, finish_times: dict[tuple[int, Kind, int], float] | None = None
                  ) -> tuple[Any, float]:
    """Return (orders, predicted makespan in seconds) of a greedy run on the predicted costs.

    With ``materialize=False`` the orders come back raw (``[stage][replica] -> [(kind, m)]``), for
    callers that compare candidates and build only the winner (``to_orders``). ``finish_times``, if
    given, receives (stage, kind, microbatch) -> predicted completion time (seconds).
    """
    S, M = num_stages, num_microbatches
    _check_caps(caps, S)
    deps = dependency_table(S)
    edges, joins = _edges(deps, transfer_s), _joins(deps)
    free_at = [[0.0] * replicas[k] for k in range(S)]  # (stage, replica) -> busy until (s)
    idle = [[True] * replicas[k] for k in range(S)]
    in_flight = [[0] * replicas[k] for k in range(S)]
    orders: list[list[list[tuple[Kind, int]]]] = [[[] for _ in range(replicas[k])] for k in range(S)]
    where: dict[tuple[int, int], int] = {}  # (stage, microbatch) -> replica that ran F
    waiting: dict[tuple[int, Kind, int], int] = {}  # actions with several producers -> outputs still to arrive
    # Ready forwards: per replica (fixed placement) or per stage (EFT placement); heaps of (rank, m).
    f_ready: list[list[list[tuple[float, int]]]] = [[[] for _ in range(replicas[k] if placement is not None else 1)]
                                                    for k in range(S)]
    b_ready: list[list[list[tuple[float, int]]]] = [[[] for _ in range(replicas[k])] for k in range(S)]

    def fastest_first(k: int) -> list[int]:  # replicas of stage k, so EFT ties go to the quicker one
        return sorted(range(replicas[k]), key=lambda r: (costs[k][r][0], r))

    by_speed = [fastest_first(k) for k in range(S)]
    stages_hit: set[int] = set()  # stages whose replicas may have something new to start

    def arrive(k: int, kind: Kind, m: int) -> None:
        """One producer's output of micro-batch ``m`` is at (stage ``k``, ``kind``): queue it once all are."""
        stages_hit.add(k)
        if joins and (k, kind) in joins and _still_waiting(waiting, (k, kind, m), joins[(k, kind)]):
            return
        if kind is F:
            heapq.heappush(f_ready[k][placement[(k, m)] if placement is not None else 0], (ranks[k][0], m))
        else:  # on the replica holding the micro-batch's activations
            heapq.heappush(b_ready[k][where[(k, m)]], (ranks[k][1], m))

    for k, kind in deps.sources:
        for m in range(M):
            arrive(k, kind, m)
    # (t s, seq, _DONE or _ARRIVE, stage, replica (-1 for an arrival), kind, microbatch); seq breaks ties.
    events: list[tuple[float, int, int, int, int, Kind, int]] = []
    seq = 0
    now = makespan = 0.0
    while True:
        for k in sorted(stages_hit):
            cap = caps[k]
            for r in (by_speed[k] if placement is None else range(replicas[k])):
                if not idle[k][r]:
                    continue
                bq = b_ready[k][r]
                fq = f_ready[k][r if placement is not None else 0]
                take_f = bool(fq) and in_flight[k][r] < cap and (not bq or fq[0] < bq[0])
                if take_f and placement is None:
                    mine = now + costs[k][r][0]
                    take_f = all(in_flight[k][o] >= cap or max(now, free_at[k][o]) + costs[k][o][0] >= mine
                                 for o in range(replicas[k]) if o != r)
                if take_f:
                    m = heapq.heappop(fq)[1]
                    kind, end = F, now + costs[k][r][0]
                    in_flight[k][r] += 1
                    where[(k, m)] = r
                elif bq:
                    m = heapq.heappop(bq)[1]
                    kind, end = B, now + costs[k][r][1]
                else:
                    continue
                free_at[k][r] = end
                idle[k][r] = False
                orders[k][r].append((kind, m))
                if finish_times is not None:
                    finish_times[(k, kind, m)] = end
                heapq.heappush(events, (end, seq, _DONE, k, r, kind, m))
                seq += 1
                if end > makespan:
                    makespan = end
        if not events:
            break
        now = events[0][0]
        stages_hit.clear()
        while events and events[0][0] <= now:
            _, _, what, k, r, kind, m = heapq.heappop(events)
            if what == _ARRIVE:
                arrive(k, kind, m)
                continue
            stages_hit.add(k)
            idle[k][r] = True
            if kind is B:
                in_flight[k][r] -= 1  # a backward frees its micro-batch's activation
            for k2, kind2, delay in edges[k][kind]:
                if delay:
                    heapq.heappush(events, (now + delay, seq, _ARRIVE, k2, -1, kind2, m))
                    seq += 1
                else:
                    arrive(k2, kind2, m)
    return (to_orders(orders) if materialize else orders), makespan


def to_orders(raw: Sequence[Sequence[Sequence[tuple[Kind, int]]]]) -> Orders:
    """``[stage][replica] -> [(kind, microbatch)]`` as a Plan's orders."""
    return {(k, r): tuple(Action(k, r, kind, m) for kind, m in acts)
            for k, row in enumerate(raw) for r, acts in enumerate(row)}


def round_robin(num_stages: int, replicas: Sequence[int], num_microbatches: int) -> dict[tuple[int, int], int]:
    """(stage, microbatch) -> replica m mod replicas[stage]: the static schedules' placement."""
    return {(k, m): m % replicas[k] for k in range(num_stages) for m in range(num_microbatches)}


def in_order_makespan(orders: Orders, num_stages: int, costs: Costs, transfer_s: float = 0.0) -> float:
    """Makespan (seconds) of running ``orders`` strictly in order on the given costs.

    Each action starts at max(its replica is free, its producers' outputs have arrived); replicas are
    swept round-robin, advancing each as far as its inputs allow, until all are done.
    O(actions + sweeps x replicas). Raises PlanError if the in-order run deadlocks.
    """
    deps = dependency_table(num_stages)
    # [stage][kind] -> (cost index, ((producer stage, producer kind, arrival delay s), ...))
    rule = [{kind: (KIND_INDEX[kind], tuple((k2, kind2, transfer_s if k2 != k else 0.0)
                                            for k2, kind2 in deps.producers[k][kind]))
             for kind in deps.kinds} for k in range(num_stages)]
    done: dict[tuple[int, Kind, int], float] = {}  # (stage, kind, microbatch) -> completed at (s)
    done_get = done.get
    pos = {key: 0 for key in orders}
    free = {key: 0.0 for key in orders}
    left = sum(len(v) for v in orders.values())
    while left:
        progressed = False
        for key, acts in orders.items():
            i, t = pos[key], free[key]
            while i < len(acts):
                a = acts[i]
                k, kind, m = a.stage, a.kind, a.microbatch
                cost_index, inputs = rule[k][kind]
                start = t  # the replica is free; then wait for the last input to arrive (s)
                for k2, kind2, delay in inputs:
                    arrival = done_get((k2, kind2, m))
                    if arrival is None:
                        break
                    arrival += delay
                    if arrival > start:
                        start = arrival
                else:  # every input is there: run it
                    t = start + costs[k][a.replica][cost_index]
                    done[(k, kind, m)] = t
                    i += 1
                    continue
                break
            if i != pos[key]:
                left -= i - pos[key]
                pos[key], free[key] = i, t
                progressed = True
        if not progressed:
            stuck = sorted(key for key in orders if pos[key] < len(orders[key]))
            raise PlanError(f"the in-order run deadlocks with (stage, replica) {stuck} waiting; "
                            "check the plan with pdml_ray.pipeline.plan.validate, which names the cycle")
    return max(free.values())


def single_pipeline_schedule(forward_s: Sequence[float], backward_s: Sequence[float], num_microbatches: int,
                             caps: Sequence[float], transfer_s: float = 0.0, *,
                             scale: Sequence[Sequence[float]] | None = None, sizes: Sequence[float] | None = None
                             ) -> tuple[list[list[tuple[Kind, int]]], list[float]]:
    """``list_schedule`` for one replica per stage with 1F1B's rule, specialised for speed.

    With one replica per stage every (stage, kind) runs its micro-batches in order, so outputs reach
    each consumer in micro-batch order: readiness is a count per (stage, kind) (``f_avail``,
    ``b_avail``; the next micro-batch to run is ``f_next``, ``b_next``) and only the event times need
    a heap. Returns the raw order per stage and the completion time (seconds) of each micro-batch's
    last action (the sinks: B at stage 0).

    Micro-batches of known sizes: ``scale[k][m]`` multiplies micro-batch m's costs at stage k, and
    ``sizes[m]`` is its activation in units of ``caps`` (a forward starts only while the held sizes
    plus its own stay within the cap). None: every micro-batch costs the stage's and holds one unit.
    """
    S, n = len(forward_s), num_microbatches
    _check_caps(caps, S)
    deps = dependency_table(S)
    edges, joins = _edges(deps, transfer_s), _joins(deps)
    f_sink = [(k, F) in deps.sinks for k in range(S)]
    b_sink = [(k, B) in deps.sinks for k in range(S)]
    free = [True] * S
    held = [0.0] * S  # activation held per stage, in units of its cap
    size = [1.0] * n if sizes is None else [float(x) for x in sizes]
    f_cost = [[forward_s[k] * (1.0 if scale is None else scale[k][m]) for m in range(n)] for k in range(S)]
    b_cost = [[backward_s[k] * (1.0 if scale is None else scale[k][m]) for m in range(n)] for k in range(S)]
    f_next, f_avail = [0] * S, [0] * S  # next micro-batch whose forward may run at stage k, and how many can
    b_next, b_avail = [0] * S, [0] * S
    avail = {F: f_avail, B: b_avail}
    waiting: dict[tuple[int, Kind, int], int] = {}  # actions with several producers -> outputs still to arrive
    touched: list[int] = []  # stages whose replica may have something new to start

    def arrive(k: int, kind: Kind, m: int) -> None:
        """One producer's output of micro-batch ``m`` is at (stage ``k``, ``kind``): count it once all are."""
        touched.append(k)
        if joins and (k, kind) in joins and _still_waiting(waiting, (k, kind, m), joins[(k, kind)]):
            return
        avail[kind][k] += 1

    for k, kind in deps.sources:
        avail[kind][k] = n
        touched.append(k)
    orders: list[list[tuple[Kind, int]]] = [[] for _ in range(S)]
    done = [0.0] * n
    events: list[tuple[float, int, int, int, Kind, int]] = []  # (t s, seq, _DONE or _ARRIVE, stage, kind, microbatch)
    seq, now = 0, 0.0
    while True:
        for k in touched:
            if not free[k]:
                continue
            if b_next[k] < b_avail[k]:  # a ready backward first
                m = b_next[k]
                kind, end = B, now + b_cost[k][m]
                b_next[k] += 1
                if b_sink[k] and end > done[m]:
                    done[m] = end
            elif f_next[k] < f_avail[k] and held[k] + size[f_next[k]] <= caps[k] + 1e-9:
                m = f_next[k]
                kind, end = F, now + f_cost[k][m]
                f_next[k] += 1
                held[k] += size[m]
                if f_sink[k] and end > done[m]:
                    done[m] = end
            else:
                continue
            orders[k].append((kind, m))
            free[k] = False
            heapq.heappush(events, (end, seq, _DONE, k, kind, m))
            seq += 1
        if not events:
            return orders, done
        now = events[0][0]
        touched = []
        while events and events[0][0] <= now:
            _, _, what, k, kind, m = heapq.heappop(events)
            if what == _ARRIVE:
                arrive(k, kind, m)
                continue
            free[k] = True
            touched.append(k)
            if kind is B:
                held[k] -= size[m]  # a backward frees its micro-batch's activation
            for k2, kind2, delay in edges[k][kind]:
                if delay:
                    heapq.heappush(events, (now + delay, seq, _ARRIVE, k2, kind2, m))
                    seq += 1
                else:
                    arrive(k2, kind2, m)


def _edges(deps: DependencyTable, transfer_s: float) -> list[dict[Kind, tuple[tuple[int, Kind, float], ...]]]:
    """[stage][kind] -> ((consumer stage, consumer kind, arrival delay s), ...): ``transfer_s`` across
    stages, 0 within one. A zero-delay output is handed over at once instead of through the event heap:
    it would be processed in the same instant anyway, before any replica picks."""
    return [{kind: tuple((k2, kind2, transfer_s if k2 != k else 0.0) for k2, kind2 in deps.consumers[k][kind])
             for kind in deps.kinds} for k in range(deps.num_stages)]


def _joins(deps: DependencyTable) -> dict[tuple[int, Kind], int]:
    """(stage, kind) -> number of producers, for the actions that wait on more than one."""
    return {(k, kind): len(p) for k in range(deps.num_stages) for kind, p in deps.producers[k].items() if len(p) > 1}


def _still_waiting(waiting: dict[tuple[int, Kind, int], int], key: tuple[int, Kind, int], need: int) -> bool:
    """Count one producer's output in for action ``key`` (stage, kind, microbatch); True while others are missing."""
    left = waiting.pop(key, need) - 1
    if left:
        waiting[key] = left
    return left > 0
