"""``pdml-ray bench p3 --quick`` as a smoke check of the product path (both runtimes: the parameter
server on Ray actors, the all-reduce runtime in Ray Train): its JSON has the standard fields and one
row per runtime and comm/compute ratio with the issue's figures. No timing is asserted."""

import json
import os
import subprocess
import sys

STANDARD = {"command", "git_rev", "git_dirty", "machine", "emulated"}
ROW = {"runtime", "settings", "compute_ms", "comm_over_compute", "iteration_s", "p3_over_fifo", "p3_over_layer_fifo",
       "p3_over_bucketed", "bound_s", "emulated"}


def test_bench_p3_quick_writes_rows_for_both_runtimes(tmp_path):
    out = tmp_path / "p3.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
        assert ROW <= set(row) and set(row["iteration_s"]) == {"p3", "fifo", "layer-fifo", "bucketed"}
        assert "EMULATED" in row["emulated"]
    assert {"ps_p3_over_fifo_at_comm_eq_compute", "ps_p3_over_best_baseline_worst",
            "allreduce_p3_over_best_baseline_worst"} <= set(result["targets"])
    assert all({"value", "target", "met"} <= set(t) for t in result["targets"].values())
