"""``pdml-ray demo``: the main job. Uniform shares vs node priorities on a local Ray cluster.

Four workers with emulated speeds (two at 1.0, two at 0.4) train the same real MLP on generated
data for the same number of samples twice; the table at the end compares the two runs. With
``--compute sleep`` the compute is EMULATED too (a small real MLP plus a sleep per sample / speed), so
the ideal split is exactly the speed ratio whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import math
import os
import threading
import time

import numpy as np

from pdml_ray.bench.common import add_compute_argument
from pdml_ray.bench.hetero import PER_SAMPLE_MS
from pdml_ray.cli.args import int_range, items, ray_address, seed
from pdml_ray.errors import ConfigError

DESCRIPTION = "train twice on a local Ray cluster (uniform shares, then node priorities) and compare"


def speed_list(text: str) -> list[float]:
    """``--speeds``: comma-separated speed factors in (0, 1], the fastest worker 1.0 (2 to 64 workers)."""
    try:
        speeds = [float(s) for s in items(text, "--speeds", example="1,1,0.4,0.4")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers in (0, 1] such as 1,1,0.4,0.4, "
                                         f"got {text!r}") from None
    if not 1 <= len(speeds) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_WORKERS} speeds (one per worker), got {len(speeds)}")
    for i, s in enumerate(speeds):
        if not (math.isfinite(s) and 0.0 < s <= 1.0):
            raise argparse.ArgumentTypeError(f"entry {i} is {s!r}: each speed must be in (0, 1] "
                                             f"(the fastest worker is 1.0, one at half its speed 0.5)")
    return speeds


speed_list.__name__ = "speeds"
MAX_WORKERS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speeds", type=speed_list, default="1,1,0.4,0.4",
                        help="emulated per-worker speeds in (0, 1] (default 1,1,0.4,0.4)")
    parser.add_argument("--steps", type=int_range(30, 100_000, hint=" (node priorities settle within ~15 steps)"),
                        default=60, help="training steps per run, at least 30 (default 60)")
    parser.add_argument("--global-batch", type=int_range(1, 10**7), default=1024, help="global batch size (default 1024)")
    parser.add_argument("--hidden", type=int_range(1, 65_536), default=None,
                        help="MLP hidden width (default 1024; 64 with --compute sleep)")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--address", type=ray_address, default=None,
                        help="existing Ray cluster to use, HOST:PORT (default: start a local one)")
    parser.add_argument("--sync", choices=("ddp", "fsdp"), default="ddp",
                        help="gradient combination: DDP with the weighting hook (default), or FSDP2")
    add_compute_argument(parser, per_sample_ms=PER_SAMPLE_MS)


def validate(args: argparse.Namespace) -> list[float]:
    """Everything checkable before Ray starts; the speeds (parsed) on success."""
    speeds = args.speeds if isinstance(args.speeds, list) else speed_list(args.speeds)
    if not (math.isfinite(args.per_sample_ms) and 0.0 < args.per_sample_ms <= 10_000):
        raise ConfigError(f"--per-sample-ms must be in (0, 10000] milliseconds, got {args.per_sample_ms!r}")
    if args.global_batch < len(speeds):
        raise ConfigError(f"--global-batch {args.global_batch} is smaller than the {len(speeds)} workers: "
                          f"give at least one sample per worker")
    return speeds


def _watch(name: str, namespace: str, label: str, total_steps: int, stop: threading.Event) -> None:
    """Print the scheduler's view every few seconds while a run trains (progress and priorities)."""
    import ray

    from pdml_ray.actors.scheduler import find_scheduler

    t0 = time.monotonic()
    while not stop.wait(3.0):
        handle = find_scheduler(name, namespace)
        if handle is None:
            continue
        try:
            stats = ray.get(handle.stats.remote(), timeout=5)  # small: not the whole telemetry log
        except Exception:  # noqa: BLE001 - progress display must never break the run
            continue
        if stats.last_step < 0:
            print(f"  [{label}] {time.monotonic() - t0:5.0f}s  starting the Ray Train workers ...", flush=True)
            continue
        steps, node = stats.last_step + 1, stats.derivers["node"]
        print(f"  [{label}] {time.monotonic() - t0:5.0f}s  step {steps:>4}/{total_steps}  "
              f"batch sizes {list(node.batch_sizes)}  decision v{stats.versions['node']}", flush=True)


