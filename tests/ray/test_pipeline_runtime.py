"""The Ray-actor pipeline runtime: exact numerics under every schedule, and osprey adapting to a slow replica.

One module, one local Ray cluster (``ray_local``), one runtime of 3 stages x 2 replicas reused by all
tests (actor start-up is the expensive part on 2 cores).
"""

from __future__ import annotations

import functools

import pytest
import ray
import torch
from torch import nn

from pdml_ray.errors import ConfigError, PlanError, StateError
from pdml_ray.pipeline.plan import Kind
from pdml_ray.pipeline.registry import PROJECT_SCHEDULES, make_schedule
from pdml_ray.bench.pipeline_actors import compare_schedules
from pdml_ray.runtime.pipeline import PipelineRuntime

pytestmark = pytest.mark.ray

STAGES, REPLICAS, MICROBATCHES, LR = 3, 2, 6, 0.1


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    # Parameter-balanced into [Linear Tanh] [Linear Tanh] [Linear Tanh Linear]; ~1 ms per action on a CPU,
    # so that an emulated slow replica's latency stands out from scheduling noise.
    return nn.Sequential(nn.Linear(32, 192), nn.Tanh(), nn.Linear(192, 192), nn.Tanh(),
                         nn.Linear(192, 192), nn.Tanh(), nn.Linear(192, 8))


@pytest.fixture(scope="module")
def runtime(ray_local):
    # Momentum gives the optimizer state that layer moves must carry; a first step from set_parameters
    # (fresh optimizer) equals plain SGD's, which the reference step is.
    rt = PipelineRuntime(_model(), STAGES, REPLICAS, nn.MSELoss(), lr=LR,
                         optimizer=functools.partial(torch.optim.SGD, lr=LR, momentum=0.9))
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def reference_step():
    """Parameters after one SGD step of the unsplit model on the whole batch, in one process."""
    model = _model()
    initial = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4 * MICROBATCHES, 32, generator=g), torch.randn(4 * MICROBATCHES, 8, generator=g)
    loss = nn.MSELoss()(model(x), y)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return initial, x, y, float(loss.detach()), [p.detach().clone() for p in model.parameters()]


def test_runtime_splits_the_model_by_parameters(runtime):
    assert runtime.stage_sizes == [2, 2, 3]
    assert runtime.replicas == (2, 2, 2)
    assert [p.shape for p in runtime.parameters()] == [p.shape for p in _model().parameters()]


