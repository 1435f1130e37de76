"""Osprey's zero-bubble lanes on several chunks per rank (``pdml_ray.pipeline.chunked``), on the simulator."""

from __future__ import annotations

import dataclasses

import pytest

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.chunked import ChunkedLanes, chunked_order, lanes_to_plan, stage_ranks
from pdml_ray.pipeline.plan import Kind
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator
from pdml_ray.pipeline.torch_orders import torch_plan

UNIT = (1.0, 1.0, 1.0)  # F, I, W seconds of a whole stage (the profile's F = 1, B = 2, half of it W)


def _profile(ranks: int, cap: float | None, slow: int | None = None) -> ClusterProfile:
    speeds = tuple((0.5,) if k == slow else (1.0,) for k in range(ranks))
    return dataclasses.replace(ClusterProfile.build(ranks, 1, memory_limit=cap), forward_s=(1.0,) * ranks,
                               backward_s=(2.0,) * ranks, speeds=speeds)


def _one_lane(orders: list, ranks: int, n: int, layout: str, chunks: int = 2):  # type: ignore[no-untyped-def]
    return lanes_to_plan([orders], [list(range(n))], [[0]] * ranks, chunks=chunks, layout=layout)


def test_layouts_map_virtual_stages_to_ranks() -> None:
    assert stage_ranks(4, 2, "loop") == (0, 1, 2, 3, 0, 1, 2, 3)
    assert stage_ranks(4, 2, "v") == (0, 1, 2, 3, 3, 2, 1, 0)
    with pytest.raises(PlanError, match="layout"):
        stage_ranks(4, 2, "zigzag")
    with pytest.raises(PlanError, match=">= 1"):
        chunked_order([UNIT] * 4, 0)


@pytest.mark.parametrize("layout", ["loop", "v"])
@pytest.mark.parametrize("n,slow", [(3, None), (5, 0), (9, None), (9, 3)])
def test_its_prediction_is_the_simulated_step_and_it_stays_within_the_cap(layout: str, n: int, slow: int | None) -> None:
    costs = [tuple(x / (0.5 if k == slow else 1.0) for x in UNIT) for k in range(8)]
    orders, predicted = chunked_order(costs, n, layout=layout, cap=8)
    plan = _one_lane(orders, 8, n, layout)  # validated: every action once, no deadlock in order
    result = PipelineSimulator(_profile(8, 8, slow)).run_step(plan)
    assert result.makespan_s == pytest.approx(predicted)
    assert result.memory_violations == 0 and max(result.peak_activation.values()) <= 8


@pytest.mark.parametrize("layout", ["loop", "v"])
def test_more_chunks_shorten_fill_and_drain_and_their_transfers_are_counted(layout: str) -> None:
    # 8 ranks, 16 micro-batches, F = I = W = 1 s per stage: 2, 3 and 4 chunks take 51.5, 50.33 and 49.75 s
    # (torch's interleaved zero bubble at those counts, each at its bound); the prediction is the simulated
    # step at every count. With 0.5 s per transfer between ranks, four chunks are no longer the fastest.
    spans = {}
    for chunks in (2, 3, 4):
        orders, spans[chunks] = chunked_order([UNIT] * 8, 16, chunks=chunks, layout=layout)
        plan = _one_lane(orders, 8, 16, layout, chunks)
        assert plan.num_stages == 8 * chunks
        assert PipelineSimulator(_profile(8, None)).run_step(plan).makespan_s == pytest.approx(spans[chunks])
    assert spans[4] == pytest.approx(49.75) and spans[3] == pytest.approx(50 + 1 / 3) and spans[2] == pytest.approx(51.5)
    late = {c: chunked_order([UNIT] * 8, 16, chunks=c, layout=layout, transfer_s=0.5)[1] for c in (2, 3, 4)}
    assert min(late, key=lambda c: late[c]) != 4
    assert ChunkedLanes(chunks=4).prefix == "osprey-zb4" and ChunkedLanes().prefix == "osprey-zb"


