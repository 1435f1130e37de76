"""Osprey (EMA, lanes, re-weighting, memory, warm start), the auto rule, replay, and their configs."""

from __future__ import annotations

import json

import pytest

from pdml_ray.config import OspreyConfig, PipelineConfig
from pdml_ray.errors import ConfigError, PlanError, StateError
from pdml_ray.pipeline.auto import AutoDecision, AutoSchedule, latency_dispersion
from pdml_ray.pipeline.osprey import OspreyDecision, OspreySchedule
from pdml_ray.pipeline.plan import Kind, Measurement, validate
from pdml_ray.pipeline.registry import PROJECT_SCHEDULES, make_schedule
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator, simulate_schedule

F, B = Kind.FORWARD, Kind.BACKWARD


def test_ema_first_measurement_replaces_prior_then_blends() -> None:
    o = OspreySchedule(stages=1, replicas=(2,), microbatches=2,
                        config=OspreyConfig(ema_alpha=0.25, stale_relax=0.5, jump_threshold=0.0))
    o.observe([Measurement(0, 0, F, 0, 2.0), Measurement(0, 0, F, 1, 4.0), Measurement(0, 0, B, 0, 6.0),
               Measurement(0, 1, F, 0, 1.0), Measurement(0, 1, B, 0, 2.0)])
    # (F, B, I, W): a measured full backward splits in the estimates' I : W proportion (half and half).
    assert o.est[0][0] == (3.0, 6.0, 3.0, 3.0) and o.est[0][1] == (1.0, 2.0, 1.0, 1.0)
    o.observe([Measurement(0, 0, F, 0, 7.0), Measurement(0, 0, B, 0, 10.0)])
    assert o.est[0][0][:2] == (0.75 * 3.0 + 0.25 * 7.0, 0.75 * 6.0 + 0.25 * 10.0)
    # Replica 1 was not measured: it moves half way (stale_relax) towards the stage's fastest estimate.
    assert o.est[0][1][:2] == (1.0, 2.0)  # it is the fastest, so it stays
    # The estimates live in the project's EMA; ``est`` is its python-float view.
    assert o.latency.values.tolist() == [list(c) for c in o.est[0]] and o.latency.measured.all()


def test_stale_relax_writes_into_the_ema() -> None:
    o = OspreySchedule(stages=2, replicas=(2, 1), microbatches=2,
                        config=OspreyConfig(ema_alpha=0.5, stale_relax=0.5, jump_threshold=0.0))
    o.observe([Measurement(0, 0, F, 0, 2.0), Measurement(0, 0, B, 0, 4.0), Measurement(0, 1, F, 0, 4.0),
               Measurement(0, 1, B, 0, 8.0), Measurement(1, 0, F, 0, 1.0), Measurement(1, 0, B, 0, 2.0)])
    o.observe([Measurement(0, 0, F, 0, 2.0), Measurement(0, 0, B, 0, 4.0)])  # replica (0, 1) idle this step
    assert o.est[0][1][:2] == (4.0 + 0.5 * (2.0 - 4.0), 8.0 + 0.5 * (4.0 - 8.0))
    assert o.latency.values[1].tolist()[:2] == [3.0, 6.0]  # slot of (stage 0, replica 1)
    # Stage 1's slot follows stage 0's two; the next measurement blends from the relaxed value.
    o.observe([Measurement(0, 1, F, 0, 5.0), Measurement(0, 1, B, 0, 10.0)])
    assert o.est[0][1][:2] == (0.5 * 3.0 + 0.5 * 5.0, 0.5 * 6.0 + 0.5 * 10.0) and o.est[1][0][:2] == (1.0, 2.0)


def test_slow_replica_gets_fewer_microbatches_and_weights_follow_speed() -> None:
    profile = ClusterProfile.build(3, 2, speeds=((1.0, 1.0), (1.0, 0.5), (1.0, 1.0)))
    o = OspreySchedule(stages=3, replicas=(2, 2, 2), microbatches=12, config=PipelineConfig(memory_limit=3))
    simulate_schedule(o, PipelineSimulator(profile), 2)
    plan = o.plan(2)  # stage 1 is rank 1's first chunk whatever the plan's layout
    counts = [sum(1 for (k, _), rep in plan.placement.items() if k == 1 and rep == r) for r in range(2)]
    assert counts[1] < counts[0] and sum(counts) == 12
    # Lane 0 = the fast replicas, period 3 s; lane 1 holds the slow one, period 6 s: shares 2/3 and 1/3.
    assert o.last_decision.lane_period_s == pytest.approx((3.0, 6.0))
    assert o.weights == pytest.approx([2 / 3, 1 / 3]) and o.last_decision.weights == tuple(o.weights)
    assert o.last_decision.lane_bottleneck_stage[1] == 1 and o.last_decision.bottleneck_stage == 1
    assert o.last_decision.chosen in dict(o.last_decision.predicted_makespan_s)


