"""``pdml-ray bench hetero``: uniform shares vs node priorities on workers of uneven speed.

Both arms train the same model on the same generated data with the same global batch in one run
(alternating, ``--repeats`` times); figures are medians over repeats, steady-state steps only.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from pdml_ray.emulation import check_speed

DESCRIPTION = "uniform shares vs node priorities on workers of uneven (emulated) speed, side by side"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speeds", default="1,1,0.4,0.4", help="per-worker speed factors in (0, 1] (default 1,1,0.4,0.4)")
    parser.add_argument("--workers", type=int, default=None, help="number of workers (default: one per speed)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per arm (default 60, --quick 30)")
    parser.add_argument("--repeats", type=int, default=None, help="alternating repetitions of both arms (default 3, --quick 1)")
    parser.add_argument("--global-batch", type=int, default=1024, help="global batch size (default 1024)")
    parser.add_argument("--hidden", type=int, default=1024, help="MLP hidden width (default 1024)")
    parser.add_argument("--sync", choices=("ddp", "fsdp"), default="ddp",
                        help="how gradients are combined: the model wrapped in DDP (weighting hook; default) "
                             "or sharded with FSDP2 (loss scale)")


def parse_speeds(text: str, workers: int | None) -> list[float]:
    speeds = [float(s) for s in text.split(",") if s.strip()]
    if workers is not None and workers != len(speeds):
        if len(speeds) == 1:
            speeds = speeds * workers
        else:
            raise SystemExit(f"--speeds has {len(speeds)} entries but --workers is {workers}")
    if not speeds:
        raise SystemExit(f"--speeds must list numbers in (0, 1] (the fastest worker is 1), got {text!r}")
    return [check_speed(s, f"--speeds entry {i}") for i, s in enumerate(speeds)]


def workload(args: argparse.Namespace, steps: int, label: str, progress_every: int = 0) -> dict[str, Any]:
    return {"num_samples": steps * args.global_batch, "dim": 256, "hidden": args.hidden, "depth": 2,
            "num_classes": 10, "epochs": 1, "lr": 0.05, "seed": args.seed, "progress_every": progress_every,
            "measure_comm": True, "label": label, "sync": args.sync}


def run_arm(args: argparse.Namespace, speeds: list[float], steps: int, node_priorities: bool, label: str,
            progress_every: int = 0, run_name: str = "pdml-bench"):
    """One training run through PDMLTrainer; node priorities on or off (uniform shares)."""
    import ray.train

    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.train import PDMLTrainer
    from pdml_ray.train.workloads import classification_loop

    config = PDMLConfig(node_priority=NodePriorityConfig(
        global_batch_size=args.global_batch, emulated_speeds=speeds, enabled=node_priorities,
        min_batch=max(1, args.global_batch // (16 * len(speeds)))), seed=args.seed, scheduler_name=f"{run_name}-{label}")
    use_gpu = args.device == "cuda"
    trainer = PDMLTrainer(
        classification_loop, train_loop_config=workload(args, steps, label, progress_every),
        scaling_config=ray.train.ScalingConfig(num_workers=len(speeds), use_gpu=use_gpu),
        run_config=ray.train.RunConfig(name=f"{run_name}-{label}", storage_path=_storage()), pdml_config=config)
    return trainer.fit()


def _storage() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="pdml-ray-")


def summarise(result, skip: int) -> dict[str, Any]:
    """Per-step figures from the scheduler's telemetry, steady state (steps >= skip) only."""
    t, stats = result.pdml.telemetry, result.pdml.stats
    steps = t["step"].astype(int)
    keep = steps >= skip
    n = int(t["worker_id"].max()) + 1
    step_ids = np.unique(steps[keep])
    step_time = np.array([t["step_s"][keep & (steps == s)].max() for s in step_ids])
    rates = [float(t["samples"][keep & (t["worker_id"] == w)].sum() / t["compute_s"][keep & (t["worker_id"] == w)].sum())
             for w in range(n)]
    last = steps >= steps.max() - 4  # final loss: global-batch mean over the last 5 steps
    loss = float((t["loss"][last] * t["samples"][last]).sum() / t["samples"][last].sum())
    return {"step_s": float(np.median(step_time)), "rates": rates, "loss": loss,
            "overhead_fraction": float(t["overhead_s"][keep].sum() / t["step_s"][keep].sum()),
            "comm_s": stats.measurements.get("comm_s", float("nan")) if stats else float("nan"),
            "batch_sizes": list(stats.derivers["node"].batch_sizes) if stats else None}


