"""The one dispatch rule shared by the simulator and the Ray-actor pipeline runtime.

An idle replica asks ``next_action``; the caller ``start``s what it got and ``complete``s it when it
finishes. The rule: an action may start when its producers (``plan.dependency_table``, the one
dependency rule) are complete (and, across ranks, have arrived: ``transfer_s`` after completion) and,
for a forward, when the activations the replica holds plus its own stay within ``plan.memory_limit`` (counted
in ``plan.activation(m)`` units: one per micro-batch, or its size when the plan carries sizes). Without
``plan.reorder`` only the replica's next action in order is eligible; with it, the first eligible action in priority order, where an action may skip a blocked
head only across a run of actions of its own kind: out-of-order arrivals don't idle the replica, but
forwards and backwards keep the plan's interleaving, which is what bounds memory and keeps the
critical forward chain first.

Deadlock freedom: ``validate`` checks that the in-order run finishes within the memory limit. With
reorder, take a stuck state and the first action a* of the in-order run's sequence not yet done. Its
dependencies and its replica's earlier actions are done, so a* heads its replica's pending list and
is ready. A backward is never blocked by memory. If a* is a forward, what its replica ran out of
order after a* are forwards of the run of forwards that a* starts; up to the last of them the in-order
activation held is at least what is held now plus a*'s own (sizes are positive), and validation bounds that by
the limit: a* is eligible, a contradiction.

A replica that dies mid-step (``drop_replica``) loses its micro-batches of that stage to the
survivors (``pdml_ray.pipeline.faults.Reroute`` says how). From then on the step runs as plain
dataflow: every live replica takes the first ready action in its order, whatever its kind, and the
memory limit no longer binds. Dataflow cannot deadlock (the dependencies form a DAG and every pending
action has a live replica), which the in-order guarantee above no longer covers once work has moved.
"""

from __future__ import annotations

import math

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.faults import Reroute, pick_survivor
from pdml_ray.pipeline.plan import FREES_ACTIVATION, Action, Kind, Plan, dependency_table


