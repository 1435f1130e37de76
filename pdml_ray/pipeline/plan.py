"""Pipeline plans as data: actions, the dependency rule, per-replica orders, validation, a printable grid.

A pipeline has ``num_stages`` stages; stage k has ``replicas[k]`` identical copies (replicas). One
global step runs every micro-batch forward through all stages and backward again, sums the gradients
over micro-batches and over the replicas of a stage, and takes one optimizer step.

Dependency rule (``producers``, the one place it is written): F(k, m) needs F(k-1, m); B(k, m) (the
full backward) needs B(k+1, m), or F(k, m) at the last stage (the loss). With split backward (zero
bubble) B is two actions: I(k, m), the input gradient, needs I(k+1, m) or F(k, m) at the last stage,
and W(k, m), the weight gradient, needs I(k, m) at the same stage. A plan uses one of the two action
sets, F + B or F + I + W (``Plan.kinds``). ``dependency_table`` derives from the rule, once per number
of stages and action set, who consumes each output (the inverse) and which actions start and end a
micro-batch's chain. Validation, the ``Dispatcher``, the list scheduler and the simulator all read
that table; which ready kind a replica picks, and memory, stay policy.

Virtual stages: a rank (one executor; with replicas, one replica of it) may hold the chunks of several
stages (interleaved and V-shaped schedules). ``Plan.stage_rank`` maps each stage to its rank; a plan's
orders are then keyed by (rank, replica) and one order holds the actions of every stage on that rank.

Placement rule: the forward of micro-batch m at stage k runs on exactly one replica of stage k and every
other action of m at stage k on the same replica (the activations live there); the forward at stage
k+1 may go to any replica of stage k+1. A ``Plan`` fixes that placement and, per replica, the priority
order of its actions. ``validate`` checks a plan on the CPU before anything runs (shape of
``torch.distributed.pipelining``'s ``_validate_pipeline_order``); ``format`` prints the grid.
``PipelineSchedule`` is what every schedule (static, osprey, auto) implements.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any, Mapping, Protocol, Sequence

from pdml_ray.errors import PlanError, StateError, shown


class Kind(str, Enum):
    FORWARD = "F"
    BACKWARD = "B"
    """The full backward: input and weight gradients in one action."""
    INPUT = "I"
    """Split backward's input gradient: what the previous stage waits for."""
    WEIGHT = "W"
    """Split backward's weight gradient: nothing waits for it but the optimizer step."""


KIND_INDEX: dict[Kind, int] = {kind: i for i, kind in enumerate(Kind)}
"""Position of a kind in per-kind costs such as ``(forward_s, backward_s, input_s, weight_s)``: F=0,
B=1, I=2, W=3 (schedules of F and B read only the first two)."""

FULL_BACKWARD_KINDS: tuple[Kind, ...] = (Kind.FORWARD, Kind.BACKWARD)
SPLIT_BACKWARD_KINDS: tuple[Kind, ...] = (Kind.FORWARD, Kind.INPUT, Kind.WEIGHT)
FREES_ACTIVATION: frozenset[Kind] = frozenset({Kind.BACKWARD, Kind.WEIGHT})
"""Kinds whose completion frees the micro-batch's activations at its stage (W needs them too)."""

_ACTION_RE = re.compile(r"^s([0-9]{1,9})r([0-9]{1,9})([FBIW])([0-9]{1,9})$")  # ASCII digits, at most 9 of each

MAX_CHUNKS = 4
"""Most chunks per rank (virtual stages) any schedule here plans: torch's interleaved zero bubble at four
and osprey's zero-bubble lanes up to it. The pipeline axis accepts latencies of up to this many times
the announced stages."""

MAX_STAGES = MAX_REPLICAS = 4096
"""Most stages in a plan, and most replicas of one stage."""
MAX_ACTIONS = 1 << 22
"""Most actions in a plan (2 x stages x micro-batches; validation and the grid are linear in it, about
a second per million actions): a malformed plan of 10**9 micro-batches is refused, not looped over."""


