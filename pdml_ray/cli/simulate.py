"""``pdml-ray simulate``: what each pipeline schedule would do on your cluster, before spending GPU hours.

Describe the cluster (stages, replicas per stage, micro-batches, per-replica speeds, noise) and every
schedule runs for a few global steps in the discrete-event simulator (pdml_ray.pipeline.simulate);
the table shows steady-state makespan, bubble, peak activations and the ratio to 1F1B and to a lower
bound, and to 1F1B weighted by the replicas' measured speeds (``1f1b-weighted``, the hand-tuned static
baseline). All of it is SIMULATED: no model runs and no device is used. ``--show-plan`` prints each
schedule's step-by-replica grid.

Examples:
    pdml-ray simulate --stages 4 --replicas 2 --microbatches 16 --slow 2:0=0.5
    pdml-ray simulate --stages 8 --replicas 4 --microbatches 64 --profile noisy --memory-limit 8
    pdml-ray simulate --stages 3 --replicas 1,2,1 --speeds "1;1,0.6;1" --show-plan
"""

from __future__ import annotations

import argparse
import json
from typing import Any

DESCRIPTION = "simulate a pipeline cluster profile under every registered schedule"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages (default 4)")
    parser.add_argument("--replicas", default="2", help="replicas per stage: one int, or one per stage as 2,2,1,2")
    parser.add_argument("--microbatches", type=int, default=16, help="micro-batches per global step (default 16)")
    parser.add_argument("--profile", default="homogeneous", choices=("homogeneous", "heterogeneous", "noisy"),
                        help="starting profile (default homogeneous); the flags below refine it")
    parser.add_argument("--speeds", help='relative replica speeds, stages separated by ";" and replicas by ",", '
                                         'e.g. "1,1;1,0.5" (1.0 = nominal)')
    parser.add_argument("--slow", action="append", default=[], metavar="STAGE:REPLICA=FACTOR",
                        help="multiply one replica's speed, e.g. 2:0=0.5 (repeatable)")
    parser.add_argument("--forward-s", type=float, default=1.0, help="forward seconds per micro-batch at speed 1")
    parser.add_argument("--backward-s", type=float, default=2.0, help="backward seconds per micro-batch at speed 1")
    parser.add_argument("--noise", type=float, help="lognormal sigma of per-action noise (e.g. 0.2)")
    parser.add_argument("--mb-cv", type=float, help="relative std of per-micro-batch cost (e.g. 0.1)")
    parser.add_argument("--drift", type=float, help="per-step sigma of each replica's log-speed random walk")
    parser.add_argument("--transfer-s", type=float, default=0.0, help="seconds to move an activation between stages")
    parser.add_argument("--memory-limit", type=int, help="activations per replica (default: stages, 1F1B's peak)")
    parser.add_argument("--steps", type=int, default=10, help="global steps to simulate (default 10)")
    from pdml_ray.pipeline.registry import SCHEDULERS

    parser.add_argument("--schedules", default=",".join(SCHEDULERS),
                        help=f"comma-separated names (default: all of {', '.join(SCHEDULERS)})")
    parser.add_argument("--seed", type=int, default=0, help="seed of speeds, noise and drift (default 0)")
    parser.add_argument("--show-plan", action="store_true", help="print each schedule's step-by-replica grid")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def build_profile(args: argparse.Namespace) -> Any:
    from pdml_ray.pipeline.simulate import ClusterProfile

    reps: int | list[int] = [int(x) for x in args.replicas.split(",")] if "," in args.replicas else int(args.replicas)
    if isinstance(reps, list) and len(reps) != args.stages:
        raise SystemExit(f"--replicas lists {len(reps)} counts for {args.stages} stages; give one per stage")
    overrides: dict[str, Any] = {"transfer_s": args.transfer_s,
                                 "memory_limit": args.memory_limit if args.memory_limit is not None else args.stages}
    for flag, field in (("noise", "noise_sigma"), ("mb_cv", "microbatch_cv"), ("drift", "drift_sigma")):
        if getattr(args, flag) is not None:
            overrides[field] = getattr(args, flag)
    profile = ClusterProfile.build(args.stages, reps, profile=args.profile, forward_s=args.forward_s,
                                   backward_s=args.backward_s, seed=args.seed, **overrides)
    speeds = [list(s) for s in profile.speeds]
    if args.speeds:
        rows = [[float(x) for x in row.split(",")] for row in args.speeds.split(";")]
        if [len(r) for r in rows] != [len(r) for r in speeds]:
            raise SystemExit(f"--speeds has shape {[len(r) for r in rows]}, the cluster {[len(r) for r in speeds]}")
        speeds = rows
    for item in args.slow:
        try:
            where, factor = item.split("=")
            k, r = (int(x) for x in where.split(":"))
            speeds[k][r] *= float(factor)
        except (ValueError, IndexError):
            raise SystemExit(f"--slow {item!r}: expected STAGE:REPLICA=FACTOR within the cluster, e.g. 2:0=0.5") from None
    import dataclasses

    return dataclasses.replace(profile, speeds=tuple(tuple(s) for s in speeds))


