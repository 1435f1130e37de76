"""What Ray Data input costs per step against the DataLoader path, on train_gpt.py's model.

    python examples/ray_data_ingest.py                     # default size, 3 repeats of each, 2 workers
    python examples/ray_data_ingest.py --json ingest.json

Runs examples/train_gpt.py's loop (its default model: 2 layers, width 128, sequences of 64, global
batch 32, 40 steps) with each input, alternating, ``--repeats`` times, in one Ray session, every
train worker at ``--cpus-per-worker`` CPUs (0.5 by default, so that on 2 cores Ray Data keeps some):
- ``dataloader``: a DataLoader with 2 worker processes over ``ctx.batch_sampler``;
- ``ray``: a Ray Dataset (``range`` + ``map_batches``) through ``ctx.iter_torch_batches``.
Per run, rank 0's ``ingest_ms`` (the loop's wait for its next batch per step) and ``step_ms`` (the
loop's whole step) of the epoch, each epoch's first step left out (the loader's start-up). Reported:
medians, the ingest share of the step per input, and the Ray Data step over the DataLoader step.
Timings on a shared machine are noisy; the ratios come from runs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt  # noqa: E402  (the example beside this script)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cpus-per-worker", type=float, default=0.5)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))  # the workers import train_gpt's loop from here
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}})
    runs: dict[str, list[dict[str, float]]] = {"dataloader": [], "ray": []}
    with tempfile.TemporaryDirectory() as storage:
        for r in range(args.repeats):
            for data in ("dataloader", "ray") if r % 2 == 0 else ("ray", "dataloader"):
                gpt = train_gpt.parse_args(["--workers", str(args.workers), "--data", data, "--storage", storage,
                                            "--cpus-per-worker", str(args.cpus_per_worker),
                                            "--name", f"ingest-{data}-{r}"])
                metrics = train_gpt.run(gpt).metrics
                runs[data].append({"ingest_ms": metrics["ingest_ms"], "step_ms": metrics["step_ms"]})
                print(f"repeat {r} {data:10s} ingest {metrics['ingest_ms']:6.2f} ms of a {metrics['step_ms']:6.1f} ms "
                      "step", flush=True)
    med = {data: {k: statistics.median(run[k] for run in rs) for k in ("ingest_ms", "step_ms")}
           for data, rs in runs.items()}
    out = {
        "command": " ".join(sys.argv),
        # a clean archive of a commit names it through PDML_GIT_REV, as the project's benchmarks read it
        "git_rev": os.environ.get("PDML_GIT_REV") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip(),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "device": "cpu"},
        "emulated": "nothing: both inputs run the real model, loader and Ray Data",
        "model": "train_gpt.py defaults (2 layers, width 128, seq 64, vocab 512, global batch 32, 40 steps)",
        "workers": args.workers, "cpus_per_worker": args.cpus_per_worker, "runs": runs, "median": med,
        "ingest_share": {data: m["ingest_ms"] / m["step_ms"] for data, m in med.items()},
        "ray_step_over_dataloader_step": med["ray"]["step_ms"] / med["dataloader"]["step_ms"],
        "ray_ingest_minus_dataloader_ingest_share": (med["ray"]["ingest_ms"] - med["dataloader"]["ingest_ms"])
        / med["dataloader"]["step_ms"],
    }
    for data, m in med.items():
        print(f"{data:10s} median ingest {m['ingest_ms']:6.2f} ms of a {m['step_ms']:6.1f} ms step "
              f"({100 * out['ingest_share'][data]:.1f}%)")
    print(f"Ray Data step / DataLoader step: {out['ray_step_over_dataloader_step']:.3f}; Ray Data's extra wait: "
          f"{100 * out['ray_ingest_minus_dataloader_ingest_share']:+.1f}% of the DataLoader step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
