"""``pdml-ray demo``: the main job. Uniform shares vs node priorities on a local Ray cluster.

Four workers with emulated speeds (two at 1.0, two at 0.4) train the same real MLP on generated
data for the same number of samples twice; the table at the end compares the two runs. With
``--compute sleep`` the compute is EMULATED too (a small real MLP plus a sleep per sample / speed), so
the ideal split is exactly the speed ratio whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import threading
import time

from pdml_ray.bench.common import add_compute_argument
from pdml_ray.bench.hetero import PER_SAMPLE_MS

DESCRIPTION = "train twice on a local Ray cluster (uniform shares, then node priorities) and compare"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speeds", default="1,1,0.4,0.4", help="emulated per-worker speeds (default 1,1,0.4,0.4)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    parser.add_argument("--global-batch", type=int, default=1024, help="global batch size (default 1024)")
    parser.add_argument("--hidden", type=int, default=None,
                        help="MLP hidden width (default 1024; 64 with --compute sleep)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--address", default=None, help="existing Ray cluster to use (default: start a local one)")
    parser.add_argument("--sync", choices=("ddp", "fsdp"), default="ddp",
                        help="gradient combination: DDP with the weighting hook (default), or FSDP2")
    add_compute_argument(parser, per_sample_ms=PER_SAMPLE_MS)


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
    import ray

    from pdml_ray.bench.common import check_device, print_table
    from pdml_ray.bench.hetero import emulation_note, figures, parse_speeds, run_arm, summarise

    check_device(args.device)
    speeds = parse_speeds(args.speeds, None)
    if args.steps < 30:
        raise SystemExit("--steps must be at least 30 (node priorities settle within the first ~15 steps)")
    context = ray.init(address=args.address, num_cpus=None if args.address else len(speeds),
                       include_dashboard=args.address is None, log_to_driver=False)
    dashboard = getattr(context, "dashboard_url", None)
    note = emulation_note(args)
    print(f"pdml-ray demo: {len(speeds)} workers, speeds {speeds}, compute {args.compute}\n  {note}")
    if dashboard:
        print(f"  watch the priorities: Ray dashboard http://{dashboard} (Metrics: pdml_node_priority, "
              f"pdml_batch_size, pdml_grad_weight), or run `pdml-ray status --name pdml-demo-pdml` in another shell")
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
            ["batch sizes", u["batch_sizes"], p["batch_sizes"]]]
    print_table(["", "uniform shares", "node priorities"], rows,
                title=f"result (steady-state medians; ideal speedup from measured rates + per-step extras: {fig['ideal_speedup']:.2f}x)")
    print(f"\n{note}")
    return 0