def run(args: argparse.Namespace) -> int:
    speeds = validate(args)  # before importing, let alone starting, Ray
    import ray

    from pdml_ray.bench.common import check_device, print_table
    from pdml_ray.bench.hetero import emulation_note, figures, run_arm, summarise
    from pdml_ray.cli.cluster import probe

    check_device(args.device)
    if args.address not in (None, "local"):
        probe(args.address)  # seconds, not Ray's minutes of retries, when nothing answers there
    # no --address: the cluster in RAY_ADDRESS (a submitted job), else a private local instance (Ray's
    # default would attach to another local cluster on this machine, then refuse num_cpus)
    address = args.address or (None if os.environ.get("RAY_ADDRESS") else "local")
    local = address == "local"
    context = ray.init(address=address, num_cpus=len(speeds) if local else None, include_dashboard=local,
                       log_to_driver=False)
    dashboard = getattr(context, "dashboard_url", None)
    note = emulation_note(args)
    print(f"pdml-ray demo: {len(speeds)} workers, speeds {speeds}, compute {args.compute}\n  {note}")
    if dashboard:
        print(f"  watch the priorities: Ray dashboard http://{dashboard} (Metrics: pdml_node_priority_ratio, "
              f"pdml_batch_size_samples, pdml_grad_weight_ratio), or run `pdml-ray watch --name pdml-demo-pdml` in another shell")
    args.quick, args.json = False, None
    summaries = {}
    try:
        for label, on in (("uniform", False), ("pdml", True)):
            print(f"\nrun {'2/2: node priorities' if on else '1/2: uniform shares'} ({args.steps} steps of "
                  f"{args.global_batch} samples)", flush=True)
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(f"pdml-demo-{label}", "pdml", label, args.steps, stop),
                                       daemon=True)
            watcher.start()
            try:
                result = run_arm(args, speeds, args.steps, on, label, run_name="pdml-demo")
            finally:
                stop.set()
                watcher.join()
            summaries[label] = summarise(result, skip=max(15, args.steps // 3))
    finally:
        ray.shutdown()

    u, p = summaries["uniform"], summaries["pdml"]
    fig = figures(u, p, args.global_batch, speeds if args.compute == "sleep" else None)
    rows = [["samples/s", args.global_batch / u["step_s"], args.global_batch / p["step_s"]],
            ["speedup", 1.0, fig["speedup_vs_uniform"]],
            ["efficiency vs ideal balance", fig["efficiency"] / fig["speedup_vs_uniform"], fig["efficiency"]],
            ["final loss", u["loss"], p["loss"]],
            ["batch sizes", u["batch_sizes"], p["batch_sizes"]],
            ["speed-ratio split (for comparison)", "", list(speed_ratio_split(speeds, args.global_batch))]]
    print_table(["", "uniform shares", "node priorities"], rows,
                title=f"result (steady-state medians; ideal speedup from measured rates + per-step extras: {fig['ideal_speedup']:.2f}x)")
    print(f"\n{note}")
    print(split_note(args.compute, len(speeds), os.cpu_count() or 1))
    return 0


def speed_ratio_split(speeds: list[float], global_batch: int) -> tuple[int, ...]:
    """The batch sizes in proportion to the emulated speeds (what ``--compute sleep`` converges to)."""
    from pdml_ray.batching import round_to_batch_sizes

    total = sum(speeds)
    return tuple(int(b) for b in round_to_batch_sizes(np.array([s / total for s in speeds]), global_batch, 0, None))


def split_note(compute: str, workers: int, cores: int) -> str:
    """Why the node-priority split may differ from the speed ratio, in words for the console."""
    if compute == "sleep":
        return ("the split follows the emulated speeds: compute is slept (samples x per-sample time / speed), so the "
                "speed-ratio split is the ideal one")
    contention = (f"{workers} workers share {cores} cores here, so each worker's measured rate includes waiting for a "
                  "core, and two workers of the same emulated speed can measure different rates; "
                  if workers > cores else "")
    return ("the split follows each worker's MEASURED step-time model (real compute plus the emulated slowdown), not "
            f"the speeds you gave: {contention}run with --compute sleep to see the speed-ratio split itself")
