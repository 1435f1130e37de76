"""Lost stage replicas, pure logic: mid-step rerouting (``Dispatcher.drop_replica``) and plans on survivors
(``exclude_replicas``). The Ray side is tests/ray/test_pipeline_faults_ray.py."""

from __future__ import annotations

import pytest

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.faults import exclude_replicas, pick_survivor
from pdml_ray.pipeline.plan import Action, Kind, Plan, unit_time_grid, validate
from pdml_ray.pipeline.registry import PROJECT_SCHEDULES, make_schedule

S, R, M = 3, 2, 6


def _plan(name: str, replicas: int | tuple[int, ...] = R, microbatches: int = M) -> Plan:
    return make_schedule(name, stages=S, replicas=replicas, microbatches=microbatches).plan(0)


def _run(plan: Plan, kills: dict[int, tuple[int, int]]) -> tuple[dict[tuple[int, int], int], list, list[Action]]:
    """Unit-time run of ``plan`` through the Dispatcher, killing replica kills[t] at tick t (its running
    action is lost). Returns (stage, micro-batch) -> replica holding its gradient, the reroutes, all
    completed actions."""
    d = Dispatcher(plan)
    owner: dict[tuple[int, int], int] = {}
    reroutes, completed, dead = [], [], set()
    t = 0
    while not d.done():
        running = {}
        for key in sorted(plan.orders):
            if key not in dead and (a := d.next_action(*key)) is not None:
                d.start(a)
                running[key] = a
        if t in kills:
            victim = kills[t]
            dead.add(victim)
            running.pop(victim, None)
            reroutes.append(d.drop_replica(*victim, step=7))
        for a in running.values():
            d.complete(a, at=t)
            completed.append(a)
            if a.kind is Kind.BACKWARD:
                owner[(a.stage, a.microbatch)] = a.replica
        t += 1
        assert t < 500, "stalled"
    return owner, reroutes, completed


@pytest.mark.parametrize("schedule", sorted(PROJECT_SCHEDULES))
@pytest.mark.parametrize("when", [0.0, 0.3, 0.6, 0.9])
def test_a_replica_dying_mid_step_loses_no_micro_batch(schedule, when):
    plan = _plan(schedule)
    victim = (1, 1)
    tick = int(when * len(unit_time_grid(plan)))  # the in-order run's length in unit-time steps
    owner, (reroute,), completed = _run(plan, {tick: victim})
    # Every micro-batch's gradient at every stage is on a live replica, once.
    assert sorted(owner) == [(k, m) for k in range(S) for m in range(M)]
    assert all((k, r) != victim for (k, _), r in owner.items())
    # Everything the plan placed on the victim moved to its survivor, which re-ran forward and backward.
    lost = sorted(m for (k, m), r in plan.placement.items() if (k, r) == victim)
    assert reroute.stage == 1 and reroute.replica == 1 and reroute.step == 7
    assert reroute.moved == tuple((m, 0) for m in lost)
    done_on_victim = {(a.kind, a.microbatch) for a in completed if (a.stage, a.replica) == victim}
    assert set(reroute.replayed_forwards) == {m for kind, m in done_on_victim if kind is Kind.FORWARD}
    assert set(reroute.redone_backwards) == {m for kind, m in done_on_victim if kind is Kind.BACKWARD}
    on_survivor = [(a.kind, a.microbatch) for a in completed if (a.stage, a.replica) == (1, 0)]
    for m in lost:
        assert on_survivor.count((Kind.FORWARD, m)) == on_survivor.count((Kind.BACKWARD, m)) == 1
    # Other stages ran each action exactly once.
    others = [(a.stage, a.kind, a.microbatch) for a in completed if a.stage != 1]
    assert sorted(others) == sorted((k, kind, m) for k in (0, 2) for kind in (Kind.FORWARD, Kind.BACKWARD) for m in range(M))


def test_a_backward_done_on_the_dead_replica_is_redone():
    plan = _plan("gpipe")
    late = len(unit_time_grid(plan)) - 2  # stage 2 replica 0 has finished all its backwards by then
    owner, (reroute,), _ = _run(plan, {late: (2, 0)})
    assert reroute.redone_backwards == reroute.replayed_forwards == tuple(m for m, _ in reroute.moved)
    assert len(reroute.moved) == M // 2 and all(r == 1 for _, r in reroute.moved)
    assert all(owner[(2, m)] == 1 for m in range(M))


def test_two_deaths_in_one_step_and_the_last_replica():
    plan = _plan("1f1b", replicas=3)
    owner, reroutes, _ = _run(plan, {2: (0, 0), 6: (0, 2)})
    assert [(x.stage, x.replica) for x in reroutes] == [(0, 0), (0, 2)]
    assert all(owner[(0, m)] == 1 for m in range(M))
    d = Dispatcher(_plan("1f1b"))
    d.drop_replica(0, 0)
    with pytest.raises(PlanError, match="stage 0 has no live replica left"):
        d.drop_replica(0, 1)
    with pytest.raises(PlanError, match="not a live replica"):
        d.drop_replica(0, 0)


def test_survivors_are_picked_least_loaded_then_lowest():
    assert pick_survivor({0: 3, 1: 1, 2: 1}) == 1
    with pytest.raises(PlanError):
        pick_survivor({})


@pytest.mark.parametrize("schedule", sorted(PROJECT_SCHEDULES))
def test_exclude_replicas_gives_a_valid_plan_on_the_survivors(schedule):
    plan = _plan(schedule, replicas=(2, 3, 2), microbatches=8)
    replan = exclude_replicas(plan, [[0, 1], [0, 2], [1]])
    new = replan.plan
    validate(new)
    assert new.replicas == (2, 2, 1) and replan.alive == ((0, 1), (0, 2), (1,))
    assert new.num_microbatches == 8 and new.schedule == plan.schedule and new.reorder == plan.reorder
    lost = {(k, m, r) for (k, m), r in plan.placement.items() if (k, r) in {(1, 1), (2, 0)}}
    assert {(k, m, r) for k, m, r, _ in replan.moved} == lost
    for k, m, _, to in replan.moved:  # the move is what the new plan does (ranks map back through alive)
        assert replan.alive[k][new.replica_of(k, m)] == to
    kept = {(k, m): r for (k, m), r in plan.placement.items() if (k, r) not in {(1, 1), (2, 0)}}
    assert all(replan.alive[k][new.replica_of(k, m)] == r for (k, m), r in kept.items())
    assert replan.to_dict()["replicas"] == [2, 2, 1]


def test_exclude_replicas_raises_the_memory_limit_only_where_needed():
    plan = make_schedule("gpipe", stages=2, replicas=2, microbatches=8).plan(0)
    plan = Plan(plan.num_stages, plan.replicas, plan.num_microbatches, plan.orders, memory_limit=4, schedule="gpipe")
    validate(plan)  # gpipe holds all 4 micro-batches of a replica
    replan = exclude_replicas(plan, [[0, 1], [1]])
    assert replan.memory_limit == 8 and replan.plan.memory_limit == 8  # one replica now holds all 8
    same = exclude_replicas(plan, [[0, 1], [0, 1]])
    assert same.plan is plan and same.moved == ()


def test_exclude_replicas_refuses_a_stage_without_replicas():
    plan = _plan("1f1b")
    with pytest.raises(PlanError, match="stage 1 has no surviving replica"):
        exclude_replicas(plan, [[0, 1], [], [0]])
    with pytest.raises(PlanError, match="not in 0..1"):
        exclude_replicas(plan, [[0, 5], [0], [0]])
