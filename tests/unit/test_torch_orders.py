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
