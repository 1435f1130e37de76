"""Osprey: adaptive pipeline scheduling from measured latencies (the seed article's "osprey").

measure -> derive -> decide, once per global step:
1. Adaptive axis: an EMA of measured latency (seconds) per (stage, replica, kind F, B, I, W): the
   project's one EMA (``pdml_ray.priority.estimators.EMA``; a slot's first step mean replaces the
   prior, and so does a step mean further than ``jump_threshold`` from it: a level shift such as a
   throttled or recovered replica). B stays I + W (a measured B splits in the current I : W
   proportion). Each micro-batch's cost factor (its median ratio to the estimates over three or more
   stages) is divided out first, so uneven micro-batches do not read as slow replicas. Chunks of a
   two-chunk plan count for their rank at twice their latency. A replica left without work drifts
   towards its stage's fastest estimate (``stale_relax``) so it gets re-tried.
2. Bottleneck detection: with R replicas at every stage, the pipeline is cut into R lanes (lane j =
   the j-th fastest replica of every stage, so fast replicas pair with fast ones); a lane's period is
   its slowest member's F+B time, and that member is the lane's bottleneck. The stage with the largest
   balanced load 1 / sum_r 1 / (f_kr + b_kr) is reported as the pipeline's bottleneck.
3. Re-weighting with momentum: lane weights (micro-batch shares) move towards 1 / period, normalised:
   w <- momentum * w + (1 - momentum) * target, kept unchanged while the move is below
   ``rebalance_threshold`` (noise does not reshuffle plans).
4. Greedy assignment: micro-batches go one at a time to the lane with the earliest predicted finish
   (``_lane_plan``: each lane's finish time for n micro-batches, from list scheduling it alone);
   within a lane the replicas of consecutive stages are fixed, so micro-batches do not cross lanes
   (crossing couples every replica to every other; in the simulator that cost more than it gained).
   With unequal replica counts per stage there are no lanes: a ready forward goes to the replica of
   its stage with the earliest predicted finish (list scheduling with EFT placement).
5. Order and reordering: each replica's order comes from list scheduling the step on the predicted
   costs with 1F1B's rule (a ready backward first, forwards in micro-batch order), once per activation
   cap option (``cap_options``: 1F1B's stages - k, or uniform; never above the memory limit). Plans carry
   ``reorder=True``: the dispatcher lets a ready action overtake a blocked one of its own kind.
   (A critical-path "forwards first" priority lengthened steps under a memory cap: it delays the
   backward chain that frees upstream memory; see ``static.CriticalPathSchedule``.)
6. With ``OspreyConfig.plans='any'``, candidates beside them: every static order that fits the shape
   (gpipe, 1f1b and all of torch's: split backward and two to four chunks per rank included, zero
   bubble, ZBV, DualPipeV, interleaved), and each torch order on osprey's lanes with micro-batch counts in
   proportion to the lanes' current speeds (``<name>@lanes``: routing across replicas while keeping
   torch's order, W in its bubbles, within each pipeline). With unequal lane counts, osprey's own
   zero-bubble lanes too (``osprey-zb-v``, ``osprey-zb-loop``, and ``osprey-zb3-*``, ``osprey-zb4-*``
   over three and four chunks; ``pdml_ray.pipeline.chunked``): an order over those chunks per rank
   with F, I and W list-scheduled for each lane's own costs and count, within the memory limit, and the counts moved off the lane predicted last while that shortens the
   step. They are predicted by the simulator on the EMA costs; one that would exceed the memory limit
   is no candidate.
7. Choice: the candidate with the shortest predicted makespan, the warm-start plan's in-order makespan
   included (greedy list scheduling is not optimal; with one replica per stage 1F1B's fixed
   alternation can beat it).
8. Micro-batch sizes told before the step (``tell_sizes``; ``pdml_ray.pipeline.sizes``): the
   measurements are divided by each micro-batch's cost from a per-stage fit over its size (fixed +
   per-token + attention) instead of the median factors of step 1, and the step is planned on each
   micro-batch's predicted cost: lanes get micro-batches longest first by predicted busy time, each lane
   and the three fastest static candidates try a few micro-batch orders, every candidate is predicted
   by the simulator on those costs (with ``plans='any'`` osprey's zero-bubble lanes too, built on the
   sizes: ``ChunkedLanes.sized_plans``), and the plan carries the sizes as activations
   (``Plan.activation_sizes``), so the sum of held sizes stays within the memory limit.
Before any measurement the plan is the static warm-start plan (``OspreyConfig.warm_start``).
What was decided and why is a frozen ``OspreyDecision`` (``last_decision``), carried in every ``MicroBatchPlan``.
Everything is deterministic given the measurements, so replay reproduces plans exactly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from pdml_ray.config import OspreyConfig, PipelineConfig
from pdml_ray.errors import StateError
from pdml_ray.pipeline.listsched import in_order_makespan, list_schedule, single_pipeline_schedule, to_orders
from pdml_ray.pipeline.osprey_candidates import StaticCandidates
from pdml_ray.pipeline.osprey_decision import OspreyDecision
from pdml_ray.pipeline.plan import KIND_INDEX, Kind, Measurement, PipelineSchedule, Plan, check_state
from pdml_ray.pipeline.prediction import predicted_busy
from pdml_ray.pipeline.sizes import (SizeModel, check_sizes, estimates_simulator, orders_to_try, relabel,
                                     relative_costs, sized_lanes)
from pdml_ray.pipeline.static import DEFAULT_BACKWARD_S, DEFAULT_FORWARD_S
from pdml_ray.priority.estimators import EMA


MAX_TOLD_STEPS = 8
"""Steps ahead whose micro-batch sizes osprey keeps (a runtime tells one or two steps ahead)."""


class OspreySchedule:
    """Adaptive plans from measured latencies (measure -> derive -> decide, see the module docstring)."""

    name = "osprey"

    def __init__(self, *, stages: int, replicas: Sequence[int], microbatches: int,
                 config: PipelineConfig | OspreyConfig | None = None) -> None:
        if isinstance(config, OspreyConfig):
            config = PipelineConfig(osprey=config)
        self.pipeline_config = config if config is not None else PipelineConfig()
        self.config = self.pipeline_config.osprey
        self.stages, self.replicas, self.microbatches = stages, tuple(replicas), microbatches
        self.memory_limit = self.pipeline_config.memory_limit
        self.lanes = self.replicas[0] if len(set(self.replicas)) == 1 else 0  # 0: unequal counts, no lanes
        prior = self.pipeline_config.stage_costs or [(DEFAULT_FORWARD_S, DEFAULT_BACKWARD_S)] * stages
        # Latency estimates: one EMA slot per (replica, kind), replicas numbered stage by stage
        # (``_first[k] + r``), shape (sum(replicas), len(Kind)): F, B, I, W seconds (``KIND_INDEX``);
        # I and W start at half of B each, and B stays I + W once split backwards are measured.
        self._first = [sum(self.replicas[:k]) for k in range(stages)]
        priors = np.array([(f, b, b / 2, b / 2) for k in range(stages) for f, b in [prior[k][:2]]
                           for _ in range(self.replicas[k])], dtype=np.float64)
        self.latency = EMA((sum(self.replicas), len(Kind)), self.config.ema_alpha, priors)
        self.est = self._est_view(self.latency.values.tolist())
        """est[k][r][KIND_INDEX[kind]]: ``latency.values`` as python floats, the view list scheduling
        reads (cheaper there than numpy scalars); re-read whenever the EMA changes. Do not write it."""
        self.weights: list[float] = [1.0 / max(1, self.lanes)] * max(1, self.lanes)
        self.steps_observed = 0
        self.last_decision = OspreyDecision(kind="warm-start", warm_start=self.config.warm_start)
        self._warm: PipelineSchedule | None = None  # the warm-start static schedule, built on first use
        self._candidates = StaticCandidates(stages, self.replicas, microbatches, self.pipeline_config) \
            if self.config.plans == "any" else None
        self._layouts: dict[int, tuple[tuple[int, ...], int] | None] = {}
        """step -> (stage_rank, chunks) of the plan issued for it when it had virtual stages (else None):
        its measurements map back to ranks (this scheduler's stages) at chunks x their latency. Plans
        may be issued a step ahead, so measurements take the oldest step not yet observed."""
        self.sizes: dict[int, tuple[float, ...]] = {}
        """step -> its micro-batch sizes as told before it was planned (``tell_sizes``), until it is observed."""
        self.size_model = SizeModel(stages, self.config.ema_alpha)
        """Per stage, a micro-batch's cost over a nominal one's as a function of its size."""

    def _est_view(self, values: list[list[float]]) -> list[list[tuple[float, ...]]]:
        """``est`` from ``latency.values.tolist()``."""
        return [[tuple(values[self._first[k] + r]) for r in range(self.replicas[k])] for k in range(self.stages)]

    def tell_sizes(self, step: int, sizes: Sequence[float]) -> None:
        """Step ``step``'s micro-batch sizes (relative to the nominal micro-batch), before it is planned:
        its plan predicts each micro-batch's cost from its size and keeps the sum of held sizes within
        the memory limit. Sizes of at most ``MAX_TOLD_STEPS`` steps not yet observed are kept."""
        self.sizes[int(step)] = check_sizes(sizes, self.microbatches)
        while len(self.sizes) > MAX_TOLD_STEPS:
            del self.sizes[min(self.sizes)]

    # ---- measure -------------------------------------------------------------------------------
    def observe(self, measurements: Sequence[Measurement]) -> None:
        """Fold one step's mean latency per (stage, replica, kind) into the EMA, relax the replicas
        that got no work, then re-detect bottlenecks and re-weight."""
        sums: dict[tuple[int, int, int], list[float]] = {}  # (stage, replica, kind index) -> [total s, count]
        observed = min(self._layouts) if self._layouts else None  # the step these measurements are of
        layout = self._layouts.pop(observed) if observed is not None else None
        stage_rank, chunks = layout if layout is not None else (None, 1)
        if stage_rank is None:  # a plan of this scheduler's stages (anything else cannot be mapped back)
            measurements = [x for x in measurements if x.stage < self.stages]
        # (stage, replica, kind index, micro-batch, seconds) per measurement, chunks mapped to their rank
        # at chunks x their latency (a chunk is 1 / chunks of its rank's stage).
        rows = [(stage_rank[x.stage] if stage_rank is not None else x.stage, x.replica, KIND_INDEX[x.kind],
                 x.microbatch, x.latency_s * chunks) for x in measurements]
        current = self.latency.values
        squares: dict[tuple[int, int, int], float] = {}  # sum of squared seconds per slot: the step's spread
        divisors = relative_costs([(k, m) for k, _, _, m, _ in rows],
                                  [t / max(1e-12, current[self._first[k] + r][i]) for k, r, i, _, t in rows],
                                  self.sizes.get(observed) if observed is not None else None, self.size_model)
        for (k, r, i, m, t), divisor in zip(rows, divisors):
            acc = sums.setdefault((k, r, i), [0.0, 0])
            x = t / max(1e-12, divisor)
            acc[0] += x
            acc[1] += 1
            squares[(k, r, i)] = squares.get((k, r, i), 0.0) + x * x
        if observed is not None:  # sizes told for this step and earlier ones are spent
            self.sizes = {t: v for t, v in self.sizes.items() if t > observed}
        if not sums:
            return
        # A full backward and its split halves describe the same work: derive the missing ones (B = I + W;
        # a measured B splits in the estimates' current I : W proportion).
        bi, ii, wi = KIND_INDEX[Kind.BACKWARD], KIND_INDEX[Kind.INPUT], KIND_INDEX[Kind.WEIGHT]
        for k, r, i in list(sums):
            if i == bi:
                b = sums[(k, r, bi)][0] / sums[(k, r, bi)][1]
                share = current[self._first[k] + r][wi] / max(1e-12, current[self._first[k] + r][ii] + current[self._first[k] + r][wi])
                sums.setdefault((k, r, ii), [b * (1 - share), 1])
                sums.setdefault((k, r, wi), [b * share, 1])
            elif i == ii and (k, r, wi) in sums and (k, r, bi) not in sums:
                sums[(k, r, bi)] = [sums[(k, r, ii)][0] / sums[(k, r, ii)][1] + sums[(k, r, wi)][0] / sums[(k, r, wi)][1], 1]
        # One vectorised EMA update of every measured (slot, kind): the slots are distinct.
        slots = np.array([self._first[k] + r for k, r, _ in sums])
        kinds = np.array([i for _, _, i in sums])
        means = np.array([total / n for total, n in sums.values()])
        # Standard error of each step mean (0 where derived, B = I + W): a shift must stand out of the noise.
        stderr = np.array([math.sqrt(max(0.0, squares[key] / n - (total / n) ** 2) / n) if key in squares else 0.0
                           for key, (total, n) in sums.items()])
        before = self.latency.values[slots, kinds].copy()
        self.latency.update((slots, kinds), means)
        if self.config.jump_threshold:  # a level shift replaces the estimate (OspreyConfig.jump_threshold)
            shift = means - before
            jump = np.abs(shift) > np.maximum(self.config.jump_threshold * before, 3.0 * stderr)
            # A replica's level shift moves every kind it ran, the same way; per-action noise seldom does.
            for slot in np.unique(slots):
                mine = slots == slot
                if not (jump[mine].all() and (np.sign(shift[mine]) == np.sign(shift[mine][0])).all()):
                    jump[mine] = False
            self.latency.values[slots[jump], kinds[jump]] = means[jump]
        seen = {(k, r) for k, r, _ in sums}
        # Stale relax, on python floats (values[slot][kind index]), written back into the EMA's values.
        values, relax, stale = self.latency.values.tolist(), self.config.stale_relax, False
        for k in range(self.stages):
            rows = values[self._first[k]:self._first[k] + self.replicas[k]]
            best = min(rows, key=lambda c: c[0] + c[1])
            for r, c in enumerate(rows):
                if (k, r) not in seen:
                    stale = True
                    for i in range(len(c)):
                        c[i] += relax * (best[i] - c[i])  # the best row itself moves by 0
        if stale:
            self.latency.values[...] = values
        self.est = self._est_view(values)
        self.steps_observed += 1
        self._reweight()

    # ---- derive --------------------------------------------------------------------------------
    def _period(self, k: int, r: int) -> float:
        return self.est[k][r][0] + self.est[k][r][1]

    def stage_loads(self) -> list[float]:
        """Seconds per micro-batch each stage needs with perfect balancing over its replicas."""
        return [1.0 / sum(1.0 / self._period(k, r) for r in range(self.replicas[k])) for k in range(self.stages)]

    def lane_members(self) -> list[list[int]]:
        """[stage][lane] -> replica: lane j holds the j-th fastest replica of every stage."""
        return [sorted(range(self.replicas[k]), key=lambda r: (self._period(k, r), r)) for k in range(self.stages)]

    def _reweight(self) -> None:
        loads = self.stage_loads()
        decision = OspreyDecision(kind="adaptive", step=self.steps_observed, stage_loads_s=tuple(loads),
                                  bottleneck_stage=max(range(self.stages), key=lambda k: loads[k]))
        if self.lanes:
            members = self.lane_members()
            periods = [max(self._period(k, members[k][j]) for k in range(self.stages)) for j in range(self.lanes)]
            inv = [1.0 / p for p in periods]
            target = [x / sum(inv) for x in inv]
            first = self.steps_observed == 1
            m = 0.0 if first else self.config.momentum
            new = [m * w + (1 - m) * t for w, t in zip(self.weights, target)]
            moved = max(abs(x - w) for x, w in zip(new, self.weights))
            rebalanced = first or moved > self.config.rebalance_threshold
            if rebalanced:
                self.weights = new
            decision = dataclasses.replace(
                decision, lanes=tuple(tuple(m) for m in members), lane_period_s=tuple(periods),
                lane_bottleneck_stage=tuple(max(range(self.stages), key=lambda k: self._period(k, members[k][j]))
                                            for j in range(self.lanes)),
                target_weights=tuple(target), weights=tuple(self.weights), rebalanced=rebalanced)
        self.last_decision = decision

    # ---- decide --------------------------------------------------------------------------------
    def cap_options(self) -> dict[str, list[int]]:
        """Activation caps per replica of each stage that osprey tries, by name.

        'pipeline-depth': 1F1B's stages - k (+ ``extra_in_flight``); 'uniform': the memory limit at
        every stage (or, without a limit, ``stages``: 1F1B's own peak), which lets stages in front of
        a slow one buffer more work. Both stay within the memory limit.
        """
        S, limit = self.stages, self.memory_limit
        depth = [S - k + self.config.extra_in_flight for k in range(S)]
        if limit is not None:
            depth = [min(c, limit) for c in depth]
        uniform = [limit if limit is not None else S] * S
        return {"pipeline-depth": depth, "uniform": uniform} if uniform != depth else {"pipeline-depth": depth}

    def _lane_plan(self, caps: Sequence[int]) -> tuple[list[list[list[tuple[Kind, int]]]], float, list[int]]:
        """Raw orders, predicted makespan (s) and micro-batches per lane, for activation ``caps``.

        Lanes share no replica, so each is list-scheduled alone as a one-replica pipeline on its
        members' EMA costs, for 10% (+1) more micro-batches than its weight suggests. The completion
        times of successive micro-batches give the lane's finish time T_j(n) for n micro-batches
        (extrapolated by the lane period beyond the run); assigning micro-batches one at a time to
        the lane whose T_j(n_j + 1) is smallest (greedy by predicted finish time) minimises the
        largest T_j exactly, since each T_j is nondecreasing. Each lane keeps the orders of its first
        n_j micro-batches (a sub-run of a feasible run stays feasible).
        """
        S, L, M = self.stages, self.lanes, self.microbatches
        members = self.lane_members()
        curves: list[list[float]] = []
        lane_raw: list[list[list[tuple[Kind, int]]]] = []
        lane_costs, periods = [], []
        for j in range(L):
            f_s = [self.est[k][members[k][j]][0] for k in range(S)]
            b_s = [self.est[k][members[k][j]][1] for k in range(S)]
            lane_costs.append((f_s, b_s))
            periods.append(max(f + b for f, b in zip(f_s, b_s)))
            n_max = min(M, math.ceil(M * self.weights[j] * 1.1) + 1)
            raw, done = single_pipeline_schedule(f_s, b_s, n_max, caps)
            curve, latest = [], 0.0
            for t in done:
                latest = max(latest, t)
                curve.append(latest)
            curves.append(curve)
            lane_raw.append(raw)

        def finish_time(j: int, n: int) -> float:
            c = curves[j]
            return 0.0 if n == 0 else c[n - 1] if n <= len(c) else c[-1] + (n - len(c)) * periods[j]

        counts = [0] * L
        for _ in range(M):
            j = min(range(L), key=lambda j: (finish_time(j, counts[j] + 1), j))
            counts[j] += 1
        for j in range(L):
            if counts[j] > len(curves[j]):  # ran past the lane's sized run: schedule it at full length
                lane_raw[j], _ = single_pipeline_schedule(*lane_costs[j], counts[j], caps)
        # Global micro-batch ids: spread the lanes' shares evenly over 0..M-1 (smooth weighted round-robin).
        given = [0] * L
        ids: list[list[int]] = [[] for _ in range(L)]
        for m in range(M):
            j = min((j for j in range(L) if given[j] < counts[j]), key=lambda j: ((given[j] + 1) / counts[j], j))
            ids[j].append(m)
            given[j] += 1
        raw_global: list[list[list[tuple[Kind, int]]]] = [[[] for _ in range(self.replicas[k])] for k in range(S)]
        for j in range(L):
            for k in range(S):
                raw_global[k][members[k][j]] = [(kind, ids[j][i]) for kind, i in lane_raw[j][k] if i < counts[j]]
        return raw_global, max(finish_time(j, counts[j]) for j in range(L)), counts

    def _warm_plan(self, step: int) -> Plan:
        if self._warm is None:
            from pdml_ray.pipeline.registry import make_schedule

            self._warm = make_schedule(self.config.warm_start, stages=self.stages, replicas=self.replicas,
                                        microbatches=self.microbatches, config=self.pipeline_config)
        return dataclasses.replace(self._warm.plan(step), reorder=True, schedule=self.name)

    def plan(self, step: int) -> Plan:
        """The adaptive plan with the best cap option, or the warm-start plan if that is predicted faster.

        Predictions are makespans on the EMA costs (seconds): the list-scheduled run for each cap
        option, the in-order run for the warm-start plan. A step whose sizes were told is planned on them
        (``_plan_sized``), from the first step on (before any measurement, on the prior costs).
        """
        warm = self._warm_plan(step)
        sizes = self.sizes.get(step)
        if sizes is not None and any(abs(s - 1.0) > 1e-9 for s in sizes):  # from the first step: within the cap
            g = self.size_model.relative_cost(sizes)  # (stages, micro-batches)
            return self._issued(step, self._plan_sized(step, warm, sizes, g), g)
        if self.steps_observed == 0:
            return self._issued(step, warm)
        S = self.stages
        predicted: dict[str, float] = {}
        best: tuple[float, str, Any, list[int] | None] | None = None
        for label, caps in self.cap_options().items():
            counts = None
            if self.lanes:
                orders, makespan, counts = self._lane_plan(caps)
            else:  # unequal replica counts: earliest-finish-time placement while list scheduling
                orders, makespan = list_schedule(S, self.replicas, self.microbatches, self.est, [(1, 0)] * S, caps,
                                                 materialize=False)
            predicted[label] = makespan
            if best is None or makespan < best[0]:
                best = (makespan, label, orders, counts)
        # Every static order (the project's and torch's, zero bubble and virtual stages included), and
        # torch's orders on osprey's lanes with its micro-batch counts, predicted by the simulator on the
        # EMA costs; orders that would exceed the memory limit are not candidates.
        statics: dict[str, Plan] = {}
        predictor = self._predictor()
        if self.pipeline_config.transfer_s:  # list scheduling took transfers as free: re-predict the best
            assert best is not None
            own = Plan(S, self.replicas, self.microbatches, to_orders(best[2]), reorder=True,
                       memory_limit=self.memory_limit, schedule=self.name)
            best = (predictor.run_step(own).makespan_s, *best[1:])
            predicted[best[1]] = best[0]
        for label, candidate in self._static_candidates(self._lane_counts()).items():
            result = predictor.run_step(candidate)
            if result.memory_violations == 0:
                predicted[label], statics[label] = result.makespan_s, candidate
        predicted["warm-start"] = in_order_makespan(warm.orders, S, self.est, self.pipeline_config.transfer_s)
        assert best is not None
        choice = min(predicted, key=lambda label: (predicted[label], label != best[1]))
        self.last_decision = dataclasses.replace(
            self.last_decision, predicted_makespan_s=tuple(predicted.items()),
            chosen=choice, lane_microbatches=None if best[3] is None else tuple(best[3]))
        if choice == "warm-start":
            return self._issued(step, warm)
        if choice in statics:
            return self._issued(step, dataclasses.replace(statics[choice], schedule=self.name))
        return self._issued(step, Plan(S, self.replicas, self.microbatches, to_orders(best[2]), reorder=True,
                                 memory_limit=self.memory_limit, schedule=self.name))

    def _plan_sized(self, step: int, warm: Plan, sizes: tuple[float, ...], g: np.ndarray) -> Plan:
        """The plan of a step whose micro-batch sizes were told. Candidates: osprey's lane plans per cap
        option built on each micro-batch's predicted cost (``SizeModel``; ``sizes.sized_lanes``), holding
        at most the memory limit in sizes; every static candidate; for the three predicted fastest of
        those, their micro-batches reordered (``orders_to_try``, '<name>~<order>'); and the warm start.
        All are predicted by the simulator on those costs and sizes, and the fastest that stays within
        the memory limit is chosen (the one fewest replicas exceed, if none does). ``g``: each micro-batch's
        cost over a nominal one's per stage (``SizeModel.relative_cost(sizes)``)."""
        S, M = self.stages, self.microbatches
        predictor = self._predictor(sizes, g)
        results: dict[str, tuple[int, float]] = {}  # label -> (replicas over the limit, makespan s)
        plans: dict[str, Plan] = {}

        def consider(label: str, plan: Plan) -> None:
            result = predictor.run_step(plan, step)
            results[label], plans[label] = (result.memory_violations, result.makespan_s), plan

        own_counts: dict[str, list[int] | None] = {}
        limit = None if self.memory_limit is None else max(self.memory_limit, math.ceil(max(sizes) - 1e-9))
        for label, caps in self.cap_options().items():
            if self.lanes:
                members = self.lane_members()
                lane_costs = [([self.est[k][members[k][j]][0] for k in range(S)],
                               [self.est[k][members[k][j]][1] for k in range(S)]) for j in range(self.lanes)]
                lanes, _, own_counts[label] = sized_lanes(lane_costs, caps, sizes, g, self.pipeline_config.transfer_s)
                raw: list[list[list[tuple[Kind, int]]]] = [[[] for _ in range(self.replicas[k])] for k in range(S)]
                for j, lane in enumerate(lanes):
                    for k in range(S):
                        raw[k][members[k][j]] = lane[k]
                consider(label, Plan(S, self.replicas, M, to_orders(raw), reorder=True, memory_limit=limit,
                                     schedule=self.name, activation_sizes=sizes))
            else:  # unequal replica counts: earliest-finish-time placement on nominal costs, counted activations
                orders, _ = list_schedule(S, self.replicas, M, self.est, [(1, 0)] * S, caps)
                consider(label, Plan(S, self.replicas, M, orders, reorder=True, memory_limit=self.memory_limit,
                                     schedule=self.name))
                own_counts[label] = None
        for label, candidate in self._static_candidates(self._lane_counts()).items():
            consider(label, candidate)
        zero_bubble = self._candidates.sized_plans(self._lanes, sizes, g.tolist()) \
            if self._candidates is not None and self.lanes else {}  # osprey's zero-bubble lanes, on the sizes
        for label, candidate in zero_bubble.items():
            consider(label, candidate)
        # the three fastest static orders, their micro-batches reordered (osprey's own orders chose theirs)
        statics = sorted((x for x in results if x not in own_counts and x not in zero_bubble and results[x][0] == 0),
                         key=lambda x: results[x][1])
        for label in statics[:3]:
            for name, order in orders_to_try(g.mean(axis=0).tolist()).items():
                if name != "given":
                    consider(f"{label}~{name}", relabel(plans[label], order))
        consider("warm-start", warm)
        choice = min(results, key=lambda x: (results[x][0] > 0, results[x][0], results[x][1], x not in own_counts))
        best_own = min(own_counts, key=lambda x: results[x])
        fits = {x: v[1] for x, v in results.items() if v[0] == 0} or {x: v[1] for x, v in results.items()}
        self.last_decision = dataclasses.replace(
            self.last_decision, predicted_makespan_s=tuple(fits.items()), chosen=choice,
            lane_microbatches=None if own_counts[best_own] is None else tuple(own_counts[best_own] or ()))
        return dataclasses.replace(plans[choice], schedule=self.name)

    def _issued(self, step: int, plan: Plan, relative_cost: np.ndarray | None = None) -> Plan:
        """Remember the layout of the plan handed out for ``step``, so its measurements map back to stages,
        and record what it predicts each executor is busy for (``OspreyDecision.predicted_busy_s``; on the
        step's ``relative_cost`` per micro-batch where it was planned on its sizes)."""
        self._layouts[step] = (plan.stage_rank, plan.num_stages // self.stages) \
            if plan.num_stages != self.stages and plan.stage_rank is not None else None
        cost = relative_cost.tolist() if relative_cost is not None else None
        self.last_decision = dataclasses.replace(self.last_decision,
                                                 predicted_busy_s=predicted_busy(plan, self.est, cost))
        return plan

    def _predictor(self, sizes: Sequence[float] | None = None, relative_cost: np.ndarray | None = None) -> Any:
        """A noiseless simulator of the EMA costs (``sizes.estimates_simulator``), on a step's told sizes."""
        return estimates_simulator(self.est, self.replicas, self.memory_limit, self.pipeline_config.transfer_s,
                                   sizes, relative_cost)

    def _lane_counts(self) -> list[int] | None:
        """Micro-batches per lane in proportion to the lanes' current speeds (1 / period; no momentum: a
        torch order on lanes is re-cut each step), rounded by the batch-size rule; None without lanes."""
        from pdml_ray.batching import round_to_batch_sizes

        target = self.last_decision.target_weights
        if not self.lanes or target is None:
            return None
        return [int(c) for c in round_to_batch_sizes(list(target), self.microbatches)]

    def _static_candidates(self, lane_counts: Sequence[int] | None) -> dict[str, Plan]:
        """label -> plan, with ``OspreyConfig.plans='any'`` (``StaticCandidates``: every static order, and
        with unequal lane counts torch's orders and osprey's zero-bubble lanes on them); none with
        'full-backward': osprey's lane plans already are 1F1B's rule on its lanes, and each candidate
        costs a simulated step to predict."""
        if self._candidates is None:
            return {}
        return self._candidates.plans(lane_counts, self._lanes)

    def _lanes(self) -> tuple[list[list[int]], list[list[tuple[float, float, float]]]]:
        """(members, costs): ``lane_members()`` and each lane's member's (F, I, W) seconds per stage."""
        members = self.lane_members()
        f, i, w = KIND_INDEX[Kind.FORWARD], KIND_INDEX[Kind.INPUT], KIND_INDEX[Kind.WEIGHT]
        return members, [[(c[f], c[i], c[w]) for k in range(self.stages) for c in [self.est[k][members[k][j]]]]
                         for j in range(self.lanes)]

    # ---- replay --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"latency": self.latency.state_dict(), "weights": list(self.weights),
                "steps_observed": self.steps_observed, "last_decision": self.last_decision.to_dict(),
                "layouts": [[t, None if v is None else [list(v[0]), v[1]]] for t, v in sorted(self._layouts.items())],
                "sizes": [[t, list(v)] for t, v in sorted(self.sizes.items())], "size_model": self.size_model.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, ("latency", "weights", "steps_observed", "last_decision"), self.name)
        shape = np.shape(state["latency"].get("values"))
        if shape != self.latency.values.shape:
            raise StateError(f"saved osprey estimates have shape {shape} (replica slots, kinds), this schedule needs "
                             f"{self.latency.values.shape} for replicas {list(self.replicas)}; load a state saved "
                             "for the same stages and replicas")
        self.latency.load_state_dict(state["latency"])
        self.est = self._est_view(self.latency.values.tolist())
        self.weights = [float(w) for w in state["weights"]]
        self.steps_observed = int(state["steps_observed"])
        self.last_decision = OspreyDecision.from_dict(state["last_decision"])
        self._layouts = {int(t): None if v is None else (tuple(int(k) for k in v[0]), int(v[1]))
                         for t, v in state.get("layouts", [])}
        self.sizes = {int(t): check_sizes(v, self.microbatches) for t, v in state.get("sizes", [])}
        if "size_model" in state:
            self.size_model.load_state_dict(state["size_model"])
