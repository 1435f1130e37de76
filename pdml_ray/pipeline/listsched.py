"""Greedy list scheduling on predicted costs: how 1F1B, critical-path and osprey build their orders.

The generator runs the step on predicted per-action costs (seconds) and records the order in which
every replica started its actions; that recorded execution is a witness that the plan runs in order
without deadlock and within the memory caps, so every plan built here passes ``validate``.

An idle replica picks, among its eligible actions, the one with the smallest ``key`` (a tuple; the
caller encodes its priority rule). Forwards are eligible only while the replica holds fewer than
``caps[stage]`` activations; backwards never wait on memory (they free it), which with
work-conserving picks rules out deadlock (see ``dispatch``).

Placement of a micro-batch's forward at stage k is either fixed up front (``placement``, e.g.
round-robin) or decided when it is picked (``placement=None``): a replica takes a ready forward only
if no other replica of the stage is predicted to finish it earlier (earliest-finish-time greedy).
Cost: O(A log A) for A = 2 x stages x micro-batches actions, plus O(replicas) per forward with EFT.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

from pdml_ray.pipeline.plan import Action, Kind

CostFn = Callable[[int, int, Kind, int], float]  # (stage, replica, kind, microbatch) -> seconds
KeyFn = Callable[[int, Kind, int], tuple]  # (stage, kind, microbatch) -> sort key, smallest first

F, B = Kind.FORWARD, Kind.BACKWARD


def list_schedule(num_stages: int, replicas: Sequence[int], num_microbatches: int, cost: CostFn, key: KeyFn,
                  caps: Sequence[int], *, placement: dict[tuple[int, int], int] | None = None,
                  transfer_s: float = 0.0, eft: bool = True) -> tuple[dict[tuple[int, int], tuple[Action, ...]], float]:
    """Return (orders, predicted makespan in seconds) of a greedy run on the predicted costs."""
    S, M = num_stages, num_microbatches
    reps = [list(range(replicas[k])) for k in range(S)]
    free_at = [[0.0] * replicas[k] for k in range(S)]  # (stage, replica) -> busy until (s)
    idle = [[True] * replicas[k] for k in range(S)]
    in_flight = [[0] * replicas[k] for k in range(S)]
    orders: list[list[list[Action]]] = [[[] for _ in range(replicas[k])] for k in range(S)]
    where: dict[tuple[int, int], int] = {}  # (stage, microbatch) -> replica that ran F
    # Ready forwards: per replica (fixed placement) or per stage (EFT placement); heaps of (key, m).
    f_ready: list[list[list]] = [[[] for _ in range(replicas[k] if placement is not None else 1)]
                                 for k in range(S)]
    b_ready: list[list[list]] = [[[] for _ in range(replicas[k])] for k in range(S)]
    events: list[tuple[float, int, int, int, int, int]] = []  # (t, seq, what, stage, replica, m)
    seq = 0
    ARRIVE_F, ARRIVE_B, DONE_F, DONE_B = 0, 1, 2, 3
    for m in range(M):
        events.append((0.0, seq, ARRIVE_F, 0, -1, m))
        seq += 1
    heapq.heapify(events)
    makespan = 0.0
    while events:
        now = events[0][0]
        touched: set[int] = set()
        while events and events[0][0] <= now:
            _, _, what, k, r, m = heapq.heappop(events)
            touched.add(k)
            if what == ARRIVE_F:
                slot = placement[(k, m)] if placement is not None else 0
                heapq.heappush(f_ready[k][slot], (key(k, F, m), m))
            elif what == ARRIVE_B:
                heapq.heappush(b_ready[k][where[(k, m)]], (key(k, B, m), m))
            else:
                idle[k][r] = True
                if what == DONE_F:
                    if k + 1 < S:
                        heapq.heappush(events, (now + transfer_s, seq, ARRIVE_F, k + 1, -1, m))
                    else:  # the loss: B at the last stage needs only its own F, on the same replica
                        heapq.heappush(b_ready[k][r], (key(k, B, m), m))
                else:
                    in_flight[k][r] -= 1
                    if k > 0:
                        heapq.heappush(events, (now + transfer_s, seq, ARRIVE_B, k - 1, -1, m))
                seq += 1
        for k in sorted(touched):
            candidates = [r for r in reps[k] if idle[k][r]]
            if placement is None and len(candidates) > 1:
                # Try idle replicas fastest first, so EFT ties go to the quicker replica.
                candidates.sort(key=lambda r: (cost(k, r, F, 0), r))
            for r in candidates:
                bq = b_ready[k][r]
                fq = f_ready[k][r if placement is not None else 0]
                take_f = bool(fq) and in_flight[k][r] < caps[k] and (not bq or fq[0][0] < bq[0][0])
                if take_f and placement is None and eft:
                    m = fq[0][1]
                    mine = now + cost(k, r, F, m)
                    take_f = all(max(now, free_at[k][o]) + cost(k, o, F, m) >= mine or in_flight[k][o] >= caps[k]
                                 for o in reps[k] if o != r)
                if take_f:
                    _, m = heapq.heappop(fq)
                    kind, what = F, DONE_F
                    in_flight[k][r] += 1
                    where[(k, m)] = r
                elif bq:
                    _, m = heapq.heappop(bq)
                    kind, what = B, DONE_B
                else:
                    continue
                end = now + cost(k, r, kind, m)
                free_at[k][r] = end
                idle[k][r] = False
                orders[k][r].append(Action(k, r, kind, m))
                heapq.heappush(events, (end, seq, what, k, r, m))
                seq += 1
                makespan = max(makespan, end)
    out = {(k, r): tuple(orders[k][r]) for k in range(S) for r in reps[k]}
    return out, makespan


def round_robin(num_stages: int, replicas: Sequence[int], num_microbatches: int) -> dict[tuple[int, int], int]:
    """(stage, microbatch) -> replica m mod replicas[stage]: the static schedules' placement."""
    return {(k, m): m % replicas[k] for k in range(num_stages) for m in range(num_microbatches)}


def in_order_makespan(orders: dict[tuple[int, int], tuple[Action, ...]], num_stages: int, cost: CostFn,
                      transfer_s: float = 0.0) -> float:
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
                    dep = done.get((k - 1, F, m)) if k > 0 else 0.0
                    ready = None if dep is None else (dep + transfer_s if k > 0 else 0.0)
                elif k == last:
                    ready = done.get((k, F, m))
                else:
                    dep = done.get((k + 1, B, m))
                    ready = None if dep is None else dep + transfer_s
                if ready is None:
                    break
                t = max(t, ready) + cost(k, a.replica, a.kind, m)
                done[(k, a.kind, m)] = t
                i += 1
            if i != pos[key]:
                left -= i - pos[key]
                pos[key], free[key] = i, t
                progressed = True
        if not progressed:
            raise ValueError("in-order run deadlocks; validate the plan first")
    return max(free.values())
