"""A plan's predicted busy time per executor, and the re-plan after a step that ran far from it."""

from __future__ import annotations

import pytest

from pdml_ray.config import OspreyConfig, PDMLConfig, PipelineConfig
from pdml_ray.pipeline.plan import Action, Kind, Measurement, Plan
from pdml_ray.pipeline.prediction import busy_shift, predicted_busy, replan_due
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.runtime.pipeline_plans import ScheduledPlans


def _plan(stage_rank=None) -> Plan:
    """Two stages (or two ranks of two chunks each), one replica, two micro-batches: F then B per micro-batch."""
    stages = 2 if stage_rank is None else 4
    orders: dict[tuple[int, int], list[Action]] = {}
    for k in range(stages):
        key = (k if stage_rank is None else stage_rank[k], 0)
        orders.setdefault(key, []).extend(Action(k, 0, kind, m) for m in range(2)
                                          for kind in (Kind.FORWARD, Kind.BACKWARD))
    return Plan(stages, (1,) * stages, 2, {key: tuple(acts) for key, acts in orders.items()}, stage_rank=stage_rank)


EST = [[(1.0, 2.0, 1.0, 1.0)], [(3.0, 6.0, 3.0, 3.0)]]  # [rank][replica] -> F, B, I, W seconds


def test_predicted_busy_sums_each_executors_actions_per_kind_on_the_estimates():
    # 2 micro-batches of F (1 s at rank 0, 3 s at rank 1) and B (2 s, 6 s) per rank
    assert predicted_busy(_plan(), EST) == ((0, 0, "F", 2.0), (0, 0, "B", 4.0), (1, 0, "F", 6.0), (1, 0, "B", 12.0))
    # the second micro-batch twice as costly at rank 0, half at rank 1 (its sizes told)
    assert predicted_busy(_plan(), EST, [[1.0, 2.0], [1.0, 0.5]]) == \
        ((0, 0, "F", 3.0), (0, 0, "B", 6.0), (1, 0, "F", 4.5), (1, 0, "B", 9.0))
    # two chunks per rank (virtual stages 0 and 3 on rank 0): each chunk is half its rank's work
    assert predicted_busy(_plan((0, 1, 1, 0)), EST) == predicted_busy(_plan(), EST)


def _rows(f0: float, b0: float, f1: float, b1: float) -> list[tuple]:
    """One step of ``_plan()``: F and B seconds per micro-batch at ranks 0 and 1."""
    return [(k, 0, kind, m, t) for k, f, b in ((0, f0, b0), (1, f1, b1)) for kind, t in (("F", f), ("B", b))
            for m in range(2)]


def test_busy_shift_is_the_largest_shift_of_an_executor_whose_every_kind_moved_the_same_way():
    plan, predicted = _plan(), predicted_busy(_plan(), EST)
    record = {"predicted_busy_s": [list(x) for x in predicted]}
    as_planned = _rows(1.0, 2.0, 3.0, 6.0)
    assert busy_shift(plan, predicted, as_planned) == 0.0
    halved = _rows(1.0, 2.0, 6.0, 12.0)  # rank 1 at half speed: F and B twice as long
    assert busy_shift(plan, predicted, halved) == pytest.approx(1.0)
    assert replan_due(plan, record, halved, 0.45)
    assert busy_shift(plan, predicted, _rows(1.0, 2.0, 6.0, 9.0)) == pytest.approx(0.5)  # the smaller of the two
    # one kind off (a pause in one backward, timing noise), or kinds moving apart: no shift
    assert busy_shift(plan, predicted, _rows(1.0, 2.0, 3.0, 12.0)) == 0.0
    assert busy_shift(plan, predicted, _rows(1.0, 2.0, 6.0, 3.0)) == 0.0
    assert not replan_due(plan, record, halved, 0.0)  # 0: off
    assert not replan_due(plan, {}, halved, 0.45)  # a plan without a prediction (a static schedule's)
    assert busy_shift(plan, predicted, halved[:4]) == 0.0  # rank 1 sent nothing: nothing to compare
    assert busy_shift(plan, predicted, [(7, 0, "F", 0, 9.0)]) == 0.0  # a stage the plan does not have


def _latencies(plan: Plan, step: int, slow: tuple[int, int]) -> list[Measurement]:
    """The latencies of ``plan``'s actions: F 10 ms, B 20 ms, replica ``slow`` 3x slower."""
    out = []
    for (k, r), actions in plan.orders.items():
        factor = 3.0 if (k, r) == slow else 1.0
        out += [Measurement(a.stage, a.replica, a.kind, a.microbatch,
                            factor * (0.01 * (1 + 0.01 * step) if a.kind is Kind.FORWARD else 0.02)) for a in actions]
    return out


def test_a_step_far_from_its_prediction_has_the_next_plan_made_after_its_latencies():
    config = PDMLConfig(pipeline=PipelineConfig(schedule="osprey", osprey=OspreyConfig(replan_on_shift=True)))
    plans = ScheduledPlans(config, stages=3, replicas=2, microbatches=6, in_process=True)
    fresh = make_schedule("osprey", stages=3, replicas=[2, 2, 2], microbatches=6, config=config.pipeline)
    slow = lambda step: (1, 0) if step < 3 else (2, 1)  # noqa: E731 - the slow replica moves at step 3
    replanned = []
    for step in range(7):
        before = plans.replans
        plan = plans.plan(step)
        if step in (1, 4):  # made right after the step before's latencies, not a step earlier
            assert plan.to_dict() == fresh.plan(step).to_dict()
        plans.observe(_latencies(plan, step, slow(step)))
        fresh.observe(_latencies(plan, step, slow(step)))
        if plans.replans > before:
            replanned.append(step + 1)
    # step 0 ran on the prior costs (the warm start); step 3 moved the slow replica; nothing else is off
    assert replanned == [1, 4] and plans.steps == 7 and plans.fallbacks == 0
    # off (the default), the same run never asks twice
    off = ScheduledPlans(PDMLConfig(pipeline=PipelineConfig(schedule="osprey")), stages=3, replicas=2,
                         microbatches=6, in_process=True)
    for step in range(7):
        off.observe(_latencies(off.plan(step), step, slow(step)))
    assert off.replans == 0


def test_rank_0_of_a_trainer_pipeline_asks_again_after_a_shift():
    """The Ray Train path's plans (``ScheduledStagePlans``, a one-rank gloo group) follow the same rule."""
    import torch
    import torch.distributed as dist

    from pdml_ray.actors.scheduler_transport import RunScheduler
    from pdml_ray.train.pipeline import ScheduledStagePlans

    config = PDMLConfig(pipeline=PipelineConfig(schedule="osprey", osprey=OspreyConfig(replan_on_shift=True)))
    run = RunScheduler(config, 1, in_process=True, name_prefix="test")
    plans = ScheduledStagePlans(run.client, rank=0, stages=2, microbatches=4, device=torch.device("cpu"),
                                adaptive=True, replan_threshold=config.pipeline.osprey.jump_threshold)
    replanned = []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for step in range(6):
            before = plans.replans
            plan = plans.plan_for(step)
            factor = 2.0 if step >= 3 else 1.0  # the whole pipeline slows at step 3 (a throttled node)
            rows = [(a.stage, a.kind.value, a.microbatch, factor * (0.01 if a.kind is Kind.FORWARD else 0.02))
                    for acts in plan.orders.values() for a in acts]
            plans.observe(step, rows)
            if plans.replans > before:
                replanned.append(step + 1)
    finally:
        dist.destroy_process_group()
    assert replanned == [1, 4] and plans.fallbacks == 0