def run(args: argparse.Namespace) -> int:
    from pdml_ray.bench.common import print_table
    from pdml_ray.config import PipelineConfig
    from pdml_ray.pipeline.plan import format as format_plan
    from pdml_ray.pipeline.registry import SCHEDULERS
    from pdml_ray.pipeline.simulate import compare_in_simulation, steady_state

    profile = build_profile(args)
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCHEDULERS]
    if unknown:
        raise SystemExit(f"unknown schedule(s) {unknown}; valid names: {sorted(SCHEDULERS)}")
    config = PipelineConfig(memory_limit=profile.memory_limit)
    results = compare_in_simulation(profile, args.microbatches, names, steps=args.steps, config=config, seed=args.seed)
    half = args.steps // 2  # steady state: the second half of the steps
    summary = steady_state(results, half)
    steady, bubble, lower = summary["makespan_s"], summary["bubble_fraction"], summary["lower_bound_s"]
    base, weighted = steady.get("1f1b"), steady.get("1f1b-weighted")
    rows = []
    for n, r in results.items():
        rows.append([n, steady[n], bubble[n], max(r["peak_memory"].values()),
                     r["memory_violations"], steady[n] / base if base else float("nan"),
                     steady[n] / weighted if weighted else float("nan"), steady[n] / lower])
    print(f"simulated cluster: {profile.stages} stages x replicas {list(profile.replicas)}, "
          f"{args.microbatches} micro-batches, speeds {[[round(s, 2) for s in row] for row in profile.speeds]}, "
          f"noise {profile.noise_sigma}, mb variation {profile.microbatch_cv}, drift {profile.drift_sigma}, "
          f"transfer {profile.transfer_s}s, memory limit {profile.memory_limit} activations/replica")
    print_table(["schedule", "makespan_s", "bubble", "peak_act", "mem_viol", "x 1f1b", "x 1f1b-weighted",
                 "x lower_bound"], rows,
                title=f"steady state (median of steps {half}..{args.steps - 1}); lower bound {lower:.4g}s")
    if "auto" in results:
        print(f"auto chose {results['auto']['decision'].get('schedule')}: {results['auto']['decision'].get('reason')}")
    if args.show_plan:
        for n, r in results.items():
            print()
            print(format_plan(r["last_plan"]))
    if args.json:
        payload = {n: {k: v for k, v in r.items() if k != "last_plan"} | {"plan": r["last_plan"].to_dict()}
                   for n, r in results.items()}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"profile": _profile_dict(profile), "microbatches": args.microbatches, "steady_makespan_s": steady,
                       "lower_bound_s": lower, "schedules": payload}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _profile_dict(profile: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(profile)
