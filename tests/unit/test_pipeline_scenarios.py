"""Non-stationary scenarios in the simulator and bench pipeline's records and targets over them."""

from __future__ import annotations

import numpy as np
import pytest

from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.plan import Action, Kind, Plan
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.pipeline.scenarios import SCENARIOS, ScenarioConfig, memory_cap, scenario_profile
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator, SlowWindow

F, B = Kind.FORWARD, Kind.BACKWARD


def test_drift_slows_one_replica_for_its_window_then_recovers() -> None:
    profile = scenario_profile("drift", 4, 2, seed=3, steps=12)
    (window,) = profile.slow_windows
    assert (window.factor, window.start_step, window.steps) == (0.5, 3, 6)
    sim = PipelineSimulator(profile, seed=3)
    for step in (2, 3, 8, 9):
        speeds = sim._speeds(step)
        slow = speeds[window.stage][window.replica]
        assert slow == (0.5 if 3 <= step < 9 else 1.0)
        assert sum(s for row in speeds for s in row) == 8 - (0.5 if 3 <= step < 9 else 0.0)
    plan = make_schedule("1f1b", stages=4, replicas=2, microbatches=8).plan(0)
    assert sim.run_step(plan, 5).makespan_s > sim.run_step(plan, 2).makespan_s == sim.run_step(plan, 9).makespan_s


def test_uneven_costs_are_long_tailed_quadratic_in_length_and_the_same_for_every_schedule() -> None:
    profile = scenario_profile("uneven", 2, 1, seed=0, steps=4)
    sim = PipelineSimulator(profile, seed=0)
    lengths = sim.sequence_lengths(1, 4000)
    assert lengths.mean() == pytest.approx(1.0, abs=0.05) and lengths.max() > 5 * np.median(lengths)
    work = sim.work(1, 4000)
    # F at stage 0 = 1 s x ((1 - a) L + a L^2), a = 0.5.
    assert np.allclose(work[0, 0], 0.5 * lengths + 0.5 * lengths**2)
    assert np.array_equal(sim.sequence_lengths(1, 16), PipelineSimulator(profile, seed=0).sequence_lengths(1, 16))


def test_a_late_transfer_delays_its_consumer_by_its_own_seconds() -> None:
    # 2 stages, 1 micro-batch, F = 1, B = 2: the chain F0 F1 B1 B0 with two transfers between ranks.
    plan = make_schedule("1f1b", stages=2, replicas=1, microbatches=1).plan(0)
    on_time = PipelineSimulator(ClusterProfile.build(2, 1, transfer_s=0.5)).run_step(plan)
    assert on_time.makespan_s == pytest.approx(6 + 2 * 0.5)
    late = ClusterProfile.build(2, 1, transfer_s=0.5, transfer_delay_p=1.0, transfer_delay_s=3.0)
    assert PipelineSimulator(late).run_step(plan).makespan_s == pytest.approx(6 + 2 * 3.5)
    assert scenario_profile("comm-delay", 4, 1, seed=0, steps=4).transfer_delay_p == 0.1


def test_memory_is_counted_in_activation_units_of_each_micro_batchs_length() -> None:
    # One stage, GPipe over 3 micro-batches: all three activations held at once, sizes L_0 + L_1 + L_2.
    plan = Plan(1, (1,), 3, {(0, 0): tuple(Action(0, 0, k, m) for k in (F, B) for m in range(3))})
    profile = ClusterProfile.build(1, 1, seq_len_sigma=0.8, memory_limit=2)
    sim = PipelineSimulator(profile, seed=1)
    result = sim.run_step(plan, 0)
    assert result.peak_memory[(0, 0)] == 3
    assert result.peak_activation[(0, 0)] == pytest.approx(sim.sequence_lengths(0, 3).sum())
    assert result.memory_violations == int(sim.sequence_lengths(0, 3).sum() > 2)


def test_memory_cap_is_below_what_1f1b_and_torch_orders_hold() -> None:
    assert memory_cap(8, ScenarioConfig()) == 4 and memory_cap(2, ScenarioConfig()) == 2
    profile = scenario_profile("memory-cap", 8, 1, seed=0, steps=2)
    assert profile.memory_limit == 4 and profile.seq_len_sigma == 0.8
    result = PipelineSimulator(profile).run_step(make_schedule("torch-1f1b", stages=8, replicas=1, microbatches=16).plan(0))
    assert result.memory_violations >= 4  # ranks 0..3 hold 8..5 activations of mean size one