@dataclass(frozen=True, slots=True)
class Action:
    """One unit of work: the forward, backward, input or weight gradient of ``microbatch`` on ``replica``
    of ``stage``."""

    stage: int
    replica: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"s{self.stage}r{self.replica}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Inverse of ``str``: ``Action.parse("s0r1F3") == Action(0, 1, Kind.FORWARD, 3)``."""
        match = _ACTION_RE.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise PlanError(f"invalid action string {shown(text)}; expected s<stage>r<replica><F|B|I|W><microbatch> with "
                            "numbers of at most 9 digits, e.g. s0r1F3")
        stage, replica, kind, microbatch = match.groups()
        return cls(int(stage), int(replica), Kind(kind), int(microbatch))


@dataclass(frozen=True, slots=True)
class Measurement:
    """Measured wall time of one action (seconds), as reported by the simulator or the runtime."""

    stage: int
    replica: int
    kind: Kind
    microbatch: int
    latency_s: float


@dataclass(frozen=True)
class Plan:
    """Placement and per-replica priority order of every action of one global step."""

    num_stages: int
    replicas: tuple[int, ...]
    """Replicas per stage, length num_stages."""
    num_microbatches: int
    orders: dict[tuple[int, int], tuple[Action, ...]]
    """(stage, replica) -> that replica's actions in priority order."""
    reorder: bool = False
    """True: an idle replica may run a later ready action before an earlier blocked one (osprey).
    False: each replica runs its actions strictly in order (static schedules)."""
    memory_limit: int | None = None
    """Most forward activations in flight per order (F started, B or W not finished); None = unbounded."""
    schedule: str = ""
    """Name of the scheduler that produced the plan (informational)."""
    stage_rank: tuple[int, ...] | None = None
    """Virtual stages: the rank holding each stage's chunk (length num_stages); ``orders`` is then keyed
    by (rank, replica). None: stage k is rank k, one chunk per rank."""
    activation_sizes: tuple[float, ...] | None = None
    """Per micro-batch: its activation in units of ``memory_limit`` (its length over the nominal one,
    when the step's sizes were known as the plan was made); the limit then bounds their sum per order.
    None: every micro-batch holds one unit (the limit counts activations)."""

    def activation(self, microbatch: int) -> float:
        """Units of ``memory_limit`` that ``microbatch``'s forward holds until its B or W completes."""
        return 1.0 if self.activation_sizes is None else self.activation_sizes[microbatch]

    @cached_property
    def split_backward(self) -> bool:
        """True when the plan's backward is split into I and W (``SPLIT_BACKWARD_KINDS``)."""
        return any(a.kind is Kind.INPUT or a.kind is Kind.WEIGHT for acts in self.orders.values() for a in acts)

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """The action set every micro-batch runs at every stage: F + B, or F + I + W."""
        return SPLIT_BACKWARD_KINDS if self.split_backward else FULL_BACKWARD_KINDS

    def slot(self, stage: int, replica: int) -> tuple[int, int]:
        """The ``orders`` key of the executor that runs ``replica`` of ``stage``: (rank, replica)."""
        return (self.stage_rank[stage], replica) if self.stage_rank is not None else (stage, replica)

    @cached_property
    def placement(self) -> dict[tuple[int, int], int]:
        """(stage, microbatch) -> replica holding that micro-batch's activations at that stage."""
        return {(a.stage, a.microbatch): a.replica
                for actions in self.orders.values() for a in actions if a.kind is Kind.FORWARD}

    def replica_of(self, stage: int, microbatch: int) -> int:
        return self.placement[(stage, microbatch)]

    @property
    def num_actions(self) -> int:
        return sum(len(v) for v in self.orders.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; ``Plan.from_dict(p.to_dict()) == p``."""
        out = {"num_stages": self.num_stages, "replicas": list(self.replicas),
               "num_microbatches": self.num_microbatches, "reorder": self.reorder,
               "memory_limit": self.memory_limit, "schedule": self.schedule,
               "orders": {f"{k},{r}": [str(a) for a in acts] for (k, r), acts in sorted(self.orders.items())}}
        if self.stage_rank is not None:
            out["stage_rank"] = list(self.stage_rank)
        if self.activation_sizes is not None:
            out["activation_sizes"] = list(self.activation_sizes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        """The plan ``to_dict`` wrote, validated (``validate``): PlanError naming the field otherwise."""
        if not isinstance(data, dict):
            raise PlanError(f"a plan must be a mapping as Plan.to_dict() writes it, got {type(data).__name__}")
        missing = [k for k in ("num_stages", "replicas", "num_microbatches", "orders") if k not in data]
        if missing:
            raise PlanError(f"plan lacks {missing}; give num_stages, replicas, num_microbatches and orders "
                            "(as Plan.to_dict() writes them)")
        stages, replicas, microbatches = data["num_stages"], data["replicas"], data["num_microbatches"]
        reorder, memory_limit, schedule = data.get("reorder", False), data.get("memory_limit"), data.get("schedule", "")
        if not isinstance(replicas, (list, tuple)):
            raise PlanError(f"plan replicas must be a list of integers >= 1 (one per stage), got {shown(replicas)}")
        if not isinstance(data["orders"], dict):
            raise PlanError(f"plan orders must map 'stage,replica' to a list of actions, got {shown(data['orders'])}")
        _check_sizes(stages, replicas, microbatches, memory_limit)
        if not isinstance(reorder, bool):
            raise PlanError(f"plan reorder must be true or false, got {shown(reorder)}")
        stage_rank = data.get("stage_rank")
        if stage_rank is not None:
            if not (isinstance(stage_rank, (list, tuple)) and all(_count(x, 0) for x in stage_rank)):
                raise PlanError(f"plan stage_rank must be a list of ranks (integers >= 0), one per stage, got "
                                f"{shown(stage_rank)}")
            stage_rank = tuple(stage_rank)
        sizes = data.get("activation_sizes")
        if sizes is not None:
            if not (isinstance(sizes, (list, tuple)) and len(sizes) == microbatches
                    and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < MAX_ACTIONS for x in sizes)):
                raise PlanError(f"plan activation_sizes must be a list of {microbatches} positive numbers (one per "
                                f"micro-batch, in units of memory_limit), got {shown(sizes)}")
            sizes = tuple(float(x) for x in sizes)
        if not isinstance(schedule, str) or len(schedule) > 200:
            raise PlanError(f"plan schedule must be a string of at most 200 characters (the scheduler's name), "
                            f"got {shown(schedule)}")
        if len(data["orders"]) > sum(replicas):
            raise PlanError(f"plan orders has {len(data['orders'])} entries for {sum(replicas)} replicas; give one "
                            "per (stage, replica)")
        orders = {}
        for key, acts in data["orders"].items():
            parts = [p.strip() for p in key.split(",")] if isinstance(key, str) else []
            if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts):
                raise PlanError(f"plan orders key {shown(key)} must be 'stage,replica' (two integers), e.g. '0,1'")
            if not (isinstance(acts, (list, tuple)) and len(acts) <= MAX_ACTIONS and all(isinstance(a, str) for a in acts)):
                raise PlanError(f"plan orders[{shown(key)}] must be a list of action strings such as 's0r1F3', got "
                                f"{shown(acts)}")
            orders[(int(parts[0]), int(parts[1]))] = tuple(Action.parse(a) for a in acts)
        plan = cls(num_stages=stages, replicas=tuple(replicas), num_microbatches=microbatches, orders=orders,
                   reorder=reorder, memory_limit=memory_limit, schedule=schedule, stage_rank=stage_rank,
                   activation_sizes=sizes)
        validate(plan)
        return plan


class DecisionRecord(Protocol):
    """What an adaptive schedule decided and why (``OspreyDecision``, ``AutoDecision``): a frozen record."""

    def to_dict(self) -> dict[str, Any]: ...


class PlanSource(Protocol):
    """What a runtime or the simulator plans a step with: a plan per step, its measurements back after it.
    Every schedule is one; so is the run's scheduler seen through its client
    (``pdml_ray.runtime.pipeline_plans.ScheduledPlans``)."""

    name: str
    microbatches: int
    """Micro-batches per step (how many sizes ``tell_sizes`` takes)."""

    def plan(self, step: int) -> Plan: ...

    def tell_sizes(self, step: int, sizes: Sequence[float]) -> None: ...

    def observe(self, measurements: Sequence[Measurement]) -> None: ...


class PipelineSchedule(Protocol):
    """What every schedule implements: a plan per step, measurements back after it, replayable state.

    Static schedules have ``last_decision = None`` and (but for critical-path's cost estimates) an
    empty state; the pipeline axis (``pdml_ray.priority.pipeline``) saves, restores and replays
    (``pdml_ray.replay``) a schedule through this whole protocol and probes for nothing.
    """

    name: str
    microbatches: int
    """Micro-batches per step (how many sizes ``tell_sizes`` takes)."""

    @property
    def last_decision(self) -> DecisionRecord | None:
        """The record behind the latest plan (None: a static schedule decides nothing)."""

    def plan(self, step: int) -> Plan: ...

    def tell_sizes(self, step: int, sizes: Sequence[float]) -> None:
        """Step ``step``'s micro-batch sizes, before it is planned (``pdml_ray.pipeline.sizes``); static
        schedules ignore them."""

    def observe(self, measurements: Sequence[Measurement]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state that, loaded into a fresh schedule, reproduces its next plan exactly."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def check_state(state: Mapping[str, Any], keys: Sequence[str], schedule: str) -> None:
    """Raise StateError unless ``state`` (from ``state_dict``) has every key ``schedule`` needs."""
    missing = [k for k in keys if k not in state]
    if missing:
        raise StateError(f"saved {schedule} schedule state lacks {missing} (has {sorted(state)}); it was saved by "
                         f"another schedule or version: load a state saved by {schedule}'s state_dict()")


# ---- the dependency rule -------------------------------------------------------------------------
StageKind = tuple[int, Kind]
"""(stage, kind) of one action of a micro-batch; the rule relates actions of the same micro-batch."""


def producers(stage: int, kind: Kind, num_stages: int) -> tuple[StageKind, ...]:
    """THE dependency rule: the (stage, kind) actions of the same micro-batch whose outputs
    ``kind`` at ``stage`` needs. Everything else derives from it through ``dependency_table``.

    F(k) needs F(k-1) (none at stage 0); B(k) needs B(k+1), or F(k) at the last stage (the loss);
    I(k) needs I(k+1), or F(k) at the last stage; W(k) needs I(k) (the output gradient it kept).
    """
    if kind is Kind.FORWARD:
        return ((stage - 1, Kind.FORWARD),) if stage > 0 else ()
    if kind is Kind.WEIGHT:
        return ((stage, Kind.INPUT),)
    if stage == num_stages - 1:
        return ((stage, Kind.FORWARD),)
    return ((stage + 1, kind),)


@dataclass(frozen=True, slots=True)
class DependencyTable:
    """``producers`` tabulated for one number of stages, with its inverse. Read-only; shared via the cache.

    ``producers[k][kind]`` and ``consumers[k][kind]`` are (stage, kind) tuples (consumers in stage,
    then kind order). A producer's output reaches a consumer on another stage ``transfer_s`` after it
    completes, one on its own stage at once; an action with several producers waits for all of them.
    """

    num_stages: int
    kinds: tuple[Kind, ...]
    """The action set tabulated: ``FULL_BACKWARD_KINDS`` or ``SPLIT_BACKWARD_KINDS``."""
    producers: tuple[dict[Kind, tuple[StageKind, ...]], ...]
    consumers: tuple[dict[Kind, tuple[StageKind, ...]], ...]
    sources: tuple[StageKind, ...]
    """Actions with no producers: ready for every micro-batch when the step starts (F at stage 0)."""
    sinks: tuple[StageKind, ...]
    """Actions nothing consumes: a micro-batch is finished when these are (B at stage 0; W at every stage)."""


@functools.lru_cache(maxsize=32)
def dependency_table(num_stages: int, split_backward: bool = False) -> DependencyTable:
    """The rule and its inverse for ``num_stages`` stages and one action set (F + B, or with
    ``split_backward`` F + I + W), derived once (O(stages x kinds))."""
    kinds = SPLIT_BACKWARD_KINDS if split_backward else FULL_BACKWARD_KINDS
    keys = [(k, kind) for k in range(num_stages) for kind in kinds]
    prods = {key: producers(*key, num_stages) for key in keys}
    for (k, kind), ps in prods.items():
        for p in ps:
            if p not in prods:
                raise PlanError(f"dependency rule: {kind.value} at stage {k} needs {p}, which is no action of a "
                                f"{num_stages}-stage pipeline of {[x.value for x in kinds]}; fix pdml_ray.pipeline.plan.producers")
    cons: dict[StageKind, list[StageKind]] = {key: [] for key in keys}
    for key in keys:  # in stage, then kind order: the consumers' order
        for p in prods[key]:
            cons[p].append(key)
    return DependencyTable(
        num_stages=num_stages, kinds=kinds,
        producers=tuple({kind: prods[(k, kind)] for kind in kinds} for k in range(num_stages)),
        consumers=tuple({kind: tuple(cons[(k, kind)]) for kind in kinds} for k in range(num_stages)),
        sources=tuple(key for key in keys if not prods[key]),
        sinks=tuple(key for key in keys if not cons[key]))


def _count(x: Any, low: int) -> bool:
    """An integer (not a bool) >= low."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _check_sizes(stages: Any, replicas: Any, microbatches: Any, memory_limit: Any) -> None:
    """The numbers of a plan: integers in their ranges, ``replicas`` one per stage, and at most
    ``MAX_ACTIONS`` actions; PlanError naming the first one that is not."""
    if not _count(stages, 1) or stages > MAX_STAGES:
        raise PlanError(f"plan num_stages must be an integer in [1, {MAX_STAGES}], got {shown(stages)}")
    if not (isinstance(replicas, (list, tuple)) and all(_count(r, 1) and r <= MAX_REPLICAS for r in replicas)):
        raise PlanError(f"plan replicas must be a list of integers in [1, {MAX_REPLICAS}] (one per stage), got "
                        f"{shown(replicas)}")
    if len(replicas) != stages:
        raise PlanError(f"plan has num_stages={stages} but {len(replicas)} replica counts ({shown(replicas)}); "
                        "give one replica count per stage")
    if not _count(microbatches, 1) or 2 * stages * microbatches > MAX_ACTIONS:
        raise PlanError(f"plan num_microbatches must be an integer >= 1 with 2 x stages x micro-batches at most "
                        f"{MAX_ACTIONS:,} actions, got {shown(microbatches)} for {stages} stages")
    if not (memory_limit is None or (_count(memory_limit, 1) and memory_limit <= MAX_ACTIONS)):
        raise PlanError(f"plan memory_limit must be an integer in [1, {MAX_ACTIONS}] (activations) or None, got "
                        f"{shown(memory_limit)}")


def _check_shape(plan: Plan) -> None:
    _check_sizes(plan.num_stages, plan.replicas, plan.num_microbatches, plan.memory_limit)
    if not isinstance(plan.orders, dict):
        raise PlanError(f"plan orders must map (stage, replica) to a tuple of actions, got {shown(plan.orders)}")
    for key, actions in plan.orders.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(_count(x, 0) for x in key)):
            raise PlanError(f"plan orders key {shown(key)} must be (stage, replica), two integers >= 0")
        if not (isinstance(actions, (tuple, list)) and all(isinstance(a, Action) for a in actions)):
            raise PlanError(f"plan orders[{key}] must be a tuple of Actions, got {shown(actions)}")
    if plan.stage_rank is None:
        extra = sorted(key for key in plan.orders
                       if not (key[0] < plan.num_stages and key[1] < plan.replicas[key[0]]))
        slots = sum(plan.replicas)
    else:
        ranks = plan.stage_rank
        if not (isinstance(ranks, tuple) and len(ranks) == plan.num_stages
                and all(_count(x, 0) and x < plan.num_stages for x in ranks)):
            raise PlanError(f"plan stage_rank must be a tuple of {plan.num_stages} ranks in [0, {plan.num_stages}) "
                            f"(the rank holding each stage's chunk), got {shown(ranks)}")
        if set(ranks) != set(range(max(ranks) + 1)):
            raise PlanError(f"plan stage_rank {shown(ranks)} leaves ranks without a stage; number the ranks "
                            f"0..{len(set(ranks)) - 1}")
        expected_slots = {plan.slot(k, r) for k in range(plan.num_stages) for r in range(plan.replicas[k])}
        extra = sorted(set(plan.orders) - expected_slots)
        slots = len(expected_slots)
    if extra or len(plan.orders) != slots:
        if slots <= 1 << 16:
            expected = {plan.slot(k, r) for k in range(plan.num_stages) for r in range(plan.replicas[k])}
            missing: object = sorted(expected - set(plan.orders))
        else:
            missing = f"{slots - len(plan.orders) + len(extra)} of {slots}"
        raise PlanError(f"plan orders must have one entry per (stage, replica), or (rank, replica) with stage_rank: missing {shown(missing, 150)}, "
                        f"unexpected {shown(extra, 150)}")
    if plan.num_actions > MAX_ACTIONS:
        raise PlanError(f"plan has {plan.num_actions:,} actions, more than {MAX_ACTIONS:,}")


def _check_coverage(plan: Plan) -> None:
    """Every action of every micro-batch exactly once per stage, all on the replica that ran its F."""
    seen: dict[tuple[int, Kind, int], int] = {}
    kinds = plan.kinds
    for (k, r), actions in plan.orders.items():
        for a in actions:
            if a.stage >= plan.num_stages or plan.slot(a.stage, a.replica) != (k, r):
                raise PlanError(f"action {a} is listed in the order of {_where(plan, (k, r))}")
            if a.kind not in kinds:
                raise PlanError(f"action {a}: a plan runs either F + B or F + I + W (split backward), not both; "
                                "give every micro-batch the same backward kinds")
            if not 0 <= a.microbatch < plan.num_microbatches:
                raise PlanError(f"action {a}: micro-batch {a.microbatch} out of range 0..{plan.num_microbatches - 1}")
            key = (a.stage, a.kind, a.microbatch)
            if key in seen:
                raise PlanError(f"duplicate action: {a.kind.value}{a.microbatch} of stage {a.stage} runs twice "
                                f"(replicas {seen[key]} and {r})")
            seen[key] = r
    for k in range(plan.num_stages):
        for m in range(plan.num_microbatches):
            for kind in kinds:
                if (k, kind, m) not in seen:
                    raise PlanError(f"missing action: {kind.value}{m} of stage {k} is in no replica's order")
            for kind in kinds:
                if seen[(k, kind, m)] != seen[(k, Kind.FORWARD, m)]:
                    raise PlanError(f"{kind.value}{m} of stage {k} is on replica {seen[(k, kind, m)]} but its F ran on "
                                    f"replica {seen[(k, Kind.FORWARD, m)]}; every action of a micro-batch at a stage "
                                    "must run where its activations are")


def _where(plan: Plan, key: tuple[int, int]) -> str:
    """An ``orders`` key in words: stage k replica r, or rank k replica r with virtual stages."""
    return f"{'stage' if plan.stage_rank is None else 'rank'} {key[0]} replica {key[1]}"


def _check_memory(plan: Plan) -> None:
    if plan.memory_limit is None:
        return
    sizes = plan.activation_sizes
    if sizes is not None and (len(sizes) != plan.num_microbatches or min(sizes, default=1.0) <= 0):
        raise PlanError(f"plan activation_sizes needs {plan.num_microbatches} positive entries (one per micro-batch), "
                        f"got {shown(sizes)}")
    for (k, r), actions in sorted(plan.orders.items()):
        held = 0.0  # units of memory_limit
        for i, a in enumerate(actions):
            size = plan.activation(a.microbatch)
            held += size if a.kind is Kind.FORWARD else -size if a.kind in FREES_ACTIVATION else 0.0
            if held > plan.memory_limit + 1e-9:
                raise PlanError(f"memory limit exceeded: {_where(plan, (k, r))} holds {held:g} activations at "
                                f"position {i} ({a}) but memory_limit={plan.memory_limit}")


def unit_time_grid(plan: Plan) -> list[dict[tuple[int, int], Action]]:
    """Run the plan strictly in order with unit-time actions; one dict (replica -> action) per time step.

    Every replica whose next action has its dependencies done at the start of a step runs it in that
    step. Raises PlanError naming the stuck replicas if the in-order run cannot finish (deadlock).
    In-order execution is confluent, so a plan that finishes here finishes under any timing.
    """
    prods = dependency_table(plan.num_stages, plan.split_backward).producers
    done: set[tuple[int, Kind, int]] = set()  # (stage, kind, microbatch) completed
    pos = {key: 0 for key in plan.orders}
    remaining = plan.num_actions
    grid: list[dict[tuple[int, int], Action]] = []
    while remaining:
        row = {}
        for key, actions in plan.orders.items():
            if pos[key] < len(actions):
                a = actions[pos[key]]
                if all((k, kind, a.microbatch) in done for k, kind in prods[a.stage][a.kind]):
                    row[key] = a
        if not row:
            stuck = [f"{_where(plan, (k, r))} waits at {plan.orders[(k, r)][pos[(k, r)]]}"
                     for k, r in sorted(plan.orders) if pos[(k, r)] < len(plan.orders[(k, r)])]
            more = f" and {len(stuck) - 4} more" if len(stuck) > 4 else ""
            raise PlanError(f"deadlock: the in-order run stops after {len(grid)} steps; {', '.join(stuck[:4])}{more}")
        for key, a in row.items():
            done.add((a.stage, a.kind, a.microbatch))
            pos[key] += 1
        remaining -= len(row)
        grid.append(row)
    return grid


def validate(plan: Plan) -> None:
    """Raise PlanError naming the first defect: shape, coverage, placement, memory, or deadlock."""
    _check_shape(plan)
    _check_coverage(plan)
    _check_memory(plan)
    unit_time_grid(plan)


def format(plan: Plan) -> str:  # noqa: A001 - mirrors torch's _format_pipeline_order
    """Time-step (row) x replica (column) grid of the in-order run with unit-time actions."""
    grid = unit_time_grid(plan)
    cols = sorted(plan.orders)
    labels = [f"s{k}r{r}" if plan.stage_rank is None else f"rank{k}r{r}" for k, r in cols]
    width = max([len(lbl) for lbl in labels] + [len(str(a)) for row in grid for a in row.values()])
    step_w = len(str(len(grid) - 1))
    lines = [" " * (step_w + 7) + " ".join(lbl.ljust(width) for lbl in labels)]
    for t, row in enumerate(grid):
        cells = [str(row[c]) if c in row else "." for c in cols]
        lines.append(f"step {t:>{step_w}}: " + " ".join(c.ljust(width) for c in cells).rstrip())
    title = f"{plan.schedule or 'plan'}: {plan.num_stages} stages x replicas {list(plan.replicas)}, " \
            f"{plan.num_microbatches} micro-batches, reorder={plan.reorder}, memory_limit={plan.memory_limit}"
    return title + "\n" + "\n".join(lines) + "\n"
