"""Plan format, validation (each defect named), the grid, the shared dispatch rule, and the one dependency rule."""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.errors import PlanError
from pdml_ray.pipeline import plan as plan_module
from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.listsched import in_order_makespan, list_schedule, single_pipeline_schedule
from pdml_ray.pipeline.plan import Action, Kind, Plan, dependency_table, format, unit_time_grid, validate
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.INPUT, Kind.WEIGHT


def gpipe_plan(stages: int, microbatches: int, memory_limit: int | None = None) -> Plan:
    orders = {(k, 0): tuple([Action(k, 0, F, m) for m in range(microbatches)]
                            + [Action(k, 0, B, m) for m in range(microbatches)]) for k in range(stages)}
    return Plan(stages, (1,) * stages, microbatches, orders, memory_limit=memory_limit)


@given(st.integers(0, 999), st.integers(0, 99), st.sampled_from(list(Kind)), st.integers(0, 9999))
def test_action_string_round_trip(stage: int, replica: int, kind: Kind, microbatch: int) -> None:
    a = Action(stage, replica, kind, microbatch)
    assert Action.parse(str(a)) == a


def test_action_string_form() -> None:
    assert str(Action(0, 1, F, 3)) == "s0r1F3"
    assert Action.parse(" s12r0B7 ") == Action(12, 0, B, 7)
    with pytest.raises(PlanError, match="expected s<stage>r<replica>"):
        Action.parse("0F3")


def test_plan_dict_round_trip() -> None:
    plan = gpipe_plan(3, 4, memory_limit=4)
    assert Plan.from_dict(plan.to_dict()) == plan


def test_valid_plan_passes_and_grid_has_textbook_length() -> None:
    plan = gpipe_plan(3, 4)
    validate(plan)
    # GPipe with unit-time actions: (M + S - 1) forward steps and as many backward steps.
    assert len(unit_time_grid(plan)) == 2 * (4 + 3 - 1)
    text = format(plan)
    assert "s0r0" in text and "s2r0F3" in text
    assert text.count("\nstep") == 12


def _with_order(plan: Plan, key: tuple[int, int], actions: list[Action]) -> Plan:
    orders = dict(plan.orders)
    orders[key] = tuple(actions)
    return Plan(plan.num_stages, plan.replicas, plan.num_microbatches, orders, plan.reorder, plan.memory_limit)


def test_validate_names_missing_action() -> None:
    plan = gpipe_plan(2, 3)
    broken = _with_order(plan, (1, 0), list(plan.orders[(1, 0)])[:-1])
    with pytest.raises(PlanError, match="missing action: B2 of stage 1"):
        validate(broken)


def test_validate_names_duplicate_action() -> None:
    plan = gpipe_plan(2, 3)
    broken = _with_order(plan, (0, 0), list(plan.orders[(0, 0)]) + [Action(0, 0, F, 1)])
    with pytest.raises(PlanError, match="duplicate action: F1 of stage 0"):
        validate(broken)


def test_validate_names_backward_on_wrong_replica() -> None:
    # Stage 0 has two replicas; F0 runs on replica 0 but its B on replica 1.
    orders = {(0, 0): (Action(0, 0, F, 0),), (0, 1): (Action(0, 1, B, 0),),
              (1, 0): (Action(1, 0, F, 0), Action(1, 0, B, 0))}
    with pytest.raises(PlanError, match="B0 of stage 0 is on replica 1 but its F ran on replica 0"):
        validate(Plan(2, (2, 1), 1, orders))


def test_validate_names_misfiled_action() -> None:
    plan = gpipe_plan(2, 1)
    broken = _with_order(plan, (0, 0), [Action(1, 0, F, 0), Action(0, 0, B, 0)])
    with pytest.raises(PlanError, match="listed in the order of stage 0 replica 0"):
        validate(broken)