def test_scenario_names_and_knobs_are_checked() -> None:
    assert SCENARIOS == ("homogeneous", "drift", "uneven", "comm-delay", "memory-cap", "slow-stage")
    with pytest.raises(ConfigError, match="valid names"):
        scenario_profile("sunny", 2, 1, seed=0, steps=2)
    with pytest.raises(ConfigError, match="drift_factor"):
        ScenarioConfig(drift_factor=0.0)
    with pytest.raises(ConfigError, match="slow window"):
        ClusterProfile.build(2, 1, slow_windows=(SlowWindow(5, 0, 0.5, 0, 1),))


def _run(seed: int, osprey: float, best: float, violations: int = 0) -> dict:
    names = ("osprey", "1f1b", "torch-zb")
    return {"seed": seed, "makespan_s": {"osprey": osprey, "1f1b": 2 * best, "torch-zb": best},
            "lower_bound_s": {n: 0.5 for n in names}, "memory_violations": {"osprey": violations, "1f1b": 1, "torch-zb": 2},
            "not_applicable": {"torch-dualpipev": "needs more micro-batches"}, "best_static": "torch-zb",
            "osprey_over_best_static": osprey / best, "osprey_over_lower_bound": osprey / 0.5}


def test_scenario_records_and_targets() -> None:
    from pdml_ray.bench.pipeline_scenarios import cell_record, check_targets, summarize

    drift = [cell_record("drift", (4, 4, 16), [_run(s, o, 1.0) for s, o in enumerate([0.8, 0.9, 0.7])]),
             cell_record("drift", (8, 4, 16), [_run(s, o, 1.0) for s, o in enumerate([0.96, 0.7, 0.75])])]
    assert drift[0]["osprey_over_best_static"] == pytest.approx(0.8) and drift[0]["osprey_over_best_static_worst"] == 0.9
    assert drift[0]["best_static"] == {"name": "torch-zb", "makespan_s": 1.0, "per_seed": ["torch-zb"] * 3}
    assert drift[0]["memory_violations"] == {"osprey": 0, "1f1b": 3, "torch-zb": 6}
    homo = [cell_record("homogeneous", (4, 1, 16), [_run(s, 1.02, 1.0) for s in range(3)])]
    cap = [cell_record("memory-cap", (4, 4, 16), [_run(s, 1.0, 1.0, violations=s) for s in range(3)])]
    summary = summarize(drift + homo + cap)
    assert summary["drift"]["median"] == pytest.approx(0.775) and summary["drift"]["worst_cell"] == pytest.approx(0.8)
    assert summary["drift"]["worst_seed"] == 0.96 and summary["drift"]["worst_cell_shape"] == "4x4x16"
    targets = check_targets(drift + homo + cap)
    assert targets["drift_osprey_over_best_static_median"]["met"]
    assert targets["drift_osprey_over_best_static_worst_cell"]["met"]  # 0.8 <= 0.95
    assert not targets["homogeneous_osprey_over_best_static"]["met"]  # 1.02 > 1.01
    assert targets["memory_cap_osprey_violations"]["value"] == 3.0 and not targets["memory_cap_osprey_violations"]["met"]
    assert "uneven_osprey_over_best_static_median" not in targets  # no uneven cells were run
    # the bound: lower_bound_any_s 0.5 over the best static 1.0 in every cell; a cell at its bound is no target's
    assert targets["drift_osprey_over_best_static_median"]["lower_bound_value"] == pytest.approx(0.5)
    assert targets["drift_osprey_over_best_static_worst_cell"]["attainable"]
    tight = {n: 1.0 for n in ("osprey", "1f1b", "torch-zb")}
    at_bound = cell_record("drift", (4, 1, 16), [{**_run(s, 1.0, 1.0), "lower_bound_s": tight} for s in range(3)])
    capped = check_targets(drift + [at_bound])["drift_osprey_over_best_static_worst_cell"]
    assert capped["lower_bound_value"] == pytest.approx(1.0) and not capped["attainable"] and not capped["met"]
