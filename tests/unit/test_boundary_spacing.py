"""Decision boundaries spaced in seconds (``PDMLConfig.decision_interval_min_s``), over a real two-rank
gloo group: rank 0 stretches the interval from its measured step time, every rank skips the same
boundaries, and decisions and reports still arrive as without it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.torch_exec import run_local_ranks
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.boundary_reports import MAX_ROWS, capacity
from pdml_ray.train.boundary_spacing import SETTLING_BOUNDARIES, max_stretch, stretch
from pdml_ray.train.context import PDMLContext

STEPS, INTERVAL, BATCH = 64, 2, 32


def test_the_stretch_is_the_fewest_intervals_that_last_the_bound_within_the_gathers_capacity():
    assert stretch(0.0, 0.01, 5) == 1 and stretch(2.0, float("nan"), 5) == 1 and stretch(2.0, 0.0, 5) == 1
    assert stretch(2.0, 0.1, 5) == 4        # 4 intervals of 0.5 s
    assert stretch(2.0, 0.4, 5) == 1        # one interval already lasts 2 s
    assert stretch(2.0, 0.125, 4) == 4      # exactly 2 s: not 5
    assert stretch(600.0, 0.01, 5) == max_stretch(5) == MAX_ROWS // 10
    assert max_stretch(MAX_ROWS) == 1
    # an interval's reports at the widest stretch fit the gather with room for late ones, as at m = 1
    assert capacity(5 * max_stretch(5)) >= 2 * 5 * max_stretch(5) - 5


def test_the_bound_is_checked():
    with pytest.raises(ConfigError, match="decision_interval_min_s"):
        PDMLConfig(decision_interval_min_s=-1.0)
    with pytest.raises(ConfigError, match="decision_interval_min_s"):
        PDMLConfig(decision_interval_min_s=float("inf"))


def _rank(rank: int, world_size: int, min_s: float, sample: bool) -> dict:
    config = PDMLConfig(decision_interval=INTERVAL, decision_interval_min_s=min_s, report_via="boundary",
                        sample_priority=SamplePriorityConfig() if sample else None,
                        node_priority=NodePriorityConfig(
                            global_batch_size=BATCH, warmup_steps=0, hysteresis=0.0, ema_alpha=1.0,
                            emulated_speeds=[1.0, 0.5], emulated_per_sample_s=2e-4))  # ~7 and ~13 ms of compute a step
    scheduler = Scheduler(config, world_size) if rank == 0 else None
    client = None
    if scheduler is not None:
        scheduler.register(1, "B")  # rank 1 has no client: its reports reach the scheduler in the gather only
        client = SchedulerClient(LocalSchedulerTransport(scheduler))
    ctx = PDMLContext(config, rank, world_size, torch.device("cpu"), "A" if rank == 0 else "B", client)
    torch.manual_seed(0)
    model = ctx.prepare_model(torch.nn.Linear(4, 2))
    x, y = torch.randn(STEPS * BATCH, 4), torch.randint(0, 2, (STEPS * BATCH,))
    stretches = []
    for batch in ctx.epoch(0, len(x)):
        idx = torch.as_tensor(batch.indices)
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[idx]), y[idx], reduction="none")).backward()
        model.zero_grad()
        stretches.append(ctx.boundary_stretch)
    result = {"adopted": [[s, v, list(b)] for s, v, b in ctx.adopted], "boundaries": ctx.boundaries,
              "stretches": stretches, "steps": ctx.global_step}
    if scheduler is not None:
        t = scheduler.telemetry()
        result["reported"] = sorted({(int(w), int(s)) for w, s in zip(t["worker_id"], t["step"])})
    return result


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")
def test_boundaries_a_bound_apart_are_skipped_alike_on_every_rank_and_decisions_still_come():
    zero, one = run_local_ranks(_rank, 2, 0.1, False)  # ~10 ms steps: about 5 intervals of 2 steps a boundary
    assert zero["steps"] == one["steps"] == STEPS
    # rank 1 learns each stretch in the boundary's broadcast: the same boundaries, the same decisions
    assert zero["stretches"] == one["stretches"] and zero["boundaries"] == one["boundaries"]
    assert zero["adopted"] == one["adopted"] and zero["adopted"], zero["adopted"]
    assert max(zero["stretches"]) > 1 and zero["boundaries"] < STEPS // INTERVAL // 2, zero
    # the first SETTLING_BOUNDARIES boundaries (steps 0, 2, 4, 6) keep every interval: the first shares come as fast
    assert set(zero["stretches"][:SETTLING_BOUNDARIES * INTERVAL]) == {1}, zero["stretches"]
    # the node shares still follow the speeds (rank 1 emulates half the speed)
    assert all(sizes[1] < sizes[0] for _, _, sizes in zero["adopted"]), zero["adopted"]
    # every step's report up to the last boundary reached the scheduler, rank 1's through the gather
    for worker in (0, 1):
        steps = [s for w, s in zero["reported"] if w == worker]
        assert steps == list(range(len(steps))) and len(steps) >= STEPS // 2, (worker, steps)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")
def test_without_the_bound_or_with_sample_priorities_every_interval_has_its_boundary():
    for zero, one in (run_local_ranks(_rank, 2, 0.0, False), run_local_ranks(_rank, 2, 0.1, True)):
        assert set(zero["stretches"]) == set(one["stretches"]) == {1}
        assert zero["boundaries"] == one["boundaries"] == STEPS // INTERVAL


def _resumed(rank: int, world_size: int, directory: str) -> dict:
    config = PDMLConfig(decision_interval=INTERVAL, decision_interval_min_s=0.1, node_priority=NodePriorityConfig(
        global_batch_size=BATCH, emulated_per_sample_s=2e-4))

    def context() -> PDMLContext:
        client = SchedulerClient(LocalSchedulerTransport(Scheduler(config, world_size)))
        return PDMLContext(config, rank, world_size, torch.device("cpu"), "A", client)

    def train(ctx: PDMLContext, epoch: int, steps: int) -> list[int]:
        model = ctx.prepare_model(torch.nn.Linear(4, 2))
        x, y = torch.randn(STEPS * BATCH, 4), torch.randint(0, 2, (STEPS * BATCH,))
        at, seen = [], ctx.boundaries  # the steps at which a boundary ran (before the step's batch is cut)
        for batch in ctx.epoch(epoch, len(x)):
            at += [batch.step] * (ctx.boundaries - seen)
            seen = ctx.boundaries
            idx = torch.as_tensor(batch.indices)
            with ctx.step(batch) as step:
                step.loss(F.cross_entropy(model(x[idx]), y[idx], reduction="none")).backward()
            if ctx.global_step == steps:
                break
        return at

    first = context()
    at = train(first, 0, 21)
    first.save_scheduler_state(directory)
    second = context()
    assert second.load_scheduler_state(directory)
    return {"at": at, "next": first._next_boundary, "resumed_next": second._next_boundary,
            "resumed_at": train(second, second.start_epoch, 40)}


def test_a_resumed_run_keeps_the_next_boundary_its_checkpoint_named(tmp_path):
    (run,) = run_local_ranks(_resumed, 1, str(tmp_path))
    assert run["next"] > 21 and run["next"] % INTERVAL == 0 and run["next"] - run["at"][-1] > INTERVAL, run
    # the resumed run meets at that step first (decisions adopted there take effect at the saved horizon)
    assert run["resumed_next"] == run["next"] and run["resumed_at"][0] == run["next"], run
