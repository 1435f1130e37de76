"""The discrete-event simulator: costs, transfer, lower bound, memory accounting, determinism, CLI."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.config import PipelineConfig
from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.plan import Action, Kind, Plan, unit_time_grid
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator, compare_in_simulation

F, B = Kind.FORWARD, Kind.BACKWARD


def test_single_microbatch_chain_with_transfer() -> None:
    # One micro-batch through S stages and back: S forwards, S backwards, 2 (S - 1) transfers.
    S = 4
    profile = ClusterProfile.build(S, 1, forward_s=1.0, backward_s=2.0, transfer_s=0.5)
    result = PipelineSimulator(profile).run_step(make_schedule("1f1b", stages=S, replicas=1, microbatches=1).plan(0))
    assert result.makespan_s == pytest.approx(S * 3.0 + 2 * (S - 1) * 0.5)
    assert result.lower_bound_s == pytest.approx(result.makespan_s)


def test_measured_latency_is_work_over_speed() -> None:
    profile = ClusterProfile.build(2, 2, speeds=((1.0, 0.5), (0.25, 1.0)))
    result = PipelineSimulator(profile).run_step(make_schedule("gpipe", stages=2, replicas=2, microbatches=4).plan(0))
    by_key = {(x.stage, x.replica, x.kind): x.latency_s for x in result.measurements}
    assert by_key[(0, 1, F)] == pytest.approx(2.0) and by_key[(0, 1, B)] == pytest.approx(4.0)
    assert by_key[(1, 0, F)] == pytest.approx(4.0) and by_key[(1, 1, B)] == pytest.approx(2.0)


def test_lower_bound_is_tight_for_1f1b_on_uniform_replicas() -> None:
    # (M/R + S - 1)(f + b): the stage bound of the last stage.
    profile = ClusterProfile.build(8, 4)
    result = PipelineSimulator(profile).run_step(make_schedule("1f1b", stages=8, replicas=4, microbatches=64).plan(0))
    assert result.lower_bound_s == pytest.approx((64 / 4 + 7) * 3.0)
    assert result.makespan_s == pytest.approx(result.lower_bound_s)


def test_lower_bound_counts_aggregate_speed_and_whole_microbatches() -> None:
    # Stage 1 has speeds 1 and 0.5: 10 micro-batches x 3 s / 1.5 = 20 s if work were divisible; in
    # whole micro-batches the best split is 7 (21 s) + 3 (18 s), so 21 s, plus head 1 s and tail 2 s.
    profile = ClusterProfile.build(2, 2, speeds=((1.0, 1.0), (1.0, 0.5)))
    assert PipelineSimulator(profile).lower_bound(0, 10) == pytest.approx(1.0 + 21.0 + 2.0)
    # 9 micro-batches: 6 (18 s) + 3 (18 s) = 18 s, equal to the divisible 27 / 1.5.
    assert PipelineSimulator(profile).lower_bound(0, 9) == pytest.approx(1.0 + 18.0 + 2.0)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 10), st.sampled_from(["homogeneous", "heterogeneous", "noisy"]),
       st.sampled_from(["gpipe", "1f1b", "critical-path", "osprey"]), st.floats(0.0, 0.5))
def test_no_schedule_beats_the_lower_bound(stages: int, replicas: int, microbatches: int, profile_name: str,
                                           name: str, transfer: float) -> None:
    profile = ClusterProfile.build(stages, replicas, profile=profile_name, transfer_s=transfer, seed=microbatches)
    sim = PipelineSimulator(profile, seed=2)
    scheduler = make_schedule(name, stages=stages, replicas=replicas, microbatches=microbatches)
    for step in range(3):
        result = sim.run_step(scheduler.plan(step), step)
        assert result.makespan_s >= result.lower_bound_s * (1 - 1e-9)
        assert all(0.0 <= b < 1.0 for b in result.bubble_fraction)
        scheduler.observe(result.measurements)


def test_noise_is_seeded_and_shared_by_all_schedules() -> None:
    profile = ClusterProfile.build(3, 2, profile="noisy")
    a, b = PipelineSimulator(profile, seed=4), PipelineSimulator(profile, seed=4)
    assert (a.work(3, 8) == b.work(3, 8)).all() and a._speeds(5) == b._speeds(5)
    assert not (a.work(3, 8) == PipelineSimulator(profile, seed=5).work(3, 8)).all()
    plan = make_schedule("1f1b", stages=3, replicas=2, microbatches=8).plan(0)
    assert a.run_step(plan, 3).makespan_s == b.run_step(plan, 3).makespan_s


def test_memory_budget_violations_are_counted() -> None:
    # GPipe without a plan limit holds all 6 activations; the hardware budget is 2 per replica.
    profile = ClusterProfile.build(2, 1, memory_limit=2)
    result = PipelineSimulator(profile).run_step(make_schedule("gpipe", stages=2, replicas=1, microbatches=6).plan(0))
    assert result.memory_violations == 2 and result.peak_memory[(0, 0)] == 6
    ok = make_schedule("gpipe", stages=2, replicas=1, microbatches=6, config=PipelineConfig(memory_limit=2)).plan(0)
    assert PipelineSimulator(profile).run_step(ok).memory_violations == 0


def test_profile_checks_shapes() -> None:
    with pytest.raises(ConfigError, match="speeds\\[1\\] needs 2 positive entries \\(one per replica of stage 1"):
        ClusterProfile.build(2, 2, speeds=((1.0, 1.0), (1.0,)))
    with pytest.raises(ConfigError, match="unknown profile 'bursty'; use one of"):
        ClusterProfile.build(2, 2, profile="bursty")
    with pytest.raises(ConfigError, match="one entry per stage \\(2\\), got lengths .*'forward_s': 3"):
        ClusterProfile(stages=2, replicas=(1, 1), forward_s=(1.0, 1.0, 1.0), backward_s=(2.0, 2.0), speeds=((1.0,), (1.0,)))


def test_compare_in_simulation_reports_every_schedule() -> None:
    profile = ClusterProfile.build(3, 2, profile="heterogeneous", memory_limit=3)
    out = compare_in_simulation(profile, 6, ["gpipe", "1f1b", "osprey", "auto"], steps=3,
                                config=PipelineConfig(memory_limit=3))
    assert set(out) == {"gpipe", "1f1b", "osprey", "auto"}
    for r in out.values():
        assert len(r["makespan_s"]) == 3 and r["memory_violations"] == 0
    assert out["auto"]["decision"]["choice"] in ("static", "osprey") and out["auto"]["decision"]["reason"]
    # Decisions come back as plain dicts (the records' to_dict), {} for a static schedule.
    assert out["gpipe"]["decision"] == {} and out["1f1b"]["decision"] == {}
    assert out["osprey"]["decision"]["kind"] == "adaptive" and len(out["osprey"]["decision"]["lane_period_s"]) == 2


def test_simulate_cli_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    from pdml_ray.cli import main

    assert main(["simulate", "--stages", "3", "--replicas", "2", "--microbatches", "6", "--steps", "3",
                 "--slow", "1:0=0.5", "--show-plan", "--schedules", "1f1b,osprey"]) == 0
    out = capsys.readouterr().out
    assert "1f1b" in out and "osprey" in out and "x lower_bound" in out
    assert "[[1.0, 1.0], [0.5, 1.0], [1.0, 1.0]]" in out  # the --slow override reached the profile
    assert "step  0: s0r0F0" in out  # --show-plan grid
    assert main(["simulate", "--stages", "2", "--replicas", "2", "--microbatches", "6", "--steps", "3",
                 "--slow", "1:0=0.5", "--schedules", "1f1b,1f1b-weighted"]) == 0
    out = capsys.readouterr().out
    assert "x 1f1b-weighted" in out and "1f1b-weighted  " in out


def test_dataclass_replace_keeps_profile_valid() -> None:
    profile = ClusterProfile.build(2, 1)
    with pytest.raises(ConfigError):
        dataclasses.replace(profile, speeds=((1.0,), (0.0,)))


# ---- the benchmark's statistics (pdml_ray.bench.pipeline, no Ray) ---------------------------------

def test_paired_ratio_stats_counts_rounds_and_sign_test() -> None:
    from pdml_ray.bench.common import paired_ratio_stats
    from pdml_ray.errors import UsageError

    baseline = [1.0, 1.0, 2.0, 1.0, 1.0]
    method = [0.8, 1.1, 1.0, 0.9, 1.0]  # ratios 0.8, 1.1, 0.5, 0.9, 1.0
    p = paired_ratio_stats(baseline, method)
    assert p["ratios"] == pytest.approx([0.8, 1.1, 0.5, 0.9, 1.0])
    assert p["median_ratio"] == pytest.approx(0.9) and p["min_ratio"] == 0.5 and p["max_ratio"] == pytest.approx(1.1)
    assert (p["rounds"], p["rounds_method_faster"], p["rounds_baseline_faster"], p["rounds_tied"]) == (5, 3, 1, 1)
    assert p["sign_test_p"] == pytest.approx(2 * 5 / 16)  # 3 wins vs 1 loss: P(X <= 1) = 5/16, two-sided
    assert p["ratio_of_medians"] == pytest.approx(1.0)  # medians 1.0 / 1.0: not the median of the pairs
    # Ten rounds all won: p = 2 / 2**10.
    assert paired_ratio_stats([1.0] * 10, [0.9] * 10)["sign_test_p"] == pytest.approx(2 / 1024)
    with pytest.raises(UsageError, match="same number"):
        paired_ratio_stats([1.0, 2.0], [1.0])


def _case(profile: str, seed: int, over_1f1b: float, over_weighted: float, over_lb: float, replicas: int = 4) -> dict:
    names = ("1f1b", "1f1b-weighted", "osprey")
    return {"stages": 4, "replicas": replicas, "microbatches": 16, "profile": profile, "seed": seed,
            "makespan_s": {n: 1.0 for n in names}, "bubble_fraction": {n: 0.1 for n in names}, "lower_bound_s": 0.9,
            "lower_bound_any_s": 0.8, "not_applicable": {}, "best_static": {"name": "1f1b", "makespan_s": 1.0},
            "osprey_over_1f1b": over_1f1b, "osprey_over_1f1b_weighted": over_weighted,
            "osprey_over_best_static": over_weighted,
            "osprey_over_lower_bound": over_lb, "warmup_steps": seed, "memory_violations": {n: 0 for n in names},
            "peak_activations": {n: 4 for n in names}, "auto": {"schedule": "osprey", "reason": ""}}


def test_grid_cells_summarise_seeds_and_targets_say_their_basis() -> None:
    from pdml_ray.bench.pipeline import check_targets, summarize_cell

    hetero = summarize_cell([_case("heterogeneous", s, r, r + 0.1, 1.1) for s, r in enumerate([0.7, 0.82, 0.75])])
    assert hetero["osprey_over_1f1b"] == pytest.approx(0.75) and hetero["osprey_over_1f1b_worst"] == pytest.approx(0.82)
    assert hetero["osprey_over_1f1b_weighted"] == pytest.approx(0.85)
    assert hetero["osprey_over_1f1b_per_seed"] == [0.7, 0.82, 0.75] and hetero["seeds"] == [0, 1, 2]
    assert hetero["warmup_steps"] == 2  # the worst seed
    homo = summarize_cell([_case("homogeneous", s, 1.0, 1.0, 1.0) for s in range(3)])
    targets = check_targets([hetero, homo], num_seeds=3)
    t = targets["heterogeneous_osprey_over_1f1b"]
    # Judged on the median over seeds (0.75 <= 0.8: met); the worst seed (0.82) is reported beside it.
    assert (t["value"], t["target"], t["met"]) == (pytest.approx(0.75), 0.8, True)
    assert t["worst_seed_value"] == pytest.approx(0.82) and t["met_every_seed"] is False
    assert "median over 3 seeds" in t["basis"] and t["worst_cell"] == "4x4x16 heterogeneous"
    for name, target in targets.items():  # the format the CLI's --check reads
        assert {"value", "target", "met"} <= set(target), name
        assert isinstance(target["met"], bool) and isinstance(target["value"], float)
    assert targets["memory_violations"]["met"] and targets["warmup_steps"]["value"] == 2.0


def test_bench_pipeline_refuses_cuda_and_records_no_device(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from pdml_ray.cli import main

    assert main(["bench", "pipeline", "--device", "cuda", "--no-ray"]) == 2
    assert "--device cuda is not supported" in capsys.readouterr().err
    out = tmp_path / "p.json"
    assert main(["bench", "pipeline", "--quick", "--no-ray", "--no-torch-runtime", "--seeds", "1", "--steps", "4",
                 "--scenarios", "homogeneous,memory-cap", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["machine"]["device"] == "none" and result["devices"]["ray"] == "not run"
    assert result["devices"]["torch_runtime"] == "not run" and result["torch_runtime"]["skipped"]
    assert "osprey_over_1f1b_weighted" in result["grid"][0] and result["seeds"] == [0]
    assert "1f1b-weighted" in result["grid"][0]["makespan_s"]
    # torch's schedules run beside the project's; the best static order is picked from both.
    cell = result["grid"][0]
    assert {"torch-1f1b", "torch-zbv"} <= set(cell["makespan_s"]) | set(cell["not_applicable"])
    assert cell["best_static"]["makespan_s"] == min(v for n, v in cell["makespan_s"].items()
                                                    if n not in ("osprey", "auto"))
    assert result["torch_orders"]["adjustments"].keys() == {"Schedule1F1B", "ScheduleDualPipeV"}
    # One record per scenario cell, with the figures the issue names; their targets join --check's.
    records = result["scenarios"]["records"]
    assert [r["scenario"] for r in records] == ["homogeneous"] * 3 + ["memory-cap"] * 3
    assert {"best_static", "osprey_over_best_static", "osprey_over_best_static_worst", "osprey_over_lower_bound",
            "memory_violations"} <= set(records[0])
    assert {"homogeneous_osprey_over_best_static", "memory_cap_osprey_violations"} <= set(result["targets"])


# ---- split backward (F, I, W) and virtual stages ---------------------------------------------------

def split(plan: Plan) -> Plan:
    """``plan`` with every full backward B replaced by its input gradient I and, at once, its weight gradient W."""
    def halves(a: Action) -> tuple[Action, ...]:
        if a.kind is not B:
            return (a,)
        return (Action(a.stage, a.replica, Kind.INPUT, a.microbatch), Action(a.stage, a.replica, Kind.WEIGHT, a.microbatch))
    return dataclasses.replace(plan, orders={key: tuple(x for a in acts for x in halves(a))
                                             for key, acts in plan.orders.items()})


def test_issue_figures_at_8_stages_16_microbatches() -> None:
    # F = I = W = 1 (full B = 2), no transfer: 1F1B takes (M + S - 1) (F + B) = 23 x 3 = 69.
    S, M = 8, 16
    profile = ClusterProfile.build(S, 1, forward_s=1.0, backward_s=2.0)
    one_f_one_b = make_schedule("1f1b", stages=S, replicas=1, microbatches=M).plan(0)
    full = PipelineSimulator(profile).run_step(one_f_one_b)
    assert full.makespan_s == pytest.approx(69.0) and full.lower_bound_s == pytest.approx(69.0)
    # The same order with B split into I then W at once: the previous stage gets its gradient after I
    # (1), not B (2), so the backward chain runs faster: 62, which the unit-time grid (all actions 1)
    # counts independently. The bound of the split action set is the zero-bubble figure: the last
    # stage's head (7) plus 16 x 3 = 55.
    zb_bound = PipelineSimulator(profile).run_step(split(one_f_one_b))
    assert zb_bound.makespan_s == pytest.approx(len(unit_time_grid(split(one_f_one_b)))) == pytest.approx(62.0)
    assert zb_bound.lower_bound_s == pytest.approx(55.0)
    measured = {(x.kind, x.stage, x.microbatch): x.latency_s for x in zb_bound.measurements}
    assert measured[(Kind.INPUT, 3, 5)] == measured[(Kind.WEIGHT, 3, 5)] == pytest.approx(1.0)
    # Two chunks per rank as a V (rank k holds stages k and 15 - k), each chunk half the work: the
    # bound is rank 7's head (stage 7 at 7 x 0.5) plus its 16 x 2 x 1.5 = 48: ZBV's and DualPipeV's 51.5.
    v_profile = ClusterProfile.build(2 * S, 1, forward_s=0.5, backward_s=1.0)
    ranks = tuple(range(S)) + tuple(reversed(range(S)))
    assert PipelineSimulator(v_profile).lower_bound(0, M, split_backward=True, stage_rank=ranks) == pytest.approx(51.5)
    # Without the V (one chunk per rank, 16 ranks) the bound is the deeper pipeline's: 15 x 0.5 + 24.
    assert PipelineSimulator(v_profile).lower_bound(0, M, split_backward=True) == pytest.approx(31.5)


def test_the_simulator_runs_a_virtual_stage_plan() -> None:
    # Four stages as a V on two ranks, one micro-batch, F = I = W = 1: the chain F F F F I I I I, then
    # rank 0's W3 and W0 after its I0 (at 8): 10.
    a = Action.parse
    orders = {(0, 0): (a("s0r0F0"), a("s3r0F0"), a("s3r0I0"), a("s0r0I0"), a("s3r0W0"), a("s0r0W0")),
              (1, 0): (a("s1r0F0"), a("s2r0F0"), a("s2r0I0"), a("s1r0I0"), a("s2r0W0"), a("s1r0W0"))}
    plan = Plan(num_stages=4, replicas=(1,) * 4, num_microbatches=1, orders=orders, stage_rank=(0, 1, 1, 0))
    result = PipelineSimulator(ClusterProfile.build(4, 1, forward_s=1.0, backward_s=2.0)).run_step(plan)
    assert result.makespan_s == pytest.approx(10.0)
    assert result.peak_memory == {(0, 0): 2, (1, 0): 2} and len(result.bubble_fraction) == 2
    assert result.bubble_fraction[0] == pytest.approx(1 - 6 / 10)


def test_weight_fraction_splits_the_backward() -> None:
    profile = ClusterProfile.build(2, 1, backward_s=2.0, weight_fraction=0.25)
    w = PipelineSimulator(profile).work(0, 3)
    assert w[:, 2, :] == pytest.approx(1.5) and w[:, 3, :] == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="weight_fraction must be in"):
        ClusterProfile.build(2, 1, weight_fraction=1.5)
