"""Benchmarks are not tests: each runs once here with --quick as a smoke check of the product path
(its JSON has the issue's figures and the standard fields). No timing is asserted. The benchmarks that
join the cluster in RAY_ADDRESS (as a submitted job does) share one local cluster here: each start of a
private one costs seconds."""

import json
import os
import subprocess
import sys

import pytest

STANDARD = {"command", "git_rev", "git_dirty", "machine", "emulated"}
FIGURES = {
    "hetero": {"speeds", "rates", "comm_s", "ideal_speedup", "ideal_speedup_no_comm", "speedup_vs_uniform",
               "efficiency", "efficiency_pdml_rates", "extras_s", "loss_uniform", "loss_pdml",
               "scheduler_overhead_fraction", "worker_overhead_fraction", "scheduler_cpu_fraction", "compute", "targets"},
    "sampling": {"steps_to_target_uniform", "steps_to_target_priority", "step_ratio", "time_to_target_uniform_s",
                 "time_to_target_priority_s", "time_ratio", "target_metric", "control", "sumtree", "ablations",
                 "arms", "ratio_direction", "continuity_overhead_fraction", "continuity_cost_at_1e7", "targets"},
    "pipeline": {"grid", "ray", "planning", "torch_runtime"},
    "scheduler": {"workers", "reports_per_s", "decision_latency_p50_s", "decision_latency_p99_s", "rss_mb_start",
                  "rss_mb_end", "plain_class", "targets"},
    "stragglers": {"workers", "stragglers", "straggler_model", "policies", "time_to_target_ratio_vs_sync",
                   "step_time_ratios", "targets"},
    "gradients": {"workers", "stragglers", "straggler_model", "arms", "target_loss", "targets", "priority_arms",
                  "best_priority_arm", "async_time_to_target_vs_sync"},
}
EXTRA = {"hetero": ["--steps", "24", "--workers", "2", "--speeds", "1,0.4", "--global-batch", "256", "--hidden", "256"],
         "sampling": ["--repetitions", "1", "--dataset-size", "5000", "--max-steps", "150", "--lr", "0.003",
                      "--il-steps", "50"],
         "pipeline": ["--steps", "5", "--ray-steps", "3", "--seeds", "2", "--scenarios", "homogeneous"],
         "scheduler": ["--workers", "16", "--duration", "3", "--report-via", "node"],
         "stragglers": ["--workers", "4", "--steps", "8", "--policies", "sync,gc-fr,pgc-cr", "--per-partition-ms", "20",
                        "--no-death-run"],
         "gradients": ["--workers", "4", "--steps", "6", "--fixed-sweep", "0", "--per-partition-ms", "10"]}

JOINS = {"hetero", "pipeline", "gradients", "stragglers"}  # and p3, below
"""Benchmarks that join the cluster in RAY_ADDRESS (``bench.common.init_ray``); the others start their own."""