@pytest.mark.parametrize("schedule", sorted(PROJECT_SCHEDULES))
def test_one_step_equals_the_unsplit_model_under_every_schedule(runtime, reference_step, schedule):
    initial, x, y, ref_loss, ref_params = reference_step
    scheduler = make_schedule(schedule, stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    # One step first, so that adaptive schedulers have measurements and the checked step runs their
    # own plan (reordered, uneven placement) rather than the static warm start.
    runtime.run_step(scheduler, x, y, step=0)
    runtime.set_parameters(initial)
    steps_before = runtime.stats.steps
    result = runtime.run_step(scheduler, x, y, step=1)

    assert result.loss == pytest.approx(ref_loss, rel=1e-5)
    # the run record the driver exports: this step's wall time and measured idle fraction
    assert runtime.stats.steps == steps_before + 1 and runtime.stats.schedule == result.schedule
    assert runtime.stats.step_s == result.step_time_s
    busy = sum(m.latency_s for m in result.measurements)
    assert runtime.stats.bubble == pytest.approx(1 - busy / (result.step_time_s * STAGES * REPLICAS))
    assert 0.0 <= runtime.stats.bubble < 1.0
    # Every micro-batch ran forward and backward exactly once on every stage.
    for kind in (Kind.FORWARD, Kind.BACKWARD):
        done = sorted((m.stage, m.microbatch) for m in result.measurements if m.kind is kind)
        assert done == [(k, mb) for k in range(STAGES) for mb in range(MICROBATCHES)]
    assert sum(result.forward_counts.values()) == STAGES * MICROBATCHES
    assert all(m.latency_s > 0 for m in result.measurements)

    for got, want in zip(runtime.parameters(), ref_params, strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert runtime.replicas_identical()


def test_osprey_moves_work_away_from_a_slow_replica(runtime, reference_step):
    initial, x, y, _, _ = reference_step
    runtime.set_parameters(initial)
    slow = (1, 1)
    runtime.set_speed(*slow, 0.2)  # EMULATED: sleeps 4x its compute after every action
    try:
        scheduler = make_schedule("osprey", stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
        results = [runtime.run_step(scheduler, x, y, step=s) for s in range(4)]
    finally:
        runtime.set_speed(*slow, 1.0)

    # The emulated slowdown is visible in the measured latencies the scheduler learns from ...
    slow_lat = [m.latency_s for r in results for m in r.measurements if (m.stage, m.replica) == slow]
    fast_lat = [m.latency_s for r in results for m in r.measurements if (m.stage, m.replica) == (1, 0)]
    assert slow_lat and fast_lat
    assert sorted(slow_lat)[len(slow_lat) // 2] > 2 * sorted(fast_lat)[len(fast_lat) // 2]
    # ... and osprey acts on it: after learning, the slow replica gets fewer micro-batches than its peer
    # (a static schedule splits them evenly, MICROBATCHES // 2 each).
    last = results[-1].forward_counts
    assert last[slow] < MICROBATCHES // 2 < last[(1, 0)], [r.forward_counts for r in results]
    assert last[slow] + last[(1, 0)] == MICROBATCHES
    assert runtime.replicas_identical()  # replicas of a stage stay identical whatever the assignment


def test_a_plan_for_another_shape_is_refused(runtime, reference_step):
    _, x, y, _, _ = reference_step
    scheduler = make_schedule("1f1b", stages=STAGES, replicas=1, microbatches=MICROBATCHES)
    with pytest.raises(PlanError, match="build the scheduler with the runtime's stages and replicas"):
        runtime.run_step(scheduler, x, y, step=0)
    too_many = make_schedule("1f1b", stages=STAGES, replicas=REPLICAS, microbatches=x.shape[0] + 1)
    with pytest.raises(PlanError, match="at least one sample per micro-batch"):
        runtime.run_step(too_many, x, y, step=0)


def test_a_failed_step_leaves_the_runtime_usable(runtime, reference_step):
    initial, x, y, _, _ = reference_step
    runtime.set_parameters(initial)
    scheduler = make_schedule("1f1b", stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    with pytest.raises(ray.exceptions.RayTaskError, match="size of tensor"):
        runtime.run_step(scheduler, x, y[:, :7], step=0)  # the last stage's loss fails on the shape
    assert all(torch.equal(a, b) for a, b in zip(runtime.parameters(), initial))  # no partial update
    result = runtime.run_step(scheduler, x, y, step=1)
    assert len(result.measurements) == 2 * STAGES * MICROBATCHES


def test_too_few_cpus_is_a_config_error_not_a_hang(ray_local):
    with pytest.raises(ConfigError, match="lower num_cpus_per_actor"):
        PipelineRuntime(_model(), STAGES, REPLICAS, nn.MSELoss(), num_cpus_per_actor=1.0)  # 6 > 4 CPUs


def test_compare_schedules_reports_the_figures_the_benchmark_prints(runtime):
    # Smallest real run (2 actors: start-up dominates), next to the module's runtime (3 CPUs of 4 in use).
    # What osprey gains is the benchmark's business (pdml-ray bench pipeline), not a test's.
    out = compare_schedules("1f1b", "osprey", stages=2, replicas=1, steps=2, microbatches=4, quick=True,
                            warmup_steps=0, num_cpus_per_actor=0.2, compute="sleep", per_sample_ms=0.2,
                            also=("1f1b-weighted",))
    assert out["compute"] == "sleep" and out["per_sample_ms"] == 0.2
    assert out["osprey_over_static"] == pytest.approx(out["adaptive_median_step_s"] / out["static_median_step_s"])
    assert len(out["static_step_s"]) == len(out["adaptive_step_s"]) == 2
    assert set(out["schedules"]) == {"1f1b", "osprey", "1f1b-weighted"}
    assert set(out["paired"]) == {"osprey_over_1f1b", "osprey_over_1f1b_weighted"}
    paired = out["paired"]["osprey_over_1f1b"]
    assert paired["ratios"] == pytest.approx([a / s for s, a in zip(out["static_step_s"], out["adaptive_step_s"])])
    assert paired["rounds"] == 2 == sum(paired[k] for k in ("rounds_method_faster", "rounds_baseline_faster", "rounds_tied"))
    assert out["speeds"] == {"s0r0": 1.0, "s1r0": 0.5} and out["slow_replica"] == "s1r0"
    assert "EMULATED (--compute sleep)" in out["emulated"] and "s1r0" in out["emulated"]
    # The sleeps alone make a step at least 4 micro-batches x 64 samples x 0.2 ms x (1 + 2) / 0.5 on the slow stage.
    assert min(out["static_step_s"]) >= 4 * 64 * 0.2e-3 * 3 / 0.5
    # The simulator's prediction on the same costs: one replica per stage, so the slow stage's work plus the
    # fast stage's first forward and last backward.
    f = 64 * 0.2e-3
    assert out["simulated_step_s"]["1f1b"] == pytest.approx(4 * 3 * f / 0.5 + 3 * f)
    assert out["forward_counts"]["adaptive"] == {"s0r0": 4, "s1r0": 4}
    assert out["layers_per_stage"] == [6, 5] and out["model"].startswith("MLP 32-64x5")
    assert ray.is_initialized()  # it used the running cluster and left it running


def test_compare_schedules_keeps_real_compute(runtime):
    out = compare_schedules("1f1b", "osprey", stages=2, replicas=1, steps=1, microbatches=2, quick=True,
                            warmup_steps=0, num_cpus_per_actor=0.2, compute="real")
    assert out["compute"] == "real" and out["per_sample_ms"] is None and set(out["paired"]) == {"osprey_over_1f1b"}
    assert out["simulated_step_s"] is None
    assert "EMULATED: a worker with speed s sleeps" in out["emulated"]
    assert 0 < out["cpu_floor_s"] and out["layers_per_stage"] == [6, 5]
    with pytest.raises(ConfigError, match="compute must be one of"):
        compare_schedules(compute="fast")


def test_a_run_planned_by_the_scheduler_actor_shows_its_axis_in_status(runtime, reference_step, capsys):
    """The default path: every plan comes from the run's scheduler actor (fetched a step ahead), and the run
    is in ``pdml-ray status --json`` and in the scheduler's metric series like a Ray Train run."""
    import json

    from pdml_ray.cli import main
    from pdml_ray.config import PDMLConfig, PipelineConfig
    from pdml_ray.runtime.pipeline_plans import ScheduledPlans

    initial, x, y, _, _ = reference_step
    runtime.set_parameters(initial)
    plans = ScheduledPlans(PDMLConfig(pipeline=PipelineConfig(schedule="osprey"), scheduler_name="pipeline-status"),
                           stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    try:
        results = [runtime.run_step(plans, x, y, step=s) for s in range(3)]
        assert [r.schedule for r in results] == ["osprey"] * 3 and plans.fallbacks == 0
        assert plans.decision is not None and plans.decision.version == 2 and plans.decision.effective_step == 2
        capsys.readouterr()
        assert main(["status", "--json", "--name", "pipeline-status"]) == 0
        record = json.loads(capsys.readouterr().out)["schedulers"]["pipeline-status"]
        axis = record["derivers"]["pipeline"]
        assert record["versions"]["pipeline"] >= 3  # step 3's plan was asked for ahead
        assert axis["schedule"] == "osprey" and axis["replicas"] == [REPLICAS] * STAGES and axis["plans"] >= 3
        assert "node" not in record["derivers"]
        names = {g.name for g in plans.stats().gauges()}
        assert {"pdml_pipeline_plans_total", "pdml_pipeline_plan_seconds_total"} <= names
    finally:
        plans.close()
    assert runtime.replicas_identical()


def test_layers_move_off_a_slow_stage_and_training_goes_on_exactly(runtime, reference_step):
    """Re-balancing through the run's scheduler: stage 2 (both replicas) EMULATED 5x slower, the pipeline axis
    moves layers off it at a step boundary, their parameters and momentum with them, and the model after
    equals the model trained on the same data without a move (the move changes placement, not math)."""
    from pdml_ray.config import PDMLConfig, PipelineConfig, RebalanceConfig
    from pdml_ray.pipeline.rebalance import LayerMove
    from pdml_ray.runtime.pipeline_plans import ScheduledPlans

    initial, x, y, _, _ = reference_step
    steps = 8
    runtime.set_parameters(initial)
    static = make_schedule("1f1b", stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    for s in range(steps):
        runtime.run_step(static, x, y, step=s)
    want = runtime.parameters()

    runtime.set_parameters(initial)
    config = PDMLConfig(pipeline=PipelineConfig(schedule="1f1b", rebalance=RebalanceConfig(enabled=True, window=2)))
    plans = ScheduledPlans(config, stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES, in_process=True,
                           layers=runtime.layer_costs, cuts=runtime.cuts)
    for r in range(REPLICAS):
        runtime.set_speed(2, r, 0.2)
    try:
        results = [runtime.run_step(plans, x, y, step=s) for s in range(steps)]
    finally:
        plans.close()
        for r in range(REPLICAS):
            runtime.set_speed(2, r, 1.0)
    moves = [r.layer_move for r in results if r.layer_move is not None]
    assert moves and moves[0].stage == 2 and moves[0].cuts_before == (2, 4), [r.layer_move for r in results]
    assert moves[0].effective_step >= 3  # a window of two slow steps, measured, then planned a step ahead
    assert moves[0].cuts_after[1] > 4 and runtime.cuts == moves[-1].cuts_after  # stage 2 gave layers away
    assert sum(runtime.stage_sizes) == 7 and runtime.stage_sizes != [2, 2, 3]
    got = runtime.parameters()
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-6, rtol=0), (g - w).abs().max()
    assert runtime.replicas_identical()

    # And back (the module's other tests expect the parameter-balanced split): parameters unchanged.
    runtime.apply_layer_move(LayerMove(effective_step=steps, stage=1, cuts_before=runtime.cuts, cuts_after=(2, 4),
                                       num_layers=7, stage_s_before=(1.0,) * 3, stage_s_after=(1.0,) * 3))
    assert runtime.stage_sizes == [2, 2, 3]
    assert all(torch.equal(a, b) for a, b in zip(runtime.parameters(), got, strict=True))
    stale = LayerMove(effective_step=steps, stage=2, cuts_before=(2, 5), cuts_after=(2, 6), num_layers=7,
                      stage_s_before=(1.0,) * 3, stage_s_after=(1.0,) * 3)
    with pytest.raises(StateError, match="announce the runtime's layers"):
        runtime.apply_layer_move(stale)  # decided for cuts the runtime does not have


def test_a_replica_that_slows_gets_less_work_at_the_next_step_with_replanning(runtime, reference_step):
    """Through the scheduler actor, plans a step ahead: a replica EMULATED 50x slower from step 2 on. With
    ``replan_on_shift`` step 3's plan is asked for again after step 2's latencies, so the slow replica gets
    at most one of its stage's micro-batches at step 3; planned a step ahead on steps up to 1 (timing noise
    only: ~1 ms actions on a shared machine) it would get two or three. 50x, not 20x: a peer given no
    micro-batch at step 2 keeps its step-1 estimate, and on a loaded machine (the whole Ray tier) a noisy
    one, 10x its compute, once gave the slow replica two at 20x; at 50x that takes 25x."""
    from pdml_ray.config import OspreyConfig, PDMLConfig, PipelineConfig
    from pdml_ray.runtime.pipeline_plans import ScheduledPlans

    initial, x, y, _, _ = reference_step
    runtime.set_parameters(initial)
    slow = (1, 1)
    config = PDMLConfig(pipeline=PipelineConfig(schedule="osprey", osprey=OspreyConfig(replan_on_shift=True)))
    plans = ScheduledPlans(config, stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    try:
        results = []
        for step in range(4):
            if step == 2:
                runtime.set_speed(*slow, 0.02)  # EMULATED: sleeps 49x its compute after every action
            results.append(runtime.run_step(plans, x, y, step=step))
    finally:
        runtime.set_speed(*slow, 1.0)
        plans.close()
    counts = [r.forward_counts for r in results]
    assert plans.replans >= 1 and counts[3][slow] <= 1 < counts[3][(1, 0)], (plans.replans, counts)
    assert plans.fallbacks == 0 and runtime.replicas_identical()
