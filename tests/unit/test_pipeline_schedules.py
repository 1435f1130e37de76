"""Static schedules and the registry: validity everywhere, textbook bubbles and memory, CP priorities."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.config import PipelineConfig
from pdml_ray.errors import PlanError
from pdml_ray.pipeline.listsched import in_order_makespan, list_schedule, round_robin, single_pipeline_schedule
from pdml_ray.pipeline.plan import Kind, validate
from pdml_ray.pipeline.registry import PROJECT_SCHEDULES, make_schedule
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator
from pdml_ray.pipeline.static import critical_path_ranks

F, B = Kind.FORWARD, Kind.BACKWARD


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=5), st.integers(1, 12),
       st.one_of(st.none(), st.integers(1, 6)), st.sampled_from(sorted(PROJECT_SCHEDULES)))
def test_every_schedule_is_valid(replicas: list[int], microbatches: int, limit: int | None, name: str) -> None:
    stages = len(replicas)
    config = PipelineConfig(memory_limit=limit)
    scheduler = make_schedule(name, stages=stages, replicas=replicas, microbatches=microbatches, config=config)
    profile = ClusterProfile.build(stages, replicas, profile="heterogeneous", seed=microbatches, memory_limit=limit)
    sim = PipelineSimulator(profile, seed=1)
    for step in range(3):  # step 0 is the warm start; later steps use measurements (osprey, auto)
        plan = scheduler.plan(step)
        validate(plan)
        assert plan.memory_limit == limit
        result = sim.run_step(plan, step)
        assert result.memory_violations == 0
        assert len(result.measurements) == 2 * stages * microbatches
        scheduler.observe(result.measurements)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(2, 1), (4, 8), (4, 16), (8, 3), (5, 32)])
def test_bubble_formula_equal_costs_one_replica(name: str, stages: int, microbatches: int) -> None:
    # f = b = 1 s: every stage is busy 2m of the 2(m + p - 1) seconds, bubble (p-1)/(m+p-1).
    profile = ClusterProfile.build(stages, 1, forward_s=1.0, backward_s=1.0)
    plan = make_schedule(name, stages=stages, replicas=1, microbatches=microbatches).plan(0)
    result = PipelineSimulator(profile).run_step(plan)
    expected = (stages - 1) / (microbatches + stages - 1)
    assert result.makespan_s == pytest.approx(2 * (microbatches + stages - 1))
    for bubble in result.bubble_fraction:
        assert bubble == pytest.approx(expected)


def test_1f1b_holds_stages_minus_k_activations_gpipe_holds_all() -> None:
    S, M = 4, 10
    profile = ClusterProfile.build(S, 1)
    one = PipelineSimulator(profile).run_step(make_schedule("1f1b", stages=S, replicas=1, microbatches=M).plan(0))
    gp = PipelineSimulator(profile).run_step(make_schedule("gpipe", stages=S, replicas=1, microbatches=M).plan(0))
    assert [one.peak_memory[(k, 0)] for k in range(S)] == [4, 3, 2, 1]
    assert [gp.peak_memory[(k, 0)] for k in range(S)] == [M] * S


def test_gpipe_under_memory_limit_runs_in_rounds() -> None:
    plan = make_schedule("gpipe", stages=3, replicas=2, microbatches=10, config=PipelineConfig(memory_limit=2)).plan(0)
    validate(plan)
    # Rounds of 2 x 2 = 4 micro-batches: replica 0 of stage 0 runs F0 F2 B0 B2, then F4 F6 ...
    assert [str(a) for a in plan.orders[(0, 0)][:6]] == ["s0r0F0", "s0r0F2", "s0r0B0", "s0r0B2", "s0r0F4", "s0r0F6"]


def test_static_schedules_assign_round_robin() -> None:
    for name in ("gpipe", "1f1b", "1f1b-weighted", "critical-path"):  # 1f1b-weighted: before any measurement
        plan = make_schedule(name, stages=3, replicas=(2, 3, 1), microbatches=7).plan(0)
        assert dict(plan.placement) == round_robin(3, (2, 3, 1), 7)
        assert plan.reorder is False


def test_critical_path_ranks_are_remaining_chain_seconds() -> None:
    rank_f, rank_b = critical_path_ranks([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], transfer_s=0.5)
    # B at stage k: b_0..b_k plus k transfers; F at stage k: f_k.. + all b + transfers to the end.
    assert rank_b == [4.0, 9.5, 16.0]
    assert rank_f == [1 + 2 + 3 + 16.0 + 2 * 0.5, 2 + 3 + 16.0 + 0.5, 3 + 16.0]


def test_critical_path_uses_measured_costs() -> None:
    cp = make_schedule("critical-path", stages=2, replicas=1, microbatches=2)
    from pdml_ray.pipeline.plan import Measurement

    cp.observe([Measurement(0, 0, F, 0, 3.0), Measurement(0, 0, F, 1, 5.0), Measurement(1, 0, B, 0, 7.0)])
    assert cp.forward_s == [4.0, 1.0] and cp.backward_s == [2.0, 7.0]


def test_in_order_makespan_matches_simulator() -> None:
    profile = ClusterProfile.build(4, 2, profile="heterogeneous", transfer_s=0.25)
    plan = make_schedule("1f1b", stages=4, replicas=2, microbatches=9).plan(0)
    speeds = profile.speeds
    costs = [[(1.0 / s, 2.0 / s) for s in row] for row in speeds]
    predicted = in_order_makespan(plan.orders, 4, costs, transfer_s=0.25)
    assert predicted == pytest.approx(PipelineSimulator(profile).run_step(plan).makespan_s)


def test_in_order_makespan_names_a_deadlock_and_list_scheduling_refuses_zero_caps() -> None:
    from pdml_ray.pipeline.plan import Action

    # Stage 0 wants B0 before F1, stage 1 wants F1 before B0: in order, neither can move.
    orders = {(0, 0): (Action(0, 0, F, 0), Action(0, 0, B, 0), Action(0, 0, F, 1), Action(0, 0, B, 1)),
              (1, 0): (Action(1, 0, F, 1), Action(1, 0, F, 0), Action(1, 0, B, 0), Action(1, 0, B, 1))}
    with pytest.raises(PlanError, match=r"deadlocks with \(stage, replica\) \[\(0, 0\), \(1, 0\)\].*validate"):
        in_order_makespan(orders, 2, [[(1.0, 2.0)], [(1.0, 2.0)]])
    with pytest.raises(PlanError, match="one entry >= 1 per stage"):
        list_schedule(2, (1, 1), 3, [[(1.0, 2.0)], [(1.0, 2.0)]], [(1, 0)] * 2, [2, 0])
    with pytest.raises(PlanError, match="one entry >= 1 per stage"):
        single_pipeline_schedule([1.0, 1.0], [2.0, 2.0], 3, [2])


def test_unknown_schedule_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown pipeline schedule 'pipedream'.*'1f1b'.*'osprey'"):
        make_schedule("pipedream", stages=2, replicas=1, microbatches=2)


# ---- 1f1b-weighted: 1F1B with micro-batches in proportion to replica speeds ----------------------

def _counts(plan, stage: int, replicas: int) -> list[int]:
    return [sum(1 for (k, _), r in plan.placement.items() if k == stage and r == rep) for rep in range(replicas)]


def test_weighted_1f1b_follows_given_speeds() -> None:
    from pdml_ray.pipeline.static import speed_weighted_placement

    plan = make_schedule("1f1b-weighted", stages=2, replicas=2, microbatches=12).plan(0)  # before speeds: 1F1B
    assert _counts(plan, 0, 2) == [6, 6]
    from pdml_ray.pipeline.static import WeightedOneFOneBSchedule

    w = WeightedOneFOneBSchedule(stages=2, replicas=(2, 2), microbatches=12, speeds=[[1.0, 0.5], [1.0, 1.0]])
    plan = w.plan(0)
    validate(plan)
    assert _counts(plan, 0, 2) == [8, 4] and _counts(plan, 1, 2) == [6, 6]  # 2:1 where the speeds are 1 : 0.5
    assert w.microbatch_counts() == [[8, 4], [6, 6]]
    # The slow replica's micro-batches are spread over the step, not bunched at its end.
    assert [speed_weighted_placement([[1.0, 0.5]], 12)[(0, m)] for m in range(12)] == [0, 1, 0, 0, 1, 0] * 2
    assert plan.reorder is False and plan.schedule == "1f1b-weighted"


def test_weighted_1f1b_equals_1f1b_when_speeds_are_equal() -> None:
    from pdml_ray.pipeline.static import WeightedOneFOneBSchedule

    for replicas, microbatches in (((2, 3, 1), 7), ((4, 4, 4, 4), 16), ((3, 2), 5)):
        stages = len(replicas)
        plain = make_schedule("1f1b", stages=stages, replicas=replicas, microbatches=microbatches).plan(0)
        given = WeightedOneFOneBSchedule(stages=stages, replicas=replicas, microbatches=microbatches,
                                          speeds=[[0.7] * r for r in replicas]).plan(0)
        assert given.orders == plain.orders
        # Measured on a homogeneous cluster: the same plan after calibration.
        measured = make_schedule("1f1b-weighted", stages=stages, replicas=replicas, microbatches=microbatches)
        sim = PipelineSimulator(ClusterProfile.build(stages, replicas))
        for step in range(3):
            measured.observe(sim.run_step(measured.plan(step), step).measurements)
        assert measured.plan(3).orders == plain.orders


def test_weighted_1f1b_measures_speeds_then_keeps_its_plan() -> None:
    S, R, M = 4, 4, 16
    profile = ClusterProfile.build(S, R, profile="heterogeneous", seed=3, memory_limit=S)
    sim = PipelineSimulator(profile, seed=3)
    w = make_schedule("1f1b-weighted", stages=S, replicas=R, microbatches=M, config=PipelineConfig(memory_limit=S))
    plans = []
    for step in range(4):
        plans.append(w.plan(step))
        validate(plans[-1])
        result = sim.run_step(plans[-1], step)
        assert result.memory_violations == 0
        w.observe(result.measurements)
    assert w.calibrated_steps == 2
    for k in range(S):  # relative speeds, the stage's fastest replica 1.0, as measured (no noise here)
        fastest = max(profile.speeds[k])
        assert w.speeds[k] == pytest.approx([s / fastest for s in profile.speeds[k]], abs=0.006)
    slow_stage = S // 2  # replica 0 of the middle stage runs at half speed: it gets the fewest micro-batches
    counts = _counts(plans[-1], slow_stage, R)
    assert counts[0] == min(counts) < M // R < max(counts) and sum(counts) == M
    assert plans[2].orders == plans[3].orders  # fixed after calibration
    # It beats round-robin 1F1B here, where speeds differ.
    plain = make_schedule("1f1b", stages=S, replicas=R, microbatches=M, config=PipelineConfig(memory_limit=S)).plan(0)
    assert sim.run_step(plans[-1], 3).makespan_s < sim.run_step(plain, 3).makespan_s
    # State round trip reproduces the plan.
    fresh = make_schedule("1f1b-weighted", stages=S, replicas=R, microbatches=M, config=PipelineConfig(memory_limit=S))
    fresh.load_state_dict(w.state_dict())
    assert fresh.plan(4).orders == w.plan(4).orders


def test_weighted_1f1b_rejects_bad_speeds() -> None:
    from pdml_ray.errors import ConfigError
    from pdml_ray.pipeline.static import WeightedOneFOneBSchedule

    with pytest.raises(ConfigError, match="one positive speed per replica"):
        WeightedOneFOneBSchedule(stages=2, replicas=(2, 2), microbatches=4, speeds=[[1.0, 0.5]])
    with pytest.raises(ConfigError, match="one positive speed per replica"):
        WeightedOneFOneBSchedule(stages=1, replicas=(2,), microbatches=4, speeds=[[1.0, 0.0]])
