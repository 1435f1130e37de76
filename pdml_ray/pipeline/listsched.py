"""Greedy list scheduling on predicted costs: how 1F1B, critical-path and osprey build their orders.

The generator runs the step on predicted per-action costs (seconds) and records the order in which
every replica started its actions; that recorded execution is a witness that the plan runs in order
without deadlock and within the memory caps, so every plan built here passes ``validate``.

An idle replica picks, among its eligible actions, the one with the smallest (rank, micro-batch):
``ranks[k] = (rank of F, rank of B)`` at stage k encodes the priority rule (1F1B: (1, 0), a ready
backward first; critical path: minus the remaining path). Forwards are eligible only while the
replica holds fewer than ``caps[stage]`` activations; backwards never wait on memory (they free it),
which with work-conserving picks rules out deadlock (see ``dispatch``).

Placement of a micro-batch's forward at stage k is either fixed up front (``placement``, e.g.
round-robin or osprey's lanes) or decided when it is picked (``placement=None``): a replica takes a
ready forward only if no other replica of the stage is predicted to finish it earlier
(earliest-finish-time greedy). Cost: O(A log A) for A = 2 x stages x micro-batches actions.
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

from pdml_ray.pipeline.plan import Action, Kind

F, B = Kind.FORWARD, Kind.BACKWARD
Costs = Sequence[Sequence[Sequence[float]]]  # [stage][replica] -> (forward_s, backward_s)
Orders = dict[tuple[int, int], tuple[Action, ...]]


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
    free_at = [[0.0] * replicas[k] for k in range(S)]  # (stage, replica) -> busy until (s)
    idle = [[True] * replicas[k] for k in range(S)]
    in_flight = [[0] * replicas[k] for k in range(S)]
    orders: list[list[list[tuple[Kind, int]]]] = [[[] for _ in range(replicas[k])] for k in range(S)]
    where: dict[tuple[int, int], int] = {}  # (stage, microbatch) -> replica that ran F
    # Ready forwards: per replica (fixed placement) or per stage (EFT placement); heaps of (rank, m).
    f_ready: list[list[list[tuple[float, int]]]] = [[[] for _ in range(replicas[k] if placement is not None else 1)]
                                                    for k in range(S)]
    b_ready: list[list[list[tuple[float, int]]]] = [[[] for _ in range(replicas[k])] for k in range(S)]
    # Fastest-first replica order per stage, so EFT ties go to the quicker replica.
    by_speed = [sorted(range(replicas[k]), key=lambda r, k=k: (costs[k][r][0], r)) for k in range(S)]
    events: list[tuple[float, int, int, int, int, int]] = []  # (t, seq, what, stage, replica, m)
    ARRIVE_F, ARRIVE_B, DONE_F, DONE_B = 0, 1, 2, 3
    for m in range(M):
        slot = placement[(0, m)] if placement is not None else 0
        f_ready[0][slot].append((ranks[0][0], m))
    for heap in f_ready[0]:
        heapq.heapify(heap)
    seq = 0
    makespan = 0.0
    touched = list(range(S))[:1]
    now = 0.0
    while True:
        for k in touched:
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
                    kind, what, end = F, DONE_F, now + costs[k][r][0]
                    in_flight[k][r] += 1
                    where[(k, m)] = r
                elif bq:
                    m = heapq.heappop(bq)[1]
                    kind, what, end = B, DONE_B, now + costs[k][r][1]
                else:
                    continue
                free_at[k][r] = end
                idle[k][r] = False
                orders[k][r].append((kind, m))
                if finish_times is not None:
                    finish_times[(k, kind, m)] = end
                heapq.heappush(events, (end, seq, what, k, r, m))
                seq += 1
                if end > makespan:
                    makespan = end
        if not events:
            break
        now = events[0][0]
        stages_hit = set()
        while events and events[0][0] <= now:
            _, _, what, k, r, m = heapq.heappop(events)
            stages_hit.add(k)
            if what == ARRIVE_F:
                slot = placement[(k, m)] if placement is not None else 0
                heapq.heappush(f_ready[k][slot], (ranks[k][0], m))
            elif what == ARRIVE_B:
                heapq.heappush(b_ready[k][where[(k, m)]], (ranks[k][1], m))
            else:
                idle[k][r] = True
                if what == DONE_F:
                    if k + 1 < S:
                        heapq.heappush(events, (now + transfer_s, seq, ARRIVE_F, k + 1, -1, m))
                    else:  # the loss: B at the last stage needs only its own F, on the same replica
                        heapq.heappush(b_ready[k][r], (ranks[k][1], m))
                else:
                    in_flight[k][r] -= 1
                    if k > 0:
                        heapq.heappush(events, (now + transfer_s, seq, ARRIVE_B, k - 1, -1, m))
                seq += 1
        touched = sorted(stages_hit)
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

    Each action starts at max(its replica is free, its inputs have arrived); replicas are swept
    round-robin, advancing each as far as its inputs allow, until all are done. O(actions + sweeps x replicas).
    """
    done: dict[tuple[int, Kind, int], float] = {}
    pos = {key: 0 for key in orders}
    free = {key: 0.0 for key in orders}
    left = sum(len(v) for v in orders.values())
    last = num_stages - 1
    while left:
        progressed = False
        for key, acts in orders.items():
            i, t = pos[key], free[key]
            while i < len(acts):
                a = acts[i]
                k, m = a.stage, a.microbatch
                if a.kind is F:
                    if k == 0:
                        ready: float | None = 0.0
                    else:
                        dep = done.get((k - 1, F, m))
                        ready = None if dep is None else dep + transfer_s
                elif k == last:
                    ready = done.get((k, F, m))
                else:
                    dep = done.get((k + 1, B, m))
                    ready = None if dep is None else dep + transfer_s
                if ready is None:
                    break
                t = max(t, ready) + costs[k][a.replica][0 if a.kind is F else 1]
                done[(k, a.kind, m)] = t
                i += 1
            if i != pos[key]:
                left -= i - pos[key]
                pos[key], free[key] = i, t
                progressed = True
        if not progressed:
            raise ValueError("in-order run deadlocks; validate the plan first")
    return max(free.values())


