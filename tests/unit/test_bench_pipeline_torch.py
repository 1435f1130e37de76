"""bench pipeline's torch-runtime figures are medians over runs in fresh processes: one run's pairs can sit
several percent off the next's, so no single run decides the target."""

import pytest

from pdml_ray.bench.pipeline_torch import PAIRS, combine_runs


def _pair(cls: str, ratio: float, step_s: float, faster: int) -> dict:
    return {"torch_class": cls, "rounds": 41, "median_ratio": ratio, "median_step_s": step_s * ratio,
            "torch_class_median_step_s": step_s, "best_step_ratio": ratio, "ratio_of_medians": ratio,
            "rounds_method_faster": faster, "rounds_baseline_faster": 41 - faster, "grad_max_abs_diff": 0.0}


def _run(ratio: float, control: float, blocked_s: float, changed: int) -> dict:
    planning = {name: {"median_blocked_s": blocked_s, "median_plan_s": 1e-4, "median_step_s": 0.02,
                       "plans_changed": changed if name == "osprey" else 0,
                       "median_blocked_s_when_changed": 4e-4 if changed and name == "osprey" else None,
                       "blocked_over_step": blocked_s / 0.02, "plan_over_step": 1e-4 / 0.02}
                for name in (*PAIRS, "osprey")}
    control_pair = {k: v for k, v in _pair("Schedule1F1B", control, 0.02, 20).items() if k != "grad_max_abs_diff"}
    return {"pairs": {name: _pair(cls, ratio, 0.02, 10) for name, cls in PAIRS.items()}, "control": control_pair,
            "torch_loop": {**control_pair, "median_ratio": ratio + 0.04},
            "planning": planning, "load_changed_plan_s": 3e-4, "threads_per_rank": 1, "osprey_chosen": "1f1b"}


def test_the_figures_are_medians_over_runs_and_one_bad_run_does_not_decide_the_target():
    section = combine_runs([_run(0.99, 1.00, 2e-5, 0), _run(1.074, 0.98, 6e-5, 2), _run(1.01, 1.03, 3e-5, 0)])
    pair = section["pairs"]["torch-1f1b"]
    assert pair["median_ratio"] == pytest.approx(1.01) and pair["per_run_median_ratio"] == [0.99, 1.074, 1.01]
    assert pair["runs"] == 3 and pair["rounds_method_faster"] == 30
    assert section["control"]["median_ratio"] == pytest.approx(1.00)
    assert section["torch_loop"]["per_run_median_ratio"] == pytest.approx([1.03, 1.114, 1.05])
    target = section["targets"]["torch_runtime_step_over_torch_class"]
    assert target["met"] and target["value"] == pytest.approx(1.01) and "1.074" in target["basis"]
    osprey = section["planning"]["osprey"]
    assert osprey["plans_changed"] == 2 and osprey["median_blocked_s"] == pytest.approx(3e-5)
    assert osprey["median_blocked_s_when_changed"] == pytest.approx(4e-4)
    assert section["targets"]["torch_runtime_planning_over_step"]["value"] == pytest.approx(3e-5 / 0.02)


def test_a_pair_slower_in_most_runs_misses_the_target():
    section = combine_runs([_run(1.05, 1.0, 2e-5, 0), _run(1.04, 1.0, 2e-5, 0), _run(0.99, 1.0, 2e-5, 0)])
    assert not section["targets"]["torch_runtime_step_over_torch_class"]["met"]