def test_validate_names_deadlock() -> None:
    # Stage 0 wants B0 before F1, stage 1 wants F1 before B0: in order, neither can move.
    orders = {(0, 0): (Action(0, 0, F, 0), Action(0, 0, B, 0), Action(0, 0, F, 1), Action(0, 0, B, 1)),
              (1, 0): (Action(1, 0, F, 1), Action(1, 0, F, 0), Action(1, 0, B, 0), Action(1, 0, B, 1))}
    with pytest.raises(PlanError, match="deadlock.*stage 1 replica 0 waits at s1r0F1"):
        validate(Plan(2, (1, 1), 2, orders))


def test_validate_names_memory_excess() -> None:
    with pytest.raises(PlanError, match="memory limit exceeded: stage 0 replica 0 holds 3"):
        validate(gpipe_plan(2, 3, memory_limit=2))


def test_validate_names_shape_defects() -> None:
    plan = gpipe_plan(2, 2)
    orders = dict(plan.orders)
    del orders[(1, 0)]
    with pytest.raises(PlanError, match=r"missing \[\(1, 0\)\]"):
        validate(Plan(2, (1, 1), 2, orders))
    with pytest.raises(PlanError, match="one replica count per stage"):
        validate(Plan(2, (1,), 2, plan.orders))


def test_dispatcher_in_order_waits_for_dependencies() -> None:
    plan = gpipe_plan(2, 2)
    d = Dispatcher(plan)
    assert d.next_action(1, 0) is None  # F0 of stage 1 needs F0 of stage 0
    a = d.next_action(0, 0)
    assert a == Action(0, 0, F, 0)
    d.start(a)
    assert d.next_action(1, 0) is None  # started, not complete
    d.complete(a, at=1.0)
    assert d.next_action(1, 0) == Action(1, 0, F, 0)
    with pytest.raises(PlanError, match="not pending"):
        d.start(a)


def test_dispatcher_transfer_time_delays_other_stages() -> None:
    d = Dispatcher(gpipe_plan(2, 1), transfer_s=0.5)
    a = d.next_action(0, 0, now=0.0)
    d.start(a)
    d.complete(a, at=1.0)
    assert d.next_action(1, 0, now=1.4) is None
    assert d.next_action(1, 0, now=1.5) == Action(1, 0, F, 0)


def test_dispatcher_reorder_overtakes_only_same_kind_and_respects_memory() -> None:
    # One stage, order F0 F1 B0 B1 (last stage: B needs only its own F).
    orders = {(0, 0): (Action(0, 0, F, 0), Action(0, 0, F, 1), Action(0, 0, B, 0), Action(0, 0, B, 1))}
    plan = Plan(1, (1,), 2, orders, reorder=True, memory_limit=2)
    d = Dispatcher(plan)
    f0 = d.next_action(0, 0)
    d.start(f0)
    f1 = d.next_action(0, 0)
    assert f1 == Action(0, 0, F, 1)
    d.start(f1)
    d.complete(f1, at=1.0)
    # B0 is blocked (F0 still running) but B1 is ready: it may overtake B0 (same kind).
    assert d.next_action(0, 0) == Action(0, 0, B, 1)
    # A forward never overtakes a pending backward, even with memory to spare ...
    eager = Plan(1, (1,), 2, {(0, 0): (Action(0, 0, F, 0), Action(0, 0, B, 0), Action(0, 0, F, 1),
                                        Action(0, 0, B, 1))}, reorder=True, memory_limit=2)
    d3 = Dispatcher(eager)
    d3.start(d3.next_action(0, 0))
    assert d3.next_action(0, 0) is None
    # ... and the memory limit holds.
    plan2 = Plan(1, (1,), 2, {(0, 0): (Action(0, 0, F, 0), Action(0, 0, B, 0), Action(0, 0, F, 1),
                                        Action(0, 0, B, 1))}, reorder=True, memory_limit=1)
    d2 = Dispatcher(plan2)
    a = d2.next_action(0, 0)
    d2.start(a)
    assert d2.next_action(0, 0) is None  # B0 waits for F0; F1 may not jump it
    d2.complete(a, at=1.0)
    b = d2.next_action(0, 0)
    assert b == Action(0, 0, B, 0)
    d2.start(b)
    assert d2.in_flight(0, 0) == 1
    d2.complete(b, at=2.0)
    assert d2.in_flight(0, 0) == 0
    assert d2.next_action(0, 0) == Action(0, 0, F, 1)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 6))