def single_pipeline_schedule(forward_s: Sequence[float], backward_s: Sequence[float], num_microbatches: int,
                             caps: Sequence[int], transfer_s: float = 0.0
                             ) -> tuple[list[list[tuple[Kind, int]]], list[float]]:
    """``list_schedule`` for one replica per stage with 1F1B's rule, specialised for speed.

    With one replica per stage, forwards and backwards reach each stage in micro-batch order, so the
    ready queues are FIFO lists and only the event times need a heap. Returns the raw order per
    stage and the completion time (seconds) of each micro-batch's last backward (stage 0).
    """
    S, n = len(forward_s), num_microbatches
    free = [True] * S
    in_flight = [0] * S
    f_next = [0] * S  # next micro-batch whose forward may run at stage k ...
    f_avail = [0] * S  # ... and how many forwards have arrived there
    f_avail[0] = n
    b_next = [0] * S
    b_avail = [0] * S
    orders: list[list[tuple[Kind, int]]] = [[] for _ in range(S)]
    done = [0.0] * n
    events: list[tuple[float, int, int, int]] = []  # (t, seq, code, stage); code 0 F done, 1 B done, 2 F arrives, 3 B arrives
    seq, now, touched = 0, 0.0, [0]
    while True:
        for k in touched:
            if not free[k]:
                continue
            if b_next[k] < b_avail[k]:  # a ready backward first
                end = now + backward_s[k]
                orders[k].append((B, b_next[k]))
                if k == 0:
                    done[b_next[k]] = end
                b_next[k] += 1
                code = 1
            elif f_next[k] < f_avail[k] and in_flight[k] < caps[k]:
                end = now + forward_s[k]
                orders[k].append((F, f_next[k]))
                f_next[k] += 1
                in_flight[k] += 1
                code = 0
            else:
                continue
            free[k] = False
            heapq.heappush(events, (end, seq, code, k))
            seq += 1
        if not events:
            return orders, done
        now = events[0][0]
        touched = []
        while events and events[0][0] <= now:
            _, _, code, k = heapq.heappop(events)
            if code == 0:
                free[k] = True
                touched.append(k)
                if k + 1 < S:
                    heapq.heappush(events, (now + transfer_s, seq, 2, k + 1))
                    seq += 1
                else:
                    b_avail[k] += 1  # the loss: B at the last stage follows its own F
            elif code == 1:
                free[k] = True
                in_flight[k] -= 1
                touched.append(k)
                if k > 0:
                    heapq.heappush(events, (now + transfer_s, seq, 3, k - 1))
                    seq += 1
            elif code == 2:
                f_avail[k] += 1
                touched.append(k)
            else:
                b_avail[k] += 1
                touched.append(k)
