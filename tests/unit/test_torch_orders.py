"""torch's own schedule orders as baselines: converted, validated, simulated."""

from __future__ import annotations

import pytest

from pdml_ray.errors import PlanError
from pdml_ray.pipeline import torch_orders
from pdml_ray.pipeline.plan import Kind
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator


def test_torch_zbv_order_converts_validates_and_reaches_the_bound() -> None:
    # 8 ranks x 2 half-cost chunks, 16 micro-batches, F = I = W = 0.5 per chunk: the issue's 51.5.
    plan = torch_orders.torch_zbv_plan(8, 16)
    assert plan.split_backward and plan.stage_rank == tuple(range(8)) + tuple(reversed(range(8)))
    assert {a.kind for acts in plan.orders.values() for a in acts} == {Kind.FORWARD, Kind.INPUT, Kind.WEIGHT}
    result = PipelineSimulator(ClusterProfile.build(16, 1, forward_s=0.5, backward_s=1.0)).run_step(plan)
    assert result.makespan_s == pytest.approx(51.5) and result.lower_bound_s == pytest.approx(51.5)


@pytest.mark.parametrize(("chunks", "makespan"), [(1, 55.0), (2, 51.5)])
def test_torch_interleaved_zero_bubble_matches_the_issue(chunks: int, makespan: float) -> None:
    # One chunk per rank: the issue's zero-bubble 55; two chunks (looped): its 51.5. Both at the bound.
    plan = torch_orders.torch_interleaved_zb_plan(8, 16, chunks)
    assert plan.stage_rank == tuple(k % 8 for k in range(8 * chunks))
    profile = ClusterProfile.build(8 * chunks, 1, forward_s=1.0 / chunks, backward_s=2.0 / chunks)
    result = PipelineSimulator(profile).run_step(plan)
    assert result.makespan_s == pytest.approx(makespan) and result.lower_bound_s == pytest.approx(makespan)


@pytest.mark.parametrize(("chunks", "makespan"), [(1, 69.0), (2, 58.5)])
def test_torch_interleaved_1f1b(chunks: int, makespan: float) -> None:
    # Full backward (B = 2 per rank): one chunk is 1F1B's (M + S - 1) x 3 = 69; two chunks cut the
    # warm-up and cool-down to half a chunk's chain each: 3.5 + 48 + 7 = 58.5, the F + B bound.
    plan = torch_orders.torch_interleaved_1f1b_plan(8, 16, chunks)
    assert plan.kinds == (Kind.FORWARD, Kind.BACKWARD)
    profile = ClusterProfile.build(8 * chunks, 1, forward_s=1.0 / chunks, backward_s=2.0 / chunks)
    result = PipelineSimulator(profile).run_step(plan)
    assert result.makespan_s == pytest.approx(makespan) and result.lower_bound_s == pytest.approx(makespan)


def test_another_torch_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_orders, "SUPPORTED_TORCH", "2.99")
    with pytest.raises(PlanError, match="install torch 2.99"):
        torch_orders.torch_zbv_plan(4, 8)


def _raw_order(cls_name: str, ranks: int, microbatches: int) -> dict[int, list]:
    """torch's own listing of a one-chunk schedule, unconverted (as _get_pipeline_order returns it)."""
    from torch.distributed.pipelining import schedules

    cls = getattr(schedules, cls_name)
    gen = cls.__new__(cls)
    gen._num_stages, gen._n_microbatches = ranks, microbatches
    return gen._get_pipeline_order()


def test_torch_1f1b_listing_fails_validation_and_is_repaired_to_what_its_runtime_runs() -> None:
    # torch 2.13 lists the last rank's forwards as 1..M: F0 missing, F<M> out of range.
    raw = _raw_order("Schedule1F1B", 4, 8)
    assert [a.microbatch_index for a in raw[3] if a is not None and a.computation_type.value == "F"] == list(range(1, 9))
    plan = torch_orders.torch_1f1b_plan(4, 8)
    # Schedule1F1B._step_microbatches: min(M, S - k) warm-up forwards, then B, F alternating, then the Bs left.
    for k in range(4):
        warm = min(8, 4 - k)
        expected = [(Kind.FORWARD, m) for m in range(warm)]
        for m in range(8):
            expected.append((Kind.BACKWARD, m))
            if warm + m < 8:
                expected.append((Kind.FORWARD, warm + m))
        assert [(a.kind, a.microbatch) for a in plan.orders[(k, 0)]] == expected
    assert torch_orders.ADJUSTMENTS["Schedule1F1B"] and not torch_orders.ADJUSTMENTS["ScheduleGPipe"]
    with pytest.raises(PlanError, match="at least as many micro-batches as stages"):
        torch_orders.torch_1f1b_plan(4, 3)  # torch's constructor refuses it too