def test_memory_limit_rejects_exactly_when_gpipe_exceeds_it(stages: int, microbatches: int, limit: int) -> None:
    plan = gpipe_plan(stages, microbatches, memory_limit=limit)
    if microbatches <= limit:
        validate(plan)
    else:
        with pytest.raises(PlanError, match="memory limit exceeded"):
            validate(plan)


# ---- the dependency rule: written once (plan.producers), read by everyone ---------------------------

def brute_force_consumers(num_stages: int, kinds: Sequence[Kind]) -> dict[tuple[int, Kind], list[tuple[int, Kind]]]:
    """Inverse of ``producers`` by search over every (stage, kind) of an action set, in stage then kind order."""
    keys = [(k, kind) for k in range(num_stages) for kind in kinds]
    return {p: [c for c in keys if p in plan_module.producers(*c, num_stages)] for p in keys}


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("num_stages", [1, 2, 3, 7])
def test_consumers_are_the_inverse_of_the_rule(num_stages: int, split: bool) -> None:
    table = dependency_table(num_stages, split)
    assert table.kinds == ((F, I, W) if split else (F, B))
    inverse = brute_force_consumers(num_stages, table.kinds)
    for k in range(num_stages):
        for kind in table.kinds:
            assert table.producers[k][kind] == plan_module.producers(k, kind, num_stages)
            assert list(table.consumers[k][kind]) == inverse[(k, kind)]
    assert table.sources == ((0, F),)
    # Full backward ends at B of stage 0; split backward at every stage's W, which nothing waits for.
    assert table.sinks == (tuple((k, W) for k in range(num_stages)) if split else ((0, B),))
    assert dependency_table(num_stages, split) is table  # derived once per number of stages and action set


def test_split_backward_rule() -> None:
    table = dependency_table(3, True)
    assert table.producers[2][I] == ((2, F),) and table.producers[1][I] == ((2, I),)
    assert table.producers[1][W] == ((1, I),)
    assert table.consumers[1][I] == ((0, I), (1, W)) and table.consumers[2][F] == ((2, I),)


def split_plan(order_of_stage1: Sequence[str]) -> Plan:
    """Two stages, two micro-batches, split backward; stage 0 runs each micro-batch through, stage 1 as given."""
    orders = {(0, 0): tuple(Action.parse(a) for a in ("s0r0F0", "s0r0I0", "s0r0W0", "s0r0F1", "s0r0I1", "s0r0W1")),
              (1, 0): tuple(Action.parse(a) for a in order_of_stage1)}
    return Plan(num_stages=2, replicas=(1, 1), num_microbatches=2, orders=orders)


def test_validate_refuses_a_w_before_its_i() -> None:
    good = split_plan(["s1r0F0", "s1r0I0", "s1r0F1", "s1r0I1", "s1r0W0", "s1r0W1"])
    validate(good)
    assert good.split_backward and good.kinds == (F, I, W)
    assert len(unit_time_grid(good)) == 10  # F0 F0 I0 I0 W0 F1 F1 I1 I1+W0 W1+W1, by hand
    with pytest.raises(PlanError, match="deadlock.*s1r0W0"):
        validate(split_plan(["s1r0F0", "s1r0W0", "s1r0I0", "s1r0F1", "s1r0I1", "s1r0W1"]))
    with pytest.raises(PlanError, match="missing action: W1 of stage 1"):
        validate(split_plan(["s1r0F0", "s1r0I0", "s1r0F1", "s1r0I1", "s1r0W0"]))
    with pytest.raises(PlanError, match="either F \\+ B or F \\+ I \\+ W"):
        validate(split_plan(["s1r0F0", "s1r0B0", "s1r0F1", "s1r0I1", "s1r0W1", "s1r0W0"]))