def figures(uniform: dict, pdml: dict, global_batch: int) -> dict[str, Any]:
    """Predicted and measured speedups from one pair of runs.

    Each worker's own speed is its rate under uniform shares (every worker on the same batch):
    ``ideal_speedup`` predicts uniform and perfectly balanced step times from those rates plus the
    all-reduce alone; ``efficiency`` is that balanced prediction over the measured node-priority step.
    ``rates_pdml`` (the rates seen under node priorities) is kept for reference: with more workers
    than cores, a worker's rate depends on what the others run beside it.
    """
    rates = np.array(uniform["rates"])
    rates_pdml = np.array(pdml["rates"])
    n = len(rates)
    comm_s = pdml["comm_s"]
    uniform_pred = max((global_batch / n) / r for r in rates) + comm_s
    balanced_pred = global_batch / rates.sum() + comm_s
    return {"rates": rates.tolist(), "rates_pdml": rates_pdml.tolist(), "comm_s": comm_s,
            "ideal_speedup": uniform_pred / balanced_pred,
            "ideal_speedup_no_comm": float(rates.sum() / (n * rates.min())),
            "speedup_vs_uniform": uniform["step_s"] / pdml["step_s"],
            "efficiency": balanced_pred / pdml["step_s"],
            "step_s_uniform": uniform["step_s"], "step_s_pdml": pdml["step_s"],
            "loss_uniform": uniform["loss"], "loss_pdml": pdml["loss"],
            "scheduler_overhead_fraction": pdml["overhead_fraction"], "batch_sizes": pdml["batch_sizes"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from pdml_ray.bench.common import check_device, finish, print_table
    from pdml_ray.emulation import EMULATION_NOTE

    check_device(args.device)
    speeds = parse_speeds(args.speeds, args.workers)
    steps = args.steps or (30 if args.quick else 60)
    repeats = args.repeats or (1 if args.quick else 3)
    skip = max(15, steps // 3)
    if steps <= skip + 5:
        raise SystemExit(f"--steps must be above {skip + 5} to leave steady-state steps after settling")
    print(f"bench hetero: {len(speeds)} workers, speeds {speeds}, gradient sync {args.sync} ({EMULATION_NOTE})")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=len(speeds), include_dashboard=False, log_to_driver=False)
    per_repeat = []
    try:
        for rep in range(repeats):
            print(f"repeat {rep + 1}/{repeats}: uniform shares ...", flush=True)
            uniform = summarise(run_arm(args, speeds, steps, False, "uniform"), skip)
            print(f"repeat {rep + 1}/{repeats}: node priorities ...", flush=True)
            pdml = summarise(run_arm(args, speeds, steps, True, "pdml"), skip)
            per_repeat.append(figures(uniform, pdml, args.global_batch))
            print(f"  step uniform {uniform['step_s'] * 1e3:.1f} ms, node priorities {pdml['step_s'] * 1e3:.1f} ms, "
                  f"batch sizes {pdml['batch_sizes']}", flush=True)
    finally:
        if started_here:
            ray.shutdown()

    def med(key: str) -> float:
        return float(np.median([r[key] for r in per_repeat]))

    result: dict[str, Any] = {key: med(key) for key in ("ideal_speedup", "ideal_speedup_no_comm", "speedup_vs_uniform", "efficiency",
                                        "comm_s", "loss_uniform", "loss_pdml", "scheduler_overhead_fraction",
                                        "step_s_uniform", "step_s_pdml")}
    result["rates"] = np.median([r["rates"] for r in per_repeat], axis=0).tolist()
    result["rates_pdml"] = np.median([r["rates_pdml"] for r in per_repeat], axis=0).tolist()
    result.update(sync=args.sync, speeds=speeds, workers=len(speeds), steps=steps, steady_state_from_step=skip, repeats=repeats,
                  global_batch=args.global_batch, batch_sizes=per_repeat[-1]["batch_sizes"], per_repeat=per_repeat)
    result["targets"] = {
        "speedup_vs_uniform >= 0.85 * ideal_speedup": result["speedup_vs_uniform"] >= 0.85 * result["ideal_speedup"],
        "efficiency >= 0.8": result["efficiency"] >= 0.8,
        "scheduler_overhead_fraction < 0.02": result["scheduler_overhead_fraction"] < 0.02,
        "final losses within 5%": abs(result["loss_pdml"] - result["loss_uniform"]) <= 0.05 * abs(result["loss_uniform"]),
    }
    rows = [["ideal speedup (rates + comm)", result["ideal_speedup"]],
            ["ideal speedup (no comm)", result["ideal_speedup_no_comm"]],
            ["measured speedup vs uniform", result["speedup_vs_uniform"]],
            ["efficiency vs balanced ideal", result["efficiency"]],
            ["step time uniform / pdml (ms)", f"{result['step_s_uniform'] * 1e3:.1f} / {result['step_s_pdml'] * 1e3:.1f}"],
            ["all-reduce alone comm_s (ms)", result["comm_s"] * 1e3],
            ["worker rates, uniform run (samples/s)", " ".join(f"{r:.0f}" for r in result["rates"])],
            ["worker rates, pdml run (samples/s)", " ".join(f"{r:.0f}" for r in result["rates_pdml"])],
            ["batch sizes chosen", result["batch_sizes"]],
            ["final loss uniform / pdml", f"{result['loss_uniform']:.4f} / {result['loss_pdml']:.4f}"],
            ["scheduler overhead (of step)", result["scheduler_overhead_fraction"]]]
    print_table(["figure", "value"], rows, title=f"bench hetero (medians of {repeats} repeat(s); speeds emulated)")
    for name, ok in result["targets"].items():
        print(f"  target {'met    ' if ok else 'MISSED '} {name}")
    return finish(args, result, emulated={"speeds": speeds, "note": EMULATION_NOTE})