def test_a_level_shift_of_every_kind_replaces_the_estimate_and_split_measurements_keep_b_as_i_plus_w() -> None:
    o = OspreySchedule(stages=1, replicas=(1,), microbatches=2, config=OspreyConfig(ema_alpha=0.25, jump_threshold=0.25))
    o.observe([Measurement(0, 0, F, 0, 1.0), Measurement(0, 0, B, 0, 2.0)])
    o.observe([Measurement(0, 0, F, 0, 2.0), Measurement(0, 0, B, 0, 4.0)])  # every kind doubled: the replica slowed
    assert o.est[0][0] == (2.0, 4.0, 2.0, 2.0)
    o.observe([Measurement(0, 0, F, 0, 2.2), Measurement(0, 0, B, 0, 6.0)])  # B alone 50% up, F within 25%: blended
    assert o.est[0][0] == pytest.approx((0.75 * 2.0 + 0.25 * 2.2, 0.75 * 4.0 + 0.25 * 6.0, 2.25, 2.25))
    o.observe([Measurement(0, 0, Kind.INPUT, 0, 1.0), Measurement(0, 0, Kind.WEIGHT, 0, 3.0)])  # opposite ways
    assert o.est[0][0][1:] == pytest.approx((4.375, 0.75 * 2.25 + 0.25 * 1.0, 0.75 * 2.25 + 0.25 * 3.0))  # B = I + W


def test_momentum_and_rebalance_threshold() -> None:
    o = OspreySchedule(stages=1, replicas=(2,), microbatches=4,
                        config=OspreyConfig(momentum=0.5, rebalance_threshold=0.0, jump_threshold=0.0))
    o.observe([Measurement(0, 0, F, 0, 1.0), Measurement(0, 0, B, 0, 2.0),
               Measurement(0, 1, F, 0, 1.0), Measurement(0, 1, B, 0, 2.0)])
    assert o.weights == pytest.approx([0.5, 0.5])  # first adaptive step: straight to target
    o.observe([Measurement(0, 1, F, 0, 5.0), Measurement(0, 1, B, 0, 10.0)])  # replica 1 now 3x slower (EMA 0.5)
    # EMA: replica 1 period = 0.5 * 3 + 0.5 * 15 = 9 s; target shares (1/3, 1/9) normalised = (0.75, 0.25).
    assert o.weights == pytest.approx([0.5 * 0.5 + 0.5 * 0.75, 0.5 * 0.5 + 0.5 * 0.25])
    sticky = OspreySchedule(stages=1, replicas=(2,), microbatches=4, config=OspreyConfig(rebalance_threshold=0.2))
    sticky.observe([Measurement(0, 0, F, 0, 1.0), Measurement(0, 1, F, 0, 1.0)])
    sticky.observe([Measurement(0, 1, F, 0, 1.3)])
    assert sticky.weights == pytest.approx([0.5, 0.5]) and sticky.last_decision.rebalanced is False


def test_warm_start_is_the_static_plan_with_reordering() -> None:
    o = make_schedule("osprey", stages=3, replicas=2, microbatches=6)
    static = make_schedule("1f1b", stages=3, replicas=2, microbatches=6).plan(0)
    plan = o.plan(0)
    assert plan.orders == static.orders and plan.reorder is True and plan.schedule == "osprey"


def test_osprey_beats_1f1b_on_heterogeneous_replicas() -> None:
    profile = ClusterProfile.build(4, 4, profile="heterogeneous", memory_limit=4)
    config = PipelineConfig(memory_limit=4)
    res = {}
    for name in ("1f1b", "osprey"):
        s = make_schedule(name, stages=4, replicas=4, microbatches=16, config=config)
        res[name] = [r.makespan_s for r in simulate_schedule(s, PipelineSimulator(profile), 4, check=True)]
    assert res["osprey"][0] == res["1f1b"][0]  # warm start
    assert res["osprey"][-1] < 0.8 * res["1f1b"][-1]


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_memory_limit_never_exceeded(limit: int) -> None:
    profile = ClusterProfile.build(4, 2, profile="noisy", speeds=((1, 1), (1, 0.4), (1, 1), (0.7, 1)), memory_limit=limit)
    for name in ("osprey", "auto"):
        s = make_schedule(name, stages=4, replicas=2, microbatches=12, config=PipelineConfig(memory_limit=limit))
        for r in simulate_schedule(s, PipelineSimulator(profile, seed=3), 4, check=True):
            assert r.memory_violations == 0
            assert max(r.peak_activation.values()) <= limit  # in activations of a whole stage (a chunk holds half)


