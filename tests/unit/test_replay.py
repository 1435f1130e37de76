"""One replay path for every axis: a scheduler's input log, fed to a fresh scheduler, gives back every
decision it published (node, sample and gradient axes; the pipeline's plans, osprey's included), and a
replay says where it diverges when an input was changed (no Ray)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pdml_ray.config import (GradientPriorityConfig, NodePriorityConfig, PDMLConfig, PipelineConfig,
                             SamplePriorityConfig)
from pdml_ray.decisions import Boundary, WorkerReport
from pdml_ray.errors import PlanError, StateError
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator, simulate_schedule
from pdml_ray.replay import load, recorded, replay, save
from pdml_ray.runtime.pipeline_plans import ScheduledPlans
from pdml_ray.scheduler import Scheduler

B, N = 64, 500


def _ray_train_scheduler() -> Scheduler:
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B, warmup_steps=0, hysteresis=0.0,
                                                         min_batch=4, max_batch=60),
                        sample_priority=SamplePriorityConfig(), gradient_priority=GradientPriorityConfig(),
                        replay_log=10_000)
    s = Scheduler(config, 2)
    s.register(0, "H100")
    s.register(1, "A100")
    s.set_dataset_size(N)
    rng = np.random.default_rng(0)
    for step in range(24):
        reports = [WorkerReport(worker_id=w, step=step, samples=(b := s.decision().batch_sizes[w]),
                                compute_s=b * per_sample_s * (1 + 0.05 * rng.random()), loss=float(rng.random()),
                                grad_norm=float(rng.random() + 0.5),
                                sample_indices=rng.integers(0, N, size=b).astype(np.int64),
                                sample_losses=rng.random(b).astype(np.float32))
                   for w, per_sample_s in enumerate((0.01, 0.02))]
        s.report(reports)
        if step % 4 == 3:
            s.bundle(Boundary(step + 1, 4, s.decision().batch_sizes), dict(s.versions))
    return s


def test_the_node_sample_and_gradient_axes_replay_exactly_through_a_saved_log(tmp_path):
    s = _ray_train_scheduler()
    assert s.decision().batch_sizes[0] > s.decision().batch_sizes[1]  # worker 1 is half as fast: it moved
    log = recorded(s)
    save(log, tmp_path / "run.replay")
    decided = replay(load(tmp_path / "run.replay"))
    assert len(decided) == 6 and {"node", "sample", "gradient"} <= set().union(*decided)
    assert [d["node"] for d in decided if "node" in d][-1] == s.decision("node").to_dict()


def test_a_changed_report_makes_the_replay_name_the_request_and_axis_that_diverge():
    log = recorded(_ray_train_scheduler())
    events = list(log["events"])
    i = next(k for k, e in enumerate(events) if e[0] == "report")
    rows = [list(r) for r in events[i][1]]
    rows[1][3] *= 5.0  # worker 1's compute time at step 0, five times longer
    events[i] = ("report", [tuple(r) for r in rows])
    with pytest.raises(PlanError, match=r"replay diverged at request \d+ \(step \d+\): axis '(node|gradient)'"):
        replay({**log, "events": events})


def test_a_log_that_lost_its_start_or_is_not_one_is_refused():
    s = Scheduler(dataclasses.replace(_ray_train_scheduler().config, replay_log=5), 2)
    for step in range(10):
        s.report([WorkerReport(worker_id=0, step=step, samples=32, compute_s=0.3)])
    with pytest.raises(StateError, match="lost its first 5 inputs.*raise replay_log"):
        replay(recorded(s))
    with pytest.raises(StateError, match="not a replay log"):
        replay({"events": []})
    with pytest.raises(StateError, match="keeps no input log"):
        recorded(Scheduler(PDMLConfig(pipeline=PipelineConfig()), 2))


@pytest.mark.parametrize("schedule", ["osprey", "auto", "critical-path", "1f1b", "gpipe"])
def test_the_pipeline_axis_replays_every_plan_and_a_changed_latency_diverges(schedule):
    config = PDMLConfig(pipeline=PipelineConfig(schedule=schedule, memory_limit=3), replay_log=10_000)
    plans = ScheduledPlans(config, stages=3, replicas=2, microbatches=8, in_process=True)
    profile = ClusterProfile.build(3, 2, profile="noisy", speeds=((1, 0.6), (1, 1), (0.8, 1)), memory_limit=3)
    simulate_schedule(plans, PipelineSimulator(profile, seed=5), 6)
    assert plans.scheduler is not None
    log = recorded(plans.scheduler)
    decided = replay(log)
    assert len(decided) == 7 and all(set(d) == {"pipeline"} for d in decided)  # 6 steps, the 7th asked ahead
    assert decided[-1]["pipeline"] == plans.scheduler.decision("pipeline").to_dict()
    if schedule in ("osprey", "auto"):
        events = list(log["events"])
        i = next(k for k, e in enumerate(events) if e[0] == "observe")
        axis, step, rows = events[i][1:]
        events[i] = ("observe", axis, step, [r[:4] + (r[4] * 50.0,) for r in rows])
        with pytest.raises(PlanError, match="replay diverged at request .*axis 'pipeline'"):
            replay({**log, "events": events})