def test_a_lane_of_nine_fits_the_cap_where_torchs_orders_do_not_or_are_slower() -> None:
    # 8 ranks, 9 micro-batches, a limit of 8 activations: torch's interleaved zero bubble runs faster but
    # over the limit; its V-shaped order keeps within it at 33 s; this order keeps within it faster.
    sim = PipelineSimulator(_profile(8, 8))
    zb = sim.run_step(torch_plan("ScheduleInterleavedZeroBubble", 8, 9, 2))
    zbv = sim.run_step(torch_plan("ScheduleZBVZeroBubble", 8, 9, 2))
    orders, predicted = chunked_order([UNIT] * 8, 9, layout="v", cap=8)
    assert zb.memory_violations > 0 and zbv.memory_violations == 0
    assert predicted < zbv.makespan_s
    uncapped = chunked_order([UNIT] * 8, 9, layout="v")[1]
    assert uncapped <= predicted  # the cap costs time, never saves it


@pytest.mark.parametrize("layout", ["loop", "v"])
@pytest.mark.parametrize("cap", [1, 2])
def test_the_bankers_test_lets_every_micro_batch_finish_at_a_tight_cap(layout: str, cap: int) -> None:
    # At a cap of one or two micro-batches a plain "held + 1 <= cap" fills rank 0 with first chunks and
    # stalls (their second chunks there never fit); the banker's test admits a first chunk only where
    # the held micro-batches can still run their later chunks. chunked_order raises if it stalls.
    orders, _ = chunked_order([UNIT] * 4, 12, layout=layout, cap=cap)
    for rank, order in enumerate(orders):
        held = 0
        for v, kind, _ in order:
            held += 1 if kind is Kind.FORWARD else -1 if kind is Kind.WEIGHT else 0
            assert held <= 2 * cap, (rank, v)  # two chunks, each half a stage's activation
    plan = _one_lane(orders, 4, 12, layout)
    assert PipelineSimulator(_profile(4, cap)).run_step(plan).memory_violations == 0


def test_lanes_move_micro_batches_off_the_lane_predicted_last() -> None:
    # 4 lanes, lane 0's replica of rank 0 at half speed: the counts start at the speed shares (9, 9, 9, 5 of 32)
    # and the plan predicted by the simulator beats torch's orders re-cut onto the same lanes.
    slow = [tuple(2 * x for x in UNIT)] + [UNIT] * 7
    lanes = ChunkedLanes(cap=8)
    members = [[0, 1, 2, 3]] * 8
    plans = lanes.plans([slow, [UNIT] * 8, [UNIT] * 8, [UNIT] * 8], [5, 9, 9, 9], members)
    assert set(plans) == {"osprey-zb-loop", "osprey-zb-v"}
    speeds = ((0.5, 1.0, 1.0, 1.0),) + ((1.0,) * 4,) * 7
    profile = dataclasses.replace(ClusterProfile.build(8, 4, memory_limit=8), forward_s=(1.0,) * 8,
                                  backward_s=(2.0,) * 8, speeds=speeds)
    sim = PipelineSimulator(profile)
    ours = min(sim.run_step(p).makespan_s for p in plans.values())
    assert all(sim.run_step(p).memory_violations == 0 for p in plans.values())
    from pdml_ray.pipeline.torch_orders import lanes_plan

    ids = [list(range(0, 5)), list(range(5, 14)), list(range(14, 23)), list(range(23, 32))]
    theirs = []
    for cls in ("ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble"):
        result = sim.run_step(lanes_plan(cls, 8, ids, members, 2))
        theirs.append(result.makespan_s if result.memory_violations == 0 else float("inf"))
    assert ours < min(theirs)
    assert ours < sim.run_step(make_schedule("torch-zbv", stages=8, replicas=4, microbatches=32).plan(0)).makespan_s