def test_auto_chooses_static_on_a_uniform_cluster() -> None:
    auto = AutoSchedule(stages=4, replicas=(2,) * 4, microbatches=16)
    assert auto.last_decision.choice == "static" and "no measurements" in auto.last_decision.reason
    simulate_schedule(auto, PipelineSimulator(ClusterProfile.build(4, 2)), 2)
    d = auto.last_decision
    assert d.choice == "static" and d.dispersion == 0.0
    assert d.predicted_static_bubble == pytest.approx(3 / 11)  # 1F1B, 8 micro-batches per lane
    assert auto.plan(2).schedule == "1f1b"


def test_auto_chooses_osprey_on_dispersion_and_on_bubble() -> None:
    hetero = AutoSchedule(stages=4, replicas=(2,) * 4, microbatches=16)
    simulate_schedule(hetero, PipelineSimulator(ClusterProfile.build(4, 2, speeds=((1, 1), (1, 0.5), (1, 1), (1, 1)))), 2)
    assert hetero.last_decision.choice == "osprey" and "dispersion" in hetero.last_decision.reason
    assert hetero.plan(2).schedule == "osprey"
    # One replica per stage, 8 stages, 4 micro-batches: 1F1B's bubble is 7/11 > 30%.
    bubbly = AutoSchedule(stages=8, replicas=(1,) * 8, microbatches=4)
    simulate_schedule(bubbly, PipelineSimulator(ClusterProfile.build(8, 1)), 2)
    assert bubbly.last_decision.choice == "osprey" and "bubble" in bubbly.last_decision.reason
    assert bubbly.last_decision.predicted_static_bubble == pytest.approx(7 / 11)


def test_latency_dispersion_is_coefficient_of_variation() -> None:
    assert latency_dispersion([[[1.0, 2.0], [2.0, 4.0]], [[1.0, 1.0]]]) == pytest.approx(1.5 / 4.5)


def test_configs_reject_bad_values_with_fixes() -> None:
    with pytest.raises(ConfigError, match=r"osprey.ema_alpha must be a number in \(0, 1\]"):
        OspreyConfig(ema_alpha=0.0)
    with pytest.raises(ConfigError, match="osprey.momentum"):
        OspreyConfig(momentum=1.0)
    with pytest.raises(ConfigError, match="pipeline.schedule must be one of"):
        PipelineConfig(schedule="pipedream")
    with pytest.raises(ConfigError, match="pipeline.memory_limit must be an integer in \\[1,"):
        PipelineConfig(memory_limit=0)
    with pytest.raises(ConfigError, match=r"pipeline.stage_costs\[1\]"):
        PipelineConfig(stage_costs=[(1.0, 2.0), (1.0, -1.0)])
    assert PipelineConfig().auto_dispersion_threshold == 0.05 and PipelineConfig().auto_bubble_threshold == 0.30
    validate(make_schedule("osprey", stages=2, replicas=1, microbatches=2).plan(0))


def _decisions_over_a_run(replicas: tuple[int, ...]) -> list:
    """Every record osprey and auto hold over a short run: warm start, after observe, after plan."""
    config = PipelineConfig(memory_limit=3)
    profile = ClusterProfile.build(3, replicas, profile="noisy", memory_limit=3)
    out = []
    for name in ("osprey", "auto"):
        s = make_schedule(name, stages=3, replicas=replicas, microbatches=7, config=config)
        sim = PipelineSimulator(profile, seed=1)
        out.append(s.last_decision)
        for step in range(3):
            result = sim.run_step(s.plan(step), step)
            out.append(s.last_decision)
            s.observe(result.measurements)
            out.append(s.last_decision)
    return out