class Dispatcher:
    """Tracks one global step of a plan: what started, what completed, activations in flight."""

    def __init__(self, plan: Plan, *, transfer_s: float = 0.0) -> None:
        self.plan = plan
        self.transfer_s = float(transfer_s)
        """Seconds between a producer completing and its output being usable on another stage."""
        deps = dependency_table(plan.num_stages, plan.split_backward)
        self._producers, self._consumers = deps.producers, deps.consumers
        # orders key ((stage, replica), or (rank, replica) with virtual stages) -> actions not yet started,
        # in priority order.
        self._pending: dict[tuple[int, int], list[Action]] = {key: list(acts) for key, acts in plan.orders.items()}
        self._done_at: dict[tuple[int, Kind, int], float] = {}  # (stage, kind, microbatch) -> completed at (s)
        self._in_flight: dict[tuple[int, int], int] = {key: 0 for key in plan.orders}
        self.peak_in_flight: dict[tuple[int, int], int] = {key: 0 for key in plan.orders}
        self._held: dict[tuple[int, int], float] = {key: 0.0 for key in plan.orders}  # units of memory_limit
        self._limit = plan.memory_limit if plan.memory_limit is not None else math.inf
        # Rank of each stage: an output moves between ranks (transfer_s), not between chunks of one rank.
        self._rank = plan.stage_rank if plan.stage_rank is not None else tuple(range(plan.num_stages))
        self._late: dict[tuple[int, Kind, int], float] = {}  # outputs whose transfer takes its own seconds
        self._total = plan.num_actions
        self._completed = 0
        self._placement = dict(plan.placement)  # (stage, microbatch) -> replica; changes on drop_replica
        self._dead: set[tuple[int, int]] = set()
        self._dataflow = False  # set once work has moved after a death: see the module docstring

    def _ready(self, action: Action, now: float) -> bool:
        m = action.microbatch
        for stage, kind in self._producers[action.stage][action.kind]:
            t = self._done_at.get((stage, kind, m))
            if t is None:
                return False
            if self._rank[stage] != self._rank[action.stage] and t + self._late.get((stage, kind, m), self.transfer_s) > now:
                return False
        return True

    def _eligible(self, action: Action, now: float) -> bool:
        if action.kind is Kind.FORWARD and self._held[self.plan.slot(action.stage, action.replica)] \
                + self.plan.activation(action.microbatch) > self._limit + 1e-9:
            return False
        return self._ready(action, now)

    def next_action(self, stage: int, replica: int, now: float = math.inf) -> Action | None:
        """What the idle replica should start at time ``now`` (seconds; default: ignore transfer time).
        With virtual stages (``plan.stage_rank``) ``stage`` is the rank: the orders key."""
        pending = self._pending[(stage, replica)]
        if not pending:
            return None
        if self._dataflow:
            return next((a for a in pending if self._ready(a, now)), None)
        if not self.plan.reorder:
            return pending[0] if self._eligible(pending[0], now) else None
        # Reorder rule: an action may overtake earlier pending actions only if they are all of its
        # own kind (a forward overtakes forwards, a backward backwards): micro-batches that arrive out
        # of order no longer idle the replica, yet forwards never get further ahead of backwards than
        # the plan says, and backwards never delay a forward (whose remaining critical path is
        # longer); letting them cross measurably lengthened noisy steps in the simulator.
        head = pending[0].kind
        for action in pending:
            if action.kind is not head:
                return None
            if self._eligible(action, now):
                return action
        return None

    def start(self, action: Action) -> None:
        key = self.plan.slot(action.stage, action.replica)
        pending = self._pending[key]
        try:
            pending.remove(action)
        except ValueError:
            raise PlanError(f"{action} is not pending on stage {action.stage} replica {action.replica} "
                            "(started twice, or not in the plan)") from None
        if action.kind is Kind.FORWARD:
            self._in_flight[key] += 1
            self._held[key] += self.plan.activation(action.microbatch)
            if self._in_flight[key] > self.peak_in_flight[key]:
                self.peak_in_flight[key] = self._in_flight[key]

    def complete(self, action: Action, at: float = 0.0, transfer_s: float | None = None) -> None:
        """Record that ``action`` finished at time ``at`` (seconds); a B or W frees its activation.
        ``transfer_s``: this output's own seconds to reach another rank (a late transfer), instead of
        the dispatcher's ``transfer_s``."""
        key = (action.stage, action.kind, action.microbatch)
        if key in self._done_at:
            raise PlanError(f"{action} completed twice")
        self._done_at[key] = float(at)
        if transfer_s is not None and transfer_s != self.transfer_s:
            self._late[key] = float(transfer_s)
        else:
            self._late.pop(key, None)  # a re-run after a replica died arrives on time
        if action.kind in FREES_ACTIVATION:
            self._in_flight[self.plan.slot(action.stage, action.replica)] -= 1
            self._held[self.plan.slot(action.stage, action.replica)] -= self.plan.activation(action.microbatch)
        self._completed += 1

    def dependants(self, action: Action) -> list[Action]:
        """The action(s) waiting on ``action``'s output: whose replicas to wake when it completes.

        Each runs on the replica that holds its micro-batch at its stage (the placement rule).
        """
        m = action.microbatch
        return [Action(stage, self._placement[(stage, m)], kind, m)
                for stage, kind in self._consumers[action.stage][action.kind]]

    def replica_of(self, stage: int, microbatch: int) -> int:
        """The replica that holds ``microbatch`` at ``stage`` now (the plan's, unless a death moved it)."""
        return self._placement[(stage, microbatch)]

    def drop_replica(self, stage: int, replica: int, step: int = 0) -> Reroute:
        """Replica ``replica`` of ``stage`` died: move all its micro-batches of this step to survivors.

        Its accumulated gradients died with it, so every micro-batch placed on it at ``stage`` runs
        its forward and backward again on a survivor (least-loaded first), whatever state it had
        reached; done forwards and backwards there are forgotten, so their consumers that have not
        started yet wait for the re-run. Its started actions never complete; the caller drops them.
        PlanError if the stage has no live replica left.
        """
        if self.plan.split_backward or self.plan.stage_rank is not None:
            raise PlanError("a replica can be dropped only from a plan of F and B without virtual stages; run "
                            "split-backward or virtual-stage plans without fault injection")
        key = (stage, replica)
        if key not in self._pending or key in self._dead:
            raise PlanError(f"stage {stage} replica {replica} is not a live replica of this step")
        self._dead.add(key)
        survivors = [r for r in range(self.plan.replicas[stage]) if (stage, r) not in self._dead]
        if not survivors:
            raise PlanError(f"stage {stage} has no live replica left (replica {replica} was the last)")
        lost = sorted(m for (k, m), r in self._placement.items() if k == stage and r == replica)
        load = {r: len(self._pending[(stage, r)]) for r in survivors}
        added: dict[int, list[Action]] = {r: [] for r in survivors}
        moved: list[tuple[int, int]] = []
        replayed: list[int] = []
        redone: list[int] = []
        for m in lost:
            s = pick_survivor(load)
            load[s] += 2
            for kind, forgotten in ((Kind.FORWARD, replayed), (Kind.BACKWARD, redone)):
                if self._done_at.pop((stage, kind, m), None) is not None:
                    self._completed -= 1
                    forgotten.append(m)
            self._placement[(stage, m)] = s
            added[s] += [Action(stage, s, Kind.FORWARD, m), Action(stage, s, Kind.BACKWARD, m)]
            moved.append((m, s))
        for s, actions in added.items():
            self._pending[(stage, s)][:0] = actions  # late already: first in the survivor's order
        self._pending[key] = []
        self._in_flight[key] = 0
        self._held[key] = 0.0
        self._dataflow = True
        return Reroute(step, stage, replica, tuple(moved), tuple(replayed), tuple(redone))

    def in_flight(self, stage: int, replica: int) -> int:
        """Activations held by orders key (stage, replica) (the rank with virtual stages)."""
        return self._in_flight[(stage, replica)]

    def pending(self, stage: int, replica: int) -> int:
        """Actions not yet started by orders key (stage, replica) (the rank with virtual stages)."""
        return len(self._pending[(stage, replica)])

    def done(self) -> bool:
        return self._completed == self._total