def test_split_backward_frees_activations_after_w() -> None:
    # Stage 1 runs both I before either W: it still holds two activations until the first W.
    plan = split_plan(["s1r0F0", "s1r0I0", "s1r0F1", "s1r0I1", "s1r0W0", "s1r0W1"])
    validate(replace(plan, memory_limit=2))
    with pytest.raises(PlanError, match="memory limit exceeded: stage 1 replica 0 holds 2"):
        validate(replace(plan, memory_limit=1))


def test_split_and_virtual_actions_round_trip() -> None:
    assert Action.parse("s3r1W7") == Action(3, 1, W, 7) and str(Action(0, 2, I, 5)) == "s0r2I5"
    plan = v_plan()
    assert Plan.from_dict(plan.to_dict()) == plan and plan.to_dict()["stage_rank"] == [0, 1, 1, 0]


def v_plan() -> Plan:
    """Four stages as a V on two ranks (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2), one
    micro-batch, split backward."""
    a = Action.parse
    orders = {(0, 0): (a("s0r0F0"), a("s3r0F0"), a("s3r0I0"), a("s0r0I0"), a("s3r0W0"), a("s0r0W0")),
              (1, 0): (a("s1r0F0"), a("s2r0F0"), a("s2r0I0"), a("s1r0I0"), a("s2r0W0"), a("s1r0W0"))}
    return Plan(num_stages=4, replicas=(1,) * 4, num_microbatches=1, orders=orders, stage_rank=(0, 1, 1, 0))


def test_virtual_stages_validate_per_rank() -> None:
    plan = v_plan()
    validate(plan)
    assert plan.slot(3, 0) == (0, 0) and plan.slot(2, 0) == (1, 0)
    assert "rank0r0" in format(plan)
    moved = dict(plan.orders)
    moved[(0, 0)], moved[(1, 0)] = plan.orders[(0, 0)][:-1], plan.orders[(1, 0)] + plan.orders[(0, 0)][-1:]
    with pytest.raises(PlanError, match="s0r0W0 is listed in the order of rank 1 replica 0"):
        validate(replace(plan, orders=moved))
    with pytest.raises(PlanError, match="stage_rank must be a tuple of 4 ranks"):
        validate(replace(plan, stage_rank=(0, 1, 1)))


def test_the_rule_is_the_textbook_chain() -> None:
    table = dependency_table(3)
    assert table.producers[1][F] == ((0, F),) and table.producers[2][B] == ((2, F),)
    assert table.producers[0][B] == ((1, B),)
    assert table.consumers[2][F] == ((2, B),) and table.consumers[1][B] == ((0, B),) and table.consumers[0][B] == ()


REAL_RULE = plan_module.producers


@contextmanager
def rule(producers: Callable[[int, Kind, int], tuple[tuple[int, Kind], ...]]) -> Iterator[None]:
    """Swap the one dependency rule for a hypothetical one (what adding a new action kind would do)."""
    original = plan_module.producers
    plan_module.producers = producers
    dependency_table.cache_clear()
    try:
        yield
    finally:
        plan_module.producers = original
        dependency_table.cache_clear()


def local_loss(stage: int, kind: Kind, num_stages: int) -> tuple[tuple[int, Kind], ...]:
    """Hypothetical: every stage has its own loss, so B(k) needs only F(k); no backward chain."""
    if kind is F:
        return ((stage - 1, F),) if stage > 0 else ()
    return ((stage, F),)


def joined(stage: int, kind: Kind, num_stages: int) -> tuple[tuple[int, Kind], ...]:
    """Hypothetical, equivalent to the real rule: B(k) also names F(k), first, as a producer (a join
    whose binding input comes second)."""
    if kind is B and stage < num_stages - 1:
        return ((stage, F), (stage + 1, B))
    return REAL_RULE(stage, kind, num_stages)


