"""The pipeline schedule as an axis of the one scheduler: built from its config section alone, versioned,
checked on the way in, saved and restored, and planned one step ahead through the client (no Ray)."""

from __future__ import annotations

import pytest

from pdml_ray.config import PDMLConfig, PipelineConfig
from pdml_ray.decisions import Boundary, MicroBatchPlan
from pdml_ray.errors import ReportError
from pdml_ray.pipeline.plan import Kind, Measurement
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.priority.registry import DERIVERS
from pdml_ray.runtime.pipeline_plans import ScheduledPlans
from pdml_ray.scheduler import Scheduler

SHAPE = {"stages": 3, "replicas": [2, 2, 2], "microbatches": 6}


def _latencies(step: int, slow: tuple[int, int] = (1, 0)) -> list[Measurement]:
    """One step's action latencies: replica ``slow`` is 3x slower, a little drift by step."""
    out = []
    for k in range(SHAPE["stages"]):
        for r in range(SHAPE["replicas"][k]):
            factor = 3.0 if (k, r) == slow else 1.0
            for m in range(SHAPE["microbatches"]):
                out.append(Measurement(k, r, Kind.FORWARD, m, 0.01 * factor * (1 + 0.01 * step)))
                out.append(Measurement(k, r, Kind.BACKWARD, m, 0.02 * factor))
    return out


def _rows(ms: list[Measurement]) -> list[tuple]:
    return [(x.stage, x.replica, x.kind.value, x.microbatch, x.latency_s) for x in ms]


def _scheduler(schedule: str = "osprey") -> Scheduler:
    s = Scheduler(PDMLConfig(pipeline=PipelineConfig(schedule=schedule)), 6)
    s.set_shape("pipeline", SHAPE)
    return s


def test_the_pipeline_axis_is_a_registered_deriver_built_without_a_node_section():
    assert "pipeline" in DERIVERS and list(DERIVERS).index("pipeline") > list(DERIVERS).index("gradient")
    s = Scheduler(PDMLConfig(pipeline=PipelineConfig()), 4)
    assert list(s.derivers) == ["pipeline"]
    assert s.config.node_priority is None
    assert not s.bundle(Boundary(0, 1, ()), {})  # no shape announced yet: nothing to plan


def test_each_step_gets_a_stamped_plan_equal_to_the_schedule_run_directly():
    s = _scheduler()
    direct = make_schedule("osprey", stages=3, replicas=[2, 2, 2], microbatches=6, config=PipelineConfig(schedule="osprey"))
    for step in range(6):
        d = s.bundle(Boundary(step, 1, ()), {}).get("pipeline")
        assert isinstance(d, MicroBatchPlan) and d.version == step and d.effective_step == step
        assert d.plan.to_dict() == direct.plan(step).to_dict()
        assert s.observe("pipeline", step, _rows(_latencies(step)))
        direct.observe(_latencies(step))
    # osprey learnt the slow replica: stage 1's fast replica runs more micro-batches than the slow one
    plan = d.plan
    forwards = {key: sum(a.kind is Kind.FORWARD for a in acts) for key, acts in plan.orders.items()}
    assert forwards[(1, 1)] > forwards[(1, 0)]
    stats = s.stats().derivers["pipeline"]
    assert stats.plans == 6 and stats.steps_observed == 6 and stats.last_decision["kind"] == "adaptive"
    assert any(g.name == "pdml_pipeline_plans_total" and g.value == 6 for g in s.stats().gauges())
    assert [h.version for h in s.history["pipeline"]] == list(range(6))


def test_a_malformed_observation_is_refused_whole_and_counted():
    s = _scheduler()
    before = s.derivers["pipeline"].state_dict()
    rows = _rows(_latencies(0))
    bad = rows[:5] + [(1, 7, "F", 0, 0.01)] + rows[5:]  # replica 7 does not exist
    assert not s.observe("pipeline", 0, bad)
    assert s.derivers["pipeline"].state_dict() == before
    assert s.reports_rejected == 1 and s.rejected_by_kind == {"pipeline": 1}
    for garbage in ([(0, 0, "X", 0, 0.01)], [(99, 0, "F", 0, 0.01)], [(0, 0, "F", 0, float("nan"))], "rows", [(0, 0, "F", 0)]):
        assert not s.observe("pipeline", 1, garbage)
    assert not s.observe("pipeline", -1, rows)
    with pytest.raises(ReportError, match="not enabled"):
        s.observe("node", 0, rows)
    with pytest.raises(ReportError, match="shape"):
        s.set_shape("pipeline", {"stages": 3})


def test_a_restored_axis_plans_the_next_step_as_the_original():
    s = _scheduler()
    for step in range(4):
        s.bundle(Boundary(step, 1, ()), {})
        s.observe("pipeline", step, _rows(_latencies(step)))
    fresh = Scheduler(PDMLConfig(pipeline=PipelineConfig(schedule="osprey")), 6)
    fresh.load_state_dict(s.state_dict())
    a = s.bundle(Boundary(4, 1, ()), {}).get("pipeline")
    b = fresh.bundle(Boundary(4, 1, ()), {}).get("pipeline")
    assert a is not None and b is not None and a.plan.to_dict() == b.plan.to_dict() and a.version == b.version


def test_planning_ahead_plans_step_t_plus_1_on_latencies_through_t_minus_1():
    config = PDMLConfig(pipeline=PipelineConfig(schedule="osprey"))
    plans = ScheduledPlans(config, stages=3, replicas=2, microbatches=6, in_process=True)
    lagged = make_schedule("osprey", stages=3, replicas=[2, 2, 2], microbatches=6, config=config.pipeline)
    expected = [lagged.plan(0).to_dict(), lagged.plan(1).to_dict()]  # both asked before any latency
    for step in range(6):
        plan = plans.plan(step)
        assert plan.to_dict() == expected[step]
        plans.observe(_latencies(step))
        lagged.observe(_latencies(step))
        expected.append(lagged.plan(step + 2).to_dict())
    assert plans.steps == 6 and plans.fallbacks == 0 and plans.wait_s > 0
    assert plans.last_decision is not None and plans.last_decision.to_dict()["kind"] == "adaptive"