RAY_CPUS = 8
"""Logical CPUs of the module's cluster (``ray_address`` in conftest.py): the pipeline section's 3 x 2
stage actors take one each."""


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_benchmark_quick_run_writes_its_figures(name, tmp_path, request):
    out = tmp_path / f"{name}.json"
    # the cluster first: starting it sets this process's RAY_AUTH_MODE, which the benchmark needs to join it
    joined = {"RAY_ADDRESS": request.getfixturevalue("ray_address")} if name in JOINS else {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", **joined}
    run = subprocess.run([sys.executable, "-m", "pdml_ray.cli", "bench", name, "--quick", "--json", str(out), *EXTRA[name]],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert STANDARD | FIGURES[name] <= set(result), sorted(set(result))
    assert result["machine"]["cores"] >= 1 and result["emulated"]
    if name == "sampling":
        assert set(result["ablations"]) == {"priority_beta1", "priority_no_correction", "rho_loss_holdout",
                                            "rho_loss_corrected", "label_balanced", "focal"}
        assert {"annealed", "selective_backprop", "rho_loss"} <= set(result["arms"]) and result["best_label_free"]
        assert all({"steps_to_target", "time_to_target_s", "step_ratio", "time_ratio", "reached"} <= set(a)
                   for a in result["ablations"].values())
        from pdml_ray.config import ContinuityConfig  # the benchmark checks continuity at the library default

        assert result["continuity_check_interval"] == ContinuityConfig().check_interval
        assert result["continuity_cost_at_1e7"]["n"] == 10_000_000
        assert result["control"]["budget_time_ratio"] > 0  # the switch's cost over the control's whole budget
        assert all({"value", "target", "met"} <= set(t) for t in result["targets"].values())
    if name == "stragglers":  # the one pgc policy run, against the one plain code run, the pair named
        assert set(result["step_time_ratios"]) == {"pgc_cr_over_gc_fr"}
    if name == "gradients":  # the headline: top-K by priority against its controls, async apart
        assert {"topk-fixed", "topk-tuned"} == set(result["priority_arms"])
        assert {"over_ignore_stragglers", "over_topk_random", "over_sync"} == set(result["priority_arms"]["topk-tuned"])
    if name == "pipeline":
        case = result["grid"][0]
        assert {"stages", "replicas", "microbatches", "profile", "makespan_s", "bubble_fraction", "lower_bound_s",
                "osprey_over_1f1b", "osprey_over_lower_bound", "warmup_steps", "memory_violations"} <= set(case)
        assert {"osprey_over_1f1b_weighted", "osprey_over_1f1b_worst", "seeds"} <= set(case)
        assert len(case["seeds"]) == 2 and "1f1b-weighted" in result["schedules"]  # EXTRA's --seeds 2
        # the scenario section ran, on the one scenario EXTRA names (each scenario's records and targets are unit-tested)
        scenarios = result["scenarios"]
        assert scenarios["records"] and {r["scenario"] for r in scenarios["records"]} == {"homogeneous"}, scenarios
        assert "homogeneous_osprey_over_best_static" in result["targets"]
        assert all({"value", "target", "met", "basis"} <= set(t) for t in result["targets"].values())
        ray_run = result["ray"]
        assert "osprey_over_static" in ray_run, ray_run
        assert ray_run["compute"] == result["compute"] == "sleep" and "EMULATED" in result["emulated"]["compute"]
        assert {"osprey_over_1f1b", "osprey_over_1f1b_weighted"} <= set(ray_run["paired"])
        assert result["machine"]["device"] == "cpu" and result["devices"]["grid"].startswith("none")
        torch_runtime = result["torch_runtime"]  # registry plans on torch's own runtime, gradients as torch's class's
        assert {"torch-1f1b", "torch-gpipe"} == set(torch_runtime["pairs"]), torch_runtime
        assert all(p["grad_max_abs_diff"] <= 1e-5 for p in torch_runtime["pairs"].values())
        assert {"torch_runtime_step_over_torch_class", "torch_runtime_planning_over_step"} <= set(result["targets"])


P3_ROW = {"runtime", "settings", "compute_ms", "comm_over_compute", "iteration_s", "p3_over_fifo", "p3_over_layer_fifo",
          "p3_over_bucketed", "bound_s", "emulated"}


def test_bench_p3_quick_writes_rows_for_both_runtimes(tmp_path, ray_address):
    """``bench p3``: both runtimes (the parameter server on Ray actors, the all-reduce runtime in Ray Train), one
    row per runtime and comm/compute ratio with the issue's figures."""
    out = tmp_path / "p3.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ray_address}
    # one row per runtime (the library's slicing, 150 ms of emulated compute, comm = compute, 2 measured steps): the smoke
    # check of the product path; every setting of the grid is the benchmark's own business
    run = subprocess.run([sys.executable, "-m", "pdml_ray.cli", "bench", "p3", "--quick", "--ratios", "1", "--settings",
                          "library", "--compute-ms", "150", "--steps", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert STANDARD | {"runs", "targets", "simulation", "model"} <= set(result), sorted(result)
    assert result["machine"]["cores"] >= 1 and "EMULATED" in result["emulated"]["bandwidth"]
    rows = {(r["runtime"], r["settings"], r["compute_ms"], r["comm_over_compute"]): r for r in result["runs"]}
    assert set(rows) == {(rt, "library", 150.0, 1.0) for rt in ("parameter-server", "all-reduce")}
    for row in rows.values():
        assert P3_ROW <= set(row) and set(row["iteration_s"]) == {"p3", "fifo", "layer-fifo", "bucketed"}
        assert "EMULATED" in row["emulated"]
    assert {"ps_p3_over_fifo_at_comm_eq_compute", "ps_p3_over_best_baseline_worst",
            "allreduce_p3_over_best_baseline_worst"} <= set(result["targets"])
    assert all({"value", "target", "met"} <= set(t) for t in result["targets"].values())