@pytest.mark.parametrize("replicas", [(2, 2, 2), (1, 2, 1)])  # with lanes, and without (unequal counts)
def test_decision_records_round_trip_through_json(replicas: tuple[int, ...]) -> None:
    import dataclasses

    records = _decisions_over_a_run(replicas)
    assert {type(r) for r in records} == {OspreyDecision, AutoDecision}
    for r in records:
        assert type(r).from_dict(json.loads(json.dumps(r.to_dict()))) == r
        for value in (getattr(r, f.name) for f in dataclasses.fields(r)):
            assert not isinstance(value, (list, dict))  # frozen all the way down: tuples
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(r, dataclasses.fields(r)[0].name, None)
    osprey = [r for r in records if isinstance(r, OspreyDecision)]
    assert osprey[0].to_dict() == {"kind": "warm-start", "warm_start": "1f1b"}
    planned = osprey[-2].to_dict()  # after an adaptive plan: every group, in the documented order
    lanes = ["lanes", "lane_period_s", "lane_bottleneck_stage", "target_weights", "weights", "rebalanced"]
    assert list(planned) == ["kind", "step", "stage_loads_s", "bottleneck_stage"] + (lanes if replicas[0] == 2 else []) + \
        ["predicted_makespan_s", "chosen", "lane_microbatches", "predicted_busy_s"]
    # (rank, replica, kind, seconds) per executor of the plan issued and kind it runs, on the estimates
    executors = [(k, r, kind) for k, n in enumerate(replicas) for r in range(n) for kind in ("F", "B")]
    entries = [tuple(x[:3]) for x in planned["predicted_busy_s"]]  # an executor left without work has none
    assert entries and set(entries) <= set(executors) and len(set(entries)) == len(entries)
    assert all(x[3] > 0 for x in planned["predicted_busy_s"])
    assert (planned["lane_microbatches"] is None) == (replicas[1] != replicas[0])
    assert list(planned["predicted_makespan_s"])[-1] == "warm-start" and planned["chosen"] in planned["predicted_makespan_s"]
    auto = [r for r in records if isinstance(r, AutoDecision)]
    assert list(auto[0].to_dict()) == ["choice", "schedule", "reason"]
    assert list(auto[-1].to_dict()) == ["choice", "schedule", "reason", "dispersion", "predicted_static_bubble"]


@pytest.mark.parametrize("name", sorted(PROJECT_SCHEDULES))
def test_every_scheduler_implements_the_whole_protocol(name: str) -> None:
    config = PipelineConfig(memory_limit=2)
    a = make_schedule(name, stages=2, replicas=(2, 1), microbatches=5, config=config)
    sim = PipelineSimulator(ClusterProfile.build(2, (2, 1), profile="heterogeneous", memory_limit=2))
    for step in range(2):
        a.observe(sim.run_step(a.plan(step), step).measurements)
    assert a.name == name
    assert (a.last_decision is None) == (name in ("gpipe", "1f1b", "critical-path"))
    a.tell_sizes(2, [1.0, 0.5, 2.0, 1.0, 0.5])  # told before the state is saved: the state keeps them
    # A fresh scheduler loaded with the state (through JSON) plans exactly the same, decides the same.
    b = make_schedule(name, stages=2, replicas=(2, 1), microbatches=5, config=config)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.plan(2) == a.plan(2) and b.last_decision == a.last_decision




def _any(memory_limit: int) -> PipelineConfig:
    return PipelineConfig(memory_limit=memory_limit, osprey=OspreyConfig(plans="any"))


def test_osprey_warm_starts_from_the_best_static_order_zero_bubble_and_chunks_included() -> None:
    # Homogeneous 4 x 1, 16 micro-batches, F = 1, B = 2: a zero-bubble order of torch's over several chunks
    # is the best static order; osprey, planning a step ahead, runs it from its third step on.
    profile = ClusterProfile.build(4, 1, memory_limit=4)
    statics = {n: PipelineSimulator(profile).run_step(make_schedule(n, stages=4, replicas=1, microbatches=16).plan(0))
               for n in ("1f1b", "torch-zb", "torch-interleaved-zb", "torch-interleaved-zb-3", "torch-interleaved-zb-4",
                         "torch-zbv")}
    best = min(r.makespan_s for r in statics.values())
    assert best < statics["torch-interleaved-zb"].makespan_s < statics["torch-zb"].makespan_s < statics["1f1b"].makespan_s
    o = make_schedule("osprey", stages=4, replicas=1, microbatches=16, config=_any(4))
    sim = PipelineSimulator(profile)
    ahead = o.plan(0)
    for step in range(4):  # plan step + 1 before step's measurements arrive (the one-step-old view)
        current, ahead = ahead, o.plan(step + 1)
        result = sim.run_step(current, step)
        o.observe(result.measurements)
    assert result.makespan_s == pytest.approx(best) and result.memory_violations == 0
    assert o.est[0][0] == pytest.approx((1.0, 2.0, 1.0, 1.0))  # chunks measured at half, mapped back whole
    only_fb = make_schedule("osprey", stages=4, replicas=1, microbatches=16, config=PipelineConfig(memory_limit=4))
    for step in range(3):
        plan = only_fb.plan(step)
        assert not plan.split_backward and plan.num_stages == 4  # what the Ray-actor runtime runs
        only_fb.observe(sim.run_step(plan, step).measurements)


