"""Plan format, validation (each defect named), the grid, and the shared dispatch rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.plan import Action, Kind, Plan, format, unit_time_grid, validate

F, B = Kind.FORWARD, Kind.BACKWARD


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