def scheduled_plan(seed: int) -> tuple[Plan, float, ClusterProfile, list[list[tuple[float, float]]], list[int]]:
    """A random plan (list scheduling on a noiseless simulated cluster's exact costs, random placement
    and activation caps), its predicted makespan (s), the cluster, the costs and the caps."""
    rng = random.Random(seed)
    S = rng.randint(1, 4)
    reps = tuple(rng.randint(1, 3) if rng.random() < 0.7 else 1 for _ in range(S))
    M = rng.randint(1, 9)
    profile = ClusterProfile.build(S, reps, forward_s=rng.choice([1.0, 1.5]), backward_s=rng.choice([2.0, 2.5]),
                                   speeds=tuple(tuple(rng.uniform(0.5, 1.5) for _ in range(r)) for r in reps),
                                   transfer_s=rng.choice([0.0, 0.3]))
    costs = [[(profile.forward_s[k] / s, profile.backward_s[k] / s) for s in profile.speeds[k]] for k in range(S)]
    placement = {(k, m): rng.randrange(reps[k]) for k in range(S) for m in range(M)}
    caps = [rng.randint(1, S + 1) for _ in range(S)]
    orders, predicted = list_schedule(S, reps, M, costs, [(1, 0)] * S, caps, placement=placement,
                                      transfer_s=profile.transfer_s)
    return Plan(S, reps, M, orders, memory_limit=max(caps)), predicted, profile, costs, caps


def check_everyone_agrees(seed: int) -> tuple[list[tuple[tuple[int, int], list[str]]], float]:
    """Validation, the Dispatcher (and its ``dependants``), the list scheduler, its FIFO specialisation,
    the in-order run and the simulator all follow the current rule: they agree on a random plan.
    Returns the plan's orders and makespan (s)."""
    plan, predicted, profile, costs, caps = scheduled_plan(seed)
    validate(plan)
    actions = [a for acts in plan.orders.values() for a in acts]
    d = Dispatcher(plan)
    for a in actions:  # dependants: the brute-force inverse of the rule on this plan's actions
        wanted = sorted(str(b) for b in actions if b.microbatch == a.microbatch
                        and (a.stage, a.kind) in plan_module.producers(b.stage, b.kind, plan.num_stages))
        assert sorted(str(b) for b in d.dependants(a)) == wanted
    in_order = in_order_makespan(plan.orders, plan.num_stages, costs, profile.transfer_s)
    simulated = PipelineSimulator(profile).run_step(plan).makespan_s
    assert predicted == pytest.approx(in_order, rel=1e-12) and simulated == pytest.approx(in_order, rel=1e-12)
    if set(plan.replicas) == {1}:
        raw, done = single_pipeline_schedule([c[0][0] for c in costs], [c[0][1] for c in costs],
                                             plan.num_microbatches, caps, profile.transfer_s)
        assert raw == [[(a.kind, a.microbatch) for a in plan.orders[(k, 0)]] for k in range(plan.num_stages)]
        assert max(done) == pytest.approx(predicted, rel=1e-12)
    return sorted((key, [str(a) for a in acts]) for key, acts in plan.orders.items()), in_order


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_dispatcher_list_scheduler_and_simulator_agree_on_random_plans(seed: int) -> None:
    check_everyone_agrees(seed)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_a_new_rule_is_one_edit_and_everyone_follows_it(seed: int) -> None:
    real = check_everyone_agrees(seed)
    with rule(joined):  # a redundant second producer: same plans and times, through the join code paths
        assert dependency_table(3).producers[0][B] == ((0, F), (1, B))
        assert check_everyone_agrees(seed) == real
    with rule(local_loss):  # a different chain: everyone still agrees, on plans of the new rule
        table = dependency_table(3)
        assert table.consumers[0][F] == ((0, B), (1, F)) and table.sinks == ((0, B), (1, B), (2, B))
        check_everyone_agrees(seed)


def test_a_rule_naming_a_missing_action_is_refused() -> None:
    def broken(stage: int, kind: Kind, num_stages: int) -> tuple[tuple[int, Kind], ...]:
        return ((stage + 1, F),)

    with rule(broken), pytest.raises(PlanError, match=r"fix pdml_ray.pipeline.plan.producers"):
        dependency_table(2)