def test_torch_dualpipev_is_expanded_validated_and_reaches_the_v_bound() -> None:
    plan = torch_orders.torch_dualpipev_plan(8, 16)
    assert plan.kinds == (Kind.FORWARD, Kind.INPUT, Kind.WEIGHT)  # torch's full Bs became I then W
    assert plan.stage_rank == tuple(range(8)) + tuple(reversed(range(8)))
    result = PipelineSimulator(ClusterProfile.build(16, 1, forward_s=0.5, backward_s=1.0)).run_step(plan)
    assert result.makespan_s == pytest.approx(51.5) and result.lower_bound_s == pytest.approx(51.5)
    with pytest.raises(PlanError, match="at least as many micro-batches as stages \\(16"):
        torch_orders.torch_dualpipev_plan(8, 8)


# 8 ranks x 16 micro-batches, F = 1, I = W = 1 (B = 2) per rank, every schedule on the same 8-stage
# profile (c-chunk schedules cut each stage in c): the issue's 69, 55 and 51.5, each at its bound; more
# chunks shorten the fill and drain further (50.33 and 49.75: with no cost per action in the simulator).
TORCH_MAKESPANS = {"torch-gpipe": 69.0, "torch-1f1b": 69.0, "torch-interleaved-1f1b": 58.5,
                   "torch-looped-bfs": 58.5, "torch-zb": 55.0, "torch-interleaved-zb": 51.5,
                   "torch-interleaved-zb-3": 50.0 + 1 / 3, "torch-interleaved-zb-4": 49.75, "torch-zbv": 51.5,
                   "torch-dualpipev": 51.5}


def test_every_torch_schedule_is_registered_and_simulates_on_the_ranks_profile() -> None:
    from pdml_ray.pipeline.registry import TORCH_SCHEDULES, make_schedule

    assert sorted(TORCH_SCHEDULES) == sorted(TORCH_MAKESPANS)
    sim = PipelineSimulator(ClusterProfile.build(8, 1, forward_s=1.0, backward_s=2.0, memory_limit=8))
    for name, makespan in TORCH_MAKESPANS.items():
        scheduler = make_schedule(name, stages=8, replicas=1, microbatches=16)
        plan = scheduler.plan(0)
        assert scheduler.name == plan.schedule == name and scheduler.last_decision is None
        result = sim.run_step(plan)
        assert result.makespan_s == pytest.approx(makespan), name
        assert result.lower_bound_s == pytest.approx(makespan), name
    # GPipe holds all 16 activations per rank (violating 8); two chunks count half a stage's each.
    gpipe = sim.run_step(make_schedule("torch-gpipe", stages=8, replicas=1, microbatches=16).plan(0))
    zbv = sim.run_step(make_schedule("torch-zbv", stages=8, replicas=1, microbatches=16).plan(0))
    assert gpipe.memory_violations == 8 and zbv.memory_violations == 0 and max(zbv.peak_memory.values()) == 16


def test_a_chunked_plan_runs_as_on_a_profile_of_half_stages_with_transfers_between_ranks_only() -> None:
    from pdml_ray.pipeline.registry import make_schedule

    plan = make_schedule("torch-zbv", stages=4, replicas=1, microbatches=8).plan(0)
    chunked = PipelineSimulator(ClusterProfile.build(4, 1, transfer_s=0.25)).run_step(plan)
    halves = PipelineSimulator(ClusterProfile.build(8, 1, forward_s=0.5, backward_s=1.0, transfer_s=0.25)).run_step(plan)
    assert chunked.makespan_s == pytest.approx(halves.makespan_s)
    assert chunked.lower_bound_s == pytest.approx(halves.lower_bound_s)
    assert chunked.lower_bound_s <= chunked.makespan_s
    # The V's turn (stage 3 -> 4, both on rank 3) costs no transfer: a chain of 8 F and 8 I of 0.5 s,
    # W at stage 0, and 2 x 3 transfers between ranks.
    assert chunked.lower_bound_s >= 8 * 0.5 + 8 * 0.5 + 0.5 + 6 * 0.25


def test_torch_schedules_run_one_pipeline_per_replica() -> None:
    from pdml_ray.errors import ConfigError
    from pdml_ray.pipeline.registry import make_schedule

    plan = make_schedule("torch-1f1b", stages=4, replicas=2, microbatches=16).plan(0)
    assert all(plan.replica_of(k, m) == m % 2 for k in range(4) for m in range(16))
    sim = PipelineSimulator(ClusterProfile.build(4, 2))
    single = PipelineSimulator(ClusterProfile.build(4, 1)).run_step(torch_orders.torch_1f1b_plan(4, 8))
    assert sim.run_step(plan).makespan_s == pytest.approx(single.makespan_s)  # two 8-micro-batch pipelines
    with pytest.raises(ConfigError, match="same number of replicas"):
        make_schedule("torch-zbv", stages=2, replicas=[2, 1], microbatches=8)
    with pytest.raises(ConfigError, match="torch-dualpipev at 8 ranks x 4 replicas x 16 micro-batches"):
        make_schedule("torch-dualpipev", stages=8, replicas=4, microbatches=16)