@pytest.mark.parametrize("layout", ["loop", "v"])
def test_micro_batches_of_known_sizes_are_costed_and_held_by_size(layout: str) -> None:
    import numpy as np

    from pdml_ray.pipeline.sizes import KnownSizesSimulator

    rng = np.random.default_rng(3)
    sizes = rng.lognormal(-0.3, 0.8, size=10).clip(0.2, 1.8)  # and one above the cap of 2: the cap rises to it
    sizes[4] = 2.6
    relative = np.stack([sizes * (1.0 + 0.1 * k) for k in range(4)])  # (ranks, micro-batches)
    orders, predicted = chunked_order([UNIT] * 4, 10, layout=layout, cap=2, scale=relative.tolist(),
                                      sizes=sizes.tolist())
    plan = _one_lane(orders, 4, 10, layout)
    profile = dataclasses.replace(_profile(4, 2), forward_s=(1.0,) * 4, backward_s=(2.0,) * 4)
    result = KnownSizesSimulator(profile, sizes, relative).run_step(plan)
    assert result.makespan_s == pytest.approx(predicted)
    assert max(result.peak_activation.values()) <= 2.6 + 1e-9  # the cap, raised to the largest micro-batch
    unsized = chunked_order([UNIT] * 4, 10, layout=layout, cap=2)[1]
    assert predicted != pytest.approx(unsized)  # the sizes were costed


def test_osprey_plans_its_zero_bubble_lanes_on_told_sizes() -> None:
    from pdml_ray.config import OspreyConfig, PipelineConfig
    from pdml_ray.pipeline.scenarios import scenario_profile
    from pdml_ray.pipeline.simulate import simulate_schedule

    profile = scenario_profile("uneven", 4, 2, seed=0, steps=4)
    o = make_schedule("osprey", stages=4, replicas=2, microbatches=16,
                      config=PipelineConfig(memory_limit=profile.memory_limit, osprey=OspreyConfig(plans="any")))
    simulate_schedule(o, PipelineSimulator(profile, 0), 4)
    o.tell_sizes(4, PipelineSimulator(profile, 0).sequence_lengths(4, 16).tolist())
    o.plan(4)
    predicted = dict(o.last_decision.predicted_makespan_s)
    assert {f"osprey-zb{c}-{layout}-sized" for c in ("", "3", "4") for layout in ("v", "loop")} <= set(predicted)
    assert not any(x.startswith("osprey-zb") and "~" in x for x in predicted)  # they chose their own order


def test_a_lane_the_bankers_test_stalls_on_is_scheduled_with_reservations() -> None:
    import numpy as np

    from pdml_ray.pipeline.chunked import _list_schedule
    from pdml_ray.pipeline.sizes import KnownSizesSimulator

    # From osprey's memory-cap scenario (4 x 1, seed 0): a V-shaped lane of uneven sizes at a cap of 2,
    # where the per-rank banker's test admits a micro-batch that another rank then waits on for ever.
    sizes = [0.317, 0.348, 0.515, 0.817, 1.298, 0.902, 0.532, 0.417, 0.34]
    scale = [[0.21, 0.235, 0.39, 0.742, 1.491, 0.857, 0.408, 0.295, 0.229]] * 4
    args = ([UNIT] * 4, 9, 2, stage_ranks(4, 2, "v"), 2, 0.0, scale, sizes)
    assert _list_schedule(*args, banker=True) is None
    orders, predicted = chunked_order([UNIT] * 4, 9, layout="v", cap=2, scale=scale, sizes=sizes)
    plan = lanes_to_plan([orders], [list(range(9))], [[0]] * 4, chunks=2, layout="v", cap=2, sizes=sizes)
    result = KnownSizesSimulator(_profile(4, 2), sizes, np.array(scale)).run_step(plan)
    assert result.makespan_s == pytest.approx(predicted) and result.memory_violations == 0