def test_osprey_routes_zero_bubble_orders_over_its_lanes_away_from_a_slow_replica() -> None:
    profile = ClusterProfile.build(4, 4, speeds=((1,) * 4, (1,) * 4, (1,) * 4, (0.5, 1, 1, 1)), memory_limit=4)
    o = make_schedule("osprey", stages=4, replicas=4, microbatches=16, config=_any(4))
    results = simulate_schedule(o, PipelineSimulator(profile), 3)
    plan = o.plan(3)
    predicted = dict(o.last_decision.predicted_makespan_s)
    on_lanes = {x: t for x, t in predicted.items() if x.endswith("@lanes")}  # torch's orders re-cut onto the lanes
    chosen = o.last_decision.chosen
    assert on_lanes and chosen.startswith("osprey-zb") and chosen.endswith(("-v", "-loop"))  # its own lanes
    assert predicted[o.last_decision.chosen] <= min(on_lanes.values())  # its own lane orders: at least as fast
    chunks = plan.num_stages // 4
    slow_share = sum(1 for (k, _), r in plan.placement.items() if plan.stage_rank[k] == 3 and r == 0)
    assert chunks >= 2 and slow_share < chunks * 16 // 4  # each chunk: fewer than round robin's 4 micro-batches
    best_torch = min(on_lanes, key=lambda x: on_lanes[x]).removesuffix("@lanes")
    round_robin = PipelineSimulator(profile).run_step(make_schedule(best_torch, stages=4, replicas=4, microbatches=16).plan(0))
    assert results[-1].makespan_s < 0.8 * round_robin.makespan_s
    assert results[-1].memory_violations == 0


def test_osprey_predicts_with_the_configured_transfer_time() -> None:
    with pytest.raises(ConfigError, match="transfer_s"):
        PipelineConfig(transfer_s=-1.0)
    predicted = {}
    for transfer in (0.0, 0.5):
        o = make_schedule("osprey", stages=4, replicas=1, microbatches=8,
                           config=PipelineConfig(memory_limit=4, transfer_s=transfer, osprey=OspreyConfig(plans="any")))
        o.observe(PipelineSimulator(ClusterProfile.build(4, 1)).run_step(o.plan(0)).measurements)
        o.plan(1)
        predicted[transfer] = dict(o.last_decision.predicted_makespan_s)
    # torch's 1F1B on 4 ranks: 2 x 3 transfers on the chain, none hidden at 8 micro-batches' warm-up and cool-down.
    assert predicted[0.5]["torch-1f1b"] >= predicted[0.0]["torch-1f1b"] + 6 * 0.5


def test_uneven_micro_batches_are_divided_out_equal_ones_are_not() -> None:
    def est_after(costs: list[float]) -> tuple[float, float]:
        # 3 stages, stage 0 with two replicas: micro-batches 0, 1 on replica 0, 2, 3 on replica 1.
        o = OspreySchedule(stages=3, replicas=(2, 1, 1), microbatches=4, config=OspreyConfig(jump_threshold=0.0))
        o.observe([Measurement(k, m // 2 if k == 0 else 0, kind, m, c * (1.0 if kind is F else 2.0))
                   for k in range(3) for kind in (F, Kind.BACKWARD) for m, c in enumerate(costs)])
        return o.est[0][0][0], o.est[0][1][0]

    # Micro-batch 1 three times as long at every stage: divided out, replica 0 is not taken for slow.
    assert est_after([1.0, 3.0, 1.0, 1.0]) == pytest.approx((1.5, 1.5))
    # Nearly equal micro-batches (factors spread under UNEVEN_SPREAD): plain means per replica.
    assert est_after([1.0, 1.1, 0.9, 1.0]) == pytest.approx((1.05, 0.95))
