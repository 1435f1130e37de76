"""Greedy list scheduling over virtual stages with split backward: osprey's own zero-bubble lanes.

``listsched`` builds osprey's orders from F and full-B actions on one chunk per rank; the static
candidates bring zero bubble and several chunks per rank, but only in torch's fixed orders, whose warm-up
counts assume equal stages and a micro-batch count per lane of their own choosing (in the simulator, with 9
micro-batches on an 8-rank lane of F = I = W = 1 s, torch's interleaved zero bubble holds more than a
memory limit of 8 activations, and its V-shaped order takes 33 s where this one takes 32.5).
This module list-schedules one pipeline (one replica per rank) over ``chunks`` x ranks virtual stages
on predicted per-rank costs, so each lane gets an order made for its own costs and count:

- rule: an idle rank runs a ready input gradient first (the previous stage waits for it), else a
  ready forward, deepest virtual stage first (a micro-batch's later chunks free the way back
  sooner), else a ready weight gradient (nothing waits for it: it fills bubbles and frees memory);
- memory: a chunk's forward holds 1 / chunks of a stage's activation until its W completes (the
  simulator's unit); a forward starts only where the banker's test passes: after it, the micro-batches
  held at the rank can still finish their forwards there one by one, oldest first, within ``cap``.
  A plain "held + 1 <= cap" lets the first chunk fill the cap and stall every later chunk. The test is
  per rank, and across ranks it can still stall (seen with uneven sizes under a tight cap); such a lane
  is scheduled again with every micro-batch's chunks reserved when it is admitted at a rank, which
  never stalls but admits fewer (a lane of 9 on 8 ranks: 34.5 s against the banker's 32.5).

The recorded execution is the plan's order (a witness that it runs without deadlock); ``lanes_to_plan``
cuts a step into lanes as osprey does and validates the result.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.plan import Action, Kind, Plan, dependency_table, validate

F, I, W = Kind.FORWARD, Kind.INPUT, Kind.WEIGHT
LAYOUTS = ("loop", "v")
"""How virtual stages map to ranks: 'loop' (interleaved: stage v on rank v mod ranks) or 'v' (the
second chunk runs back from the last rank to the first, as torch's ZBV and DualPipeV)."""

Order = list[tuple[int, Kind, int]]  # one rank's (virtual stage, kind, micro-batch), in execution order


def stage_ranks(ranks: int, chunks: int, layout: str) -> tuple[int, ...]:
    """The rank of each of the ``ranks`` x ``chunks`` virtual stages."""
    if layout not in LAYOUTS:
        raise PlanError(f"virtual-stage layout {layout!r} is not one of {LAYOUTS}")
    out = []
    for v in range(ranks * chunks):
        c, k = divmod(v, ranks)
        out.append(k if layout == "loop" or c % 2 == 0 else ranks - 1 - k)
    return tuple(out)


def chunked_order(costs: Sequence[Sequence[float]], n: int, *, chunks: int = 2, layout: str = "v",
                  cap: float | None = None, transfer_s: float = 0.0, scale: Sequence[Sequence[float]] | None = None,
                  sizes: Sequence[float] | None = None) -> tuple[list[Order], float]:
    """One pipeline's order over virtual stages and its predicted makespan (seconds).

    ``costs[rank] = (forward_s, input_s, weight_s)`` of the rank's whole stage for a nominal micro-batch
    (a chunk costs 1 / chunks of it); ``n`` micro-batches, in priority order; ``cap``: activations a rank
    may hold, in whole-stage units (None: unbounded); ``transfer_s``: between virtual stages on
    different ranks. Micro-batches of known sizes: ``scale[rank][m]`` multiplies micro-batch m's costs at
    that rank and ``sizes[m]`` is its activation in units of ``cap`` (a cap below the largest rises to
    it). O(A log A) for A = 3 x chunks x ranks x n actions.
    """
    if n < 1 or len(costs) < 1 or chunks < 1:
        raise PlanError(f"chunked_order needs ranks, chunks and micro-batches >= 1, got {len(costs)}, {chunks}, {n}")
    if cap is not None and cap < 1:
        raise PlanError(f"activation cap {cap} holds less than one micro-batch")
    args = (costs, n, chunks, stage_ranks(len(costs), chunks, layout), cap, transfer_s, scale, sizes)
    out = _list_schedule(*args, banker=True)
    if out is None:  # the banker's test is per rank: across ranks it can still stall (uneven sizes, a tight cap)
        out = _list_schedule(*args, banker=False)
    if out is None:  # the reservation rule cannot stall: a defect if it does
        raise PlanError(f"chunked_order stalled with every micro-batch's chunks reserved ({n} micro-batches)")
    return out


def _list_schedule(costs: Sequence[Sequence[float]], n: int, chunks: int, sr: tuple[int, ...], cap: float | None,
                   transfer_s: float, scale: Sequence[Sequence[float]] | None, sizes: Sequence[float] | None, *,
                   banker: bool) -> tuple[list[Order], float] | None:
    """``chunked_order``'s run on one admission rule (None if it stalls): the banker's test, or (``banker``
    False) a first chunk admitted only where all of its micro-batch's chunks at the rank fit beside the
    reservations of the micro-batches held there, so that each can finish its forwards at every rank it
    reached and the ones furthest along free memory everywhere (never stalls, admits fewer)."""
    R = len(costs)
    V = R * chunks
    deps = dependency_table(V, split_backward=True)
    cost = {kind: [costs[sr[v]][i] / chunks for v in range(V)] for i, kind in enumerate((F, I, W))}
    size = [1.0] * n if sizes is None else [float(x) for x in sizes]
    # chunk activations a rank may hold (a chunk's forward holds its micro-batch's size)
    slots = None if cap is None else max(cap, max(size)) * chunks + 1e-9
    visits = [sr.count(r) for r in range(R)]
    ready: list[dict[Kind, list[tuple[int, int, int, int]]]] = [{F: [], I: [], W: []} for _ in range(R)]  # heaps
    # rank -> {m: [forwards, weights]} of the micro-batches it holds, oldest first: what it holds and
    # what they still need there follow from these counts
    started: list[dict[int, list[int]]] = [{} for _ in range(R)]
    waiting: dict[tuple[int, Kind, int], int] = {}  # actions with several producers -> outputs still to arrive
    orders: list[Order] = [[] for _ in range(R)]

    def safe(r: int, m: int) -> bool:
        """Banker's test: after m's next forward at r, can the held micro-batches finish their forwards there?"""
        if slots is None:
            return True
        held = started[r].items()
        if not banker:  # reservations: every chunk of each held micro-batch, done or to come
            reserved = sum((visits[r] - wt) * size[x] for x, (_, wt) in held)
            return m in started[r] or reserved + visits[r] * size[m] <= slots
        free = slots - sum((fw - wt) * size[x] for x, (fw, wt) in held) - size[m]
        if free < 0:
            return False
        for x, (fw, wt) in list(held) + ([] if m in started[r] else [(m, [0, 0])]):
            fw += x == m
            if (visits[r] - fw) * size[x] > free:
                return False
            free += (fw - wt) * size[x]  # it finishes and frees what it held
        return True

    def make_ready(v: int, kind: Kind, m: int) -> None:
        key = (-v, m) if kind is F else (m, v)  # F: deepest stage first; I and W: oldest micro-batch first
        heapq.heappush(ready[sr[v]][kind], (*key, v, m))

    def arrive(v: int, kind: Kind, m: int) -> None:
        need = len(deps.producers[v][kind])
        if need > 1:
            left = waiting.get((v, kind, m), need) - 1
            if left:
                waiting[(v, kind, m)] = left
                return
            del waiting[(v, kind, m)]
        make_ready(v, kind, m)

    for m in range(n):
        make_ready(0, F, m)
    free_rank = [True] * R
    touched = set(range(R))
    events: list[tuple[float, int, bool, int, Kind, int]] = []  # (t, seq, is completion, stage, kind, m)
    seq, now = 0, 0.0
    while True:
        for r in sorted(touched):
            if not free_rank[r]:
                continue
            pick = None
            if ready[r][I]:
                *_, v, m = heapq.heappop(ready[r][I])
                pick = I
            elif ready[r][F]:
                heap = ready[r][F]
                for entry in sorted(heap):
                    if safe(r, entry[3]):
                        heap.remove(entry)
                        heapq.heapify(heap)
                        *_, v, m = entry
                        started[r].setdefault(m, [0, 0])[0] += 1
                        pick = F
                        break
            if pick is None and ready[r][W]:
                *_, v, m = heapq.heappop(ready[r][W])
                pick = W
            if pick is None:
                continue
            orders[r].append((v, pick, m))
            free_rank[r] = False
            seconds = cost[pick][v] * (1.0 if scale is None else scale[sr[v]][m])
            heapq.heappush(events, (now + seconds, seq, True, v, pick, m))
            seq += 1
        if not events:
            break
        now = events[0][0]
        touched = set()
        while events and events[0][0] <= now:
            _, _, completion, v, kind, m = heapq.heappop(events)
            touched.add(sr[v])
            if not completion:
                arrive(v, kind, m)
                continue
            r = sr[v]
            free_rank[r] = True
            if kind is W:  # its activation is freed when it completes (as the simulator counts it)
                state = started[r][m]
                state[1] += 1
                if state[1] == visits[r]:
                    del started[r][m]
            for v2, kind2 in deps.consumers[v][kind]:
                if transfer_s and sr[v2] != sr[v]:
                    heapq.heappush(events, (now + transfer_s, seq, False, v2, kind2, m))
                    seq += 1
                else:
                    touched.add(sr[v2])
                    arrive(v2, kind2, m)
    if sum(len(o) for o in orders) != 3 * V * n:
        return None
    return orders, now


def lanes_to_plan(lane_orders: Sequence[Sequence[Order]], lane_microbatches: Sequence[Sequence[int]],
               members: Sequence[Sequence[int]], *, chunks: int, layout: str, name: str = "",
               cap: float | None = None, sizes: Sequence[float] | None = None) -> Plan:
    """Lanes' orders (``chunked_order`` per lane, micro-batches numbered within the lane) as one plan:
    lane j runs on replica ``members[rank][j]`` of every rank and its i-th micro-batch is
    ``lane_microbatches[j][i]``. The plan may reorder (osprey's dispatch) within the cap the orders were
    made for: ``Plan.memory_limit`` counts each chunk's forward at its micro-batch's whole size, so the
    cap (whole-stage units, raised to the largest of ``sizes``) becomes ``chunks`` x cap there. Validated."""
    ranks = len(members)
    lanes = len(lane_microbatches)
    sr = stage_ranks(ranks, chunks, layout)
    orders: dict[tuple[int, int], tuple[Action, ...]] = {}
    for j, ids in enumerate(lane_microbatches):
        for rank in range(ranks):
            r = members[rank][j]
            orders[(rank, r)] = tuple(Action(v, r, kind, ids[m]) for v, kind, m in lane_orders[j][rank]) if ids else ()
    limit = None if cap is None else math.ceil(chunks * max(cap, max(sizes or (1.0,))) - 1e-9)
    plan = Plan(num_stages=ranks * chunks, replicas=(lanes,) * (ranks * chunks),
                num_microbatches=sum(len(ids) for ids in lane_microbatches), orders=orders, stage_rank=sr,
                reorder=True, schedule=name, memory_limit=limit,
                activation_sizes=None if sizes is None else tuple(float(x) for x in sizes))
    validate(plan)
    return plan


class ChunkedLanes:
    """Osprey's zero-bubble candidates on its lanes, '<prefix>-<layout>' per layout (``prefix`` 'osprey-zb'
    for two chunks per rank, 'osprey-zb<chunks>' for other counts): each lane runs
    ``chunked_order`` for its own costs and count. Counts start from the lanes' speed shares and move
    one micro-batch at a time from the lane predicted last to the lane that finishes one more earliest,
    while that shortens the step (at most one move per lane). Lane orders are kept by (layout, costs,
    count), the last 256 of them: a drifted lane is re-planned, a steady one is not."""

    MAX_KEPT = 256

    def __init__(self, *, chunks: int = 2, cap: float | None = None, transfer_s: float = 0.0) -> None:
        self.chunks, self.cap, self.transfer_s = chunks, cap, transfer_s
        self._kept: dict[tuple[object, ...], tuple[list[Order], float]] = {}

    @property
    def prefix(self) -> str:
        """The candidates' label prefix: 'osprey-zb' at two chunks per rank, 'osprey-zb<chunks>' otherwise."""
        return "osprey-zb" if self.chunks == 2 else f"osprey-zb{self.chunks}"

    def _lane(self, layout: str, costs: tuple[tuple[float, ...], ...], n: int) -> tuple[list[Order], float]:
        key = (layout, costs, n)
        if key not in self._kept:
            if len(self._kept) >= self.MAX_KEPT:
                self._kept.clear()
            self._kept[key] = chunked_order(costs, n, chunks=self.chunks, layout=layout, cap=self.cap,
                                            transfer_s=self.transfer_s)
        return self._kept[key]

    def plans(self, lane_costs: Sequence[Sequence[Sequence[float]]], counts: Sequence[int],
              members: Sequence[Sequence[int]]) -> dict[str, Plan]:
        """label -> plan. ``lane_costs[j][rank] = (forward_s, input_s, weight_s)`` of lane j's replica
        of each rank, ``counts``: micro-batches per lane to start from, ``members[rank][j]``: the replica."""
        costs = [tuple(tuple(float(x) for x in c) for c in lane) for lane in lane_costs]
        out = {}
        for layout in LAYOUTS:
            n = list(counts)

            def span(j: int, count: int) -> float:
                return self._lane(layout, costs[j], count)[1] if count else 0.0

            for _ in range(len(n)):
                spans = [span(j, c) for j, c in enumerate(n)]
                last = max(range(len(n)), key=lambda j: spans[j])
                if n[last] == 0:
                    break
                to = min((j for j in range(len(n)) if j != last), key=lambda j: span(j, n[j] + 1), default=None)
                if to is None:
                    break
                after = [span(j, n[j] + (j == to) - (j == last)) for j in range(len(n))]
                if max(after) >= spans[last] - 1e-9:
                    break
                n[last], n[to] = n[last] - 1, n[to] + 1
            given, ids = 0, []
            for c in n:
                ids.append(list(range(given, given + c)))
                given += c
            orders = [self._lane(layout, costs[j], c)[0] if c else [] for j, c in enumerate(n)]
            label = f"{self.prefix}-{layout}"
            out[label] = lanes_to_plan(orders, ids, members, chunks=self.chunks, layout=layout, name=label, cap=self.cap)
        return out

    def sized_plans(self, lane_costs: Sequence[Sequence[Sequence[float]]], sizes: Sequence[float],
                    relative_cost: Sequence[Sequence[float]], members: Sequence[Sequence[int]]) -> dict[str, Plan]:
        """label -> plan for a step whose micro-batch sizes are known, '<prefix>-<layout>-sized' per layout.
        ``relative_cost[rank][m]`` scales micro-batch m's nominal costs (``SizeModel.relative_cost``).
        Micro-batches go to lanes as osprey's own sized lanes send them (``sizes.lanes_by_load``: the
        longest first, to the lane whose predicted busy time ends lowest); each lane runs them in whichever
        of ``sizes.orders_to_try`` its order finishes first, holding at most the cap in sizes."""
        from pdml_ray.pipeline.sizes import lanes_by_load, orders_to_try

        ranks, lanes = len(members), len(lane_costs)
        cost = [sum(relative_cost[k][m] for k in range(ranks)) / ranks for m in range(len(sizes))]
        mine = lanes_by_load(cost, [max(sum(c) for c in lane) for lane in lane_costs])
        out = {}
        for layout in LAYOUTS:
            orders, ids = [], []
            for j in range(lanes):
                best: tuple[float, list[int], list[Order]] | None = None
                for order in orders_to_try([cost[m] for m in mine[j]]).values() if mine[j] else ():
                    lane_ids = [mine[j][i] for i in order]
                    got, span = chunked_order(lane_costs[j], len(lane_ids), chunks=self.chunks, layout=layout,
                                              cap=self.cap, transfer_s=self.transfer_s,
                                              scale=[[relative_cost[k][m] for m in lane_ids] for k in range(ranks)],
                                              sizes=[sizes[m] for m in lane_ids])
                    if best is None or span < best[0]:
                        best = (span, lane_ids, got)
                orders.append(best[2] if best is not None else [])
                ids.append(best[1] if best is not None else [])
            label = f"{self.prefix}-{layout}-sized"
            out[label] = lanes_to_plan(orders, ids, members, chunks=self.chunks, layout=layout, name=label,
                                       cap=self.cap, sizes=sizes)
        return out
