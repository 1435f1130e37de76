"""``pdml-ray bench stragglers``: every straggler policy side by side on the same seeded straggler
model, on Ray worker actors, training L2-regularised logistic regression (a convex problem).

Compute is EMULATED: each worker computes real gradients of its partitions, then sleeps
``per-partition-ms x factor`` per partition of n (``factor`` from the straggler model; backup's
partitions are n / (n + b) as large and sleep as much less), so 2 cores host 8+ workers without CPU
contention deciding the result. Deaths are EMULATED by the worker's process exiting at its step.

Defaults, and why: 80 ms per partition (--quick 60 ms), so that compute dominates the runtime's own
per-step cost (measured first and reported as ``ray_overhead_step_s``: a ``sync`` run with no
emulated compute, 20-35 ms on a busy 2-core machine; step-time ratios between policies shrink
toward 1 as that overhead grows); shifted-exponential factor 1 + Exp(mean 1) (Lee et al. 2017's model with the
random part as large as the shift on average); lr 2.0 with L2 0.01 on 16 features. The target loss
is ``L* + 5% of (L0 - L*)``, with ``L*`` from L-BFGS on the full data. None of these is tuned per
policy; try others with --per-partition-ms, --mean-extra, --lr, --model.

Figures per policy: step time p50/p99 (aggregator wall time from publishing the parameters to the
update), time to the target loss (summed step times), final loss, partitions computed per worker
per step (median; the mean shows pgc's warm-up and catch-ups), and the gradient cosine: the applied
gradient against the full gradient at the same parameters, computed on the aggregator outside the
timed step. A second, shorter run kills workers mid-run (--stragglers of them) to show which
policies stall (``sync``, bounded by the death being noticed or --step-timeout-s) and which train on.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

from pdml_ray.bench.common import ratio_key

DESCRIPTION = "straggler policies (sync, ignore-stragglers, backup, gradient coding, pipelined GC) side by side, Ray actors"

MODELS = ("shifted-exp", "pareto", "correlated", "fixed", "death")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=8, help="n: workers and data partitions (default 8)")
    parser.add_argument("--stragglers", type=int, default=1, help="s: stragglers tolerated, backup workers b (default 1)")
    parser.add_argument("--model", choices=MODELS, default="shifted-exp", help="straggler model (default shifted-exp)")
    parser.add_argument("--policies", default=None, help="comma-separated policy names (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per policy (default 40, --quick 24)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per policy, medians reported (default 3, --quick 1)")
    parser.add_argument("--per-partition-ms", type=float, default=None,
                        help="EMULATED compute per partition at factor 1 (default 80, --quick 60)")
    parser.add_argument("--mean-extra", type=float, default=1.0, help="shifted-exp/death: factor = 1 + Exp(mean) (default 1)")
    parser.add_argument("--slowdown", type=float, default=3.0, help="fixed/correlated: slowdown factor (default 3)")
    parser.add_argument("--alpha", type=float, default=2.0, help="pareto tail index (default 2)")
    parser.add_argument("--lr", type=float, default=2.0, help="SGD learning rate (default 2.0)")
    parser.add_argument("--step-timeout-s", type=float, default=20.0, help="a step waiting longer stalls the run (default 20)")
    parser.add_argument("--no-death-run", action="store_true", help="skip the second run with worker deaths")


def _problem(n: int, b: int, seed: int):
    import torch

    from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model
    from pdml_ray.stragglers.run import FullObjective, minimize

    dim, l2 = 16, 1e-2
    per = max(1, 2048 // (n * (n + b)))
    x, y = logistic_data(n * (n + b) * per, dim, seed)  # divides into n and into n + b equal partitions
    evaluate = FullObjective(logistic_model(dim), logistic_loss, x, y, l2)
    best, _ = minimize(evaluate, dim)
    return x, y, l2, dim, best, evaluate(torch.zeros(dim + 1))[0]


def _straggler_model(args: argparse.Namespace, name: str, workers: int, seed: int, death_step: int):
    from pdml_ray.stragglers.delays import make_straggler_model

    return make_straggler_model(name, workers=workers, stragglers=args.stragglers, seed=seed, death_step=death_step,
                                slowdown=args.slowdown, mean_extra=args.mean_extra, alpha=args.alpha)


def _run_policies(args, policies, model_name, steps, repeats, death_step, problem, pool, per_sample_s):
    from pdml_ray.runtime.stragglers import StragglerRuntime
    from pdml_ray.stragglers.problem import logistic_loss, logistic_model
    from pdml_ray.stragglers.registry import make_policy

    x, y, l2, dim, _, _ = problem
    runs: dict[str, list] = {p: [] for p in policies}
    labels: dict[str, str] = {}
    for rep in range(repeats):
        for name in policies:
            policy = make_policy(name, workers=args.workers, stragglers=args.stragglers, seed=args.seed)
            model = _straggler_model(args, model_name, policy.num_workers, args.seed + rep, death_step)
            labels.setdefault(name, model.label + (f" (seeds {args.seed}..{args.seed + repeats - 1})" if repeats > 1 else ""))
            rt = StragglerRuntime(policy, logistic_model(dim), logistic_loss, x, y, lr=args.lr, l2=l2,
                                  straggler_model=model, per_sample_s=per_sample_s,
                                  step_timeout_s=args.step_timeout_s, pool=pool)
            t0 = time.perf_counter()
            try:
                result = rt.train(steps)
            finally:
                rt.shutdown()
            runs[name].append(result)
            print(f"  [{model.label}] {name:18s} rep {rep + 1}: {len(result.records)} steps in "
                  f"{time.perf_counter() - t0:.1f} s, final loss {result.final_loss:.4f}"
                  f"{', STALLED: ' + result.stalled if result.stalled else ''}", flush=True)
    return runs, labels


def _overhead(args: argparse.Namespace, problem, pool) -> float:
    """Median step time of ``sync`` with no emulated compute: what the runtime itself costs per step."""
    from pdml_ray.runtime.stragglers import StragglerRuntime
    from pdml_ray.stragglers.problem import logistic_loss, logistic_model
    from pdml_ray.stragglers.registry import make_policy

    x, y, l2, dim, _, _ = problem
    policy = make_policy("sync", workers=args.workers, stragglers=args.stragglers)
    rt = StragglerRuntime(policy, logistic_model(dim), logistic_loss, x, y, lr=args.lr, l2=l2, pool=pool,
                          step_timeout_s=args.step_timeout_s)
    try:
        result = rt.train(12)
    finally:
        rt.shutdown()
    return float(statistics.median(result.step_times[2:]))


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(statistics.median(present)) if present else None


def _figures(results: list, target_loss: float, num_workers: int) -> dict[str, Any]:
    ttt = [r.time_to_target(target_loss) for r in results]
    reached = [t for t in ttt if t is not None]
    return {
        "step_time_p50_s": _median([r.step_time_quantile(0.5) for r in results]),
        "step_time_p99_s": _median([r.step_time_quantile(0.99) for r in results]),
        "time_to_target_s": _median(reached) if len(reached) * 2 > len(ttt) else None,  # None unless most reached it
        "final_loss": _median([r.final_loss for r in results]),
        "partitions_per_step": _median([r.partitions_per_step for r in results]),
        "partitions_per_step_mean": _median([r.partitions_per_step_mean for r in results]),
        "grad_cosine": _median([r.grad_cosine for r in results]),
        "grad_cosine_min": min((r.grad_cosine_min for r in results if not math.isnan(r.grad_cosine_min)), default=None),
        "exact_fraction": _median([r.exact_fraction for r in results]),
        "max_staleness": max((rec.combination.max_staleness for r in results for rec in r.records), default=0),
        "mix_max": max((rec.combination.mix for r in results for rec in r.records), default=None),
        "decode_error_max": max((rec.combination.decode_error for r in results for rec in r.records), default=None),
        "stalled": any(r.stalled for r in results),
        "stalled_reason": next((r.stalled for r in results if r.stalled), None),
        "steps_completed": min(len(r.records) for r in results),
        "workers_used": num_workers,
    }


def _target(value: float | None, target: Any, met: bool) -> dict[str, Any]:
    return {"value": value, "target": target, "met": bool(met)}


def step_time_ratios(pol: dict[str, dict[str, Any]], pgc: str) -> dict[str, float]:
    """``pgc``'s median step time over each plain gradient code's that ran, keyed by the pair
    (``pgc_fr_over_gc_fr``, ``pgc_fr_over_gc_cr``, ...): against gc-fr and gc-cr alike, so no target
    is read against the slower of the two."""
    mine = pol[pgc]["step_time_p50_s"]
    return {ratio_key(pgc, gc): mine / pol[gc]["step_time_p50_s"]
            for gc in ("gc-fr", "gc-cr") if gc in pol and pol[gc]["step_time_p50_s"] and mine}


def _targets(pol: dict[str, dict[str, Any]], ratios: dict[str, float | None],
             death: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    t: dict[str, dict[str, Any]] = {}
    others = {p: r for p, r in ratios.items() if p != "sync" and r is not None}
    if "sync" in pol:
        best = min(others.values(), default=None)
        t["best_time_to_target_vs_sync"] = _target(best, "<= 0.7", best is not None and best <= 0.7)
    for p in ("gc-fr", "gc-cr"):
        if p in pol:
            c = pol[p]["grad_cosine_min"]
            t[f"{p}_grad_cosine_min"] = _target(c, ">= 0.9999", c is not None and c >= 0.9999)
    for p in ("pgc-fr", "pgc-cr"):
        if p not in pol:
            continue
        pps = pol[p]["partitions_per_step"]
        t[f"{p}_partitions_per_step"] = _target(pps, "== 1 (median)", pps == 1.0)
        # against each plain code, the pair named (pgc_cr_over_gc_fr: pgc-cr's p50 step over gc-fr's)
        for key, r in step_time_ratios(pol, p).items():
            t[f"{key}_step_time"] = _target(r, "<= 0.6", r <= 0.6)
        if "ignore-stragglers" in pol:
            a, b = pol[p]["time_to_target_s"], pol["ignore-stragglers"]["time_to_target_s"]
            r2 = a / b if a is not None and b is not None else None
            t[f"{p}_time_to_target_vs_ignore_stragglers"] = _target(
                r2, "<= 1.05", a is not None and (b is None or a <= 1.05 * b))
    if death is not None:
        if "sync" in death:
            t["death_sync_stalled"] = _target(None, "sync reported stalled", death["sync"]["stalled"])
        coded = [p for p in ("gc-fr", "gc-cr", "pgc-fr", "pgc-cr") if p in death]
        if coded:
            ok = all(not death[p]["stalled"] for p in coded)
            t["death_coded_policies_keep_training"] = _target(None, f"{coded} complete every step", ok)
    return t


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from pdml_ray.bench.common import finish, init_ray, print_table
    from pdml_ray.errors import UsageError
    from pdml_ray.errors import ConfigError
    from pdml_ray.runtime.stragglers import WorkerPool
    from pdml_ray.stragglers.registry import POLICIES, make_policy

    if args.device != "cpu":  # the JSON must never record a device that was not used
        raise UsageError("--device cuda is not supported here: the logistic-regression workload runs on the CPU; use --device cpu")
    policies = args.policies.split(",") if args.policies else list(POLICIES)
    for p in policies:  # refuse bad names and invalid codes before starting Ray
        make_policy(p, workers=args.workers, stragglers=args.stragglers)
    if args.stragglers < 1:
        raise ConfigError("--stragglers must be >= 1 for this benchmark (with 0 every policy is sync)")
    steps = args.steps or (24 if args.quick else 40)
    repeats = args.repeats or (1 if args.quick else 3)
    per_partition_ms = args.per_partition_ms or (60.0 if args.quick else 80.0)
    n, b = args.workers, args.stragglers
    problem = _problem(n, b, args.seed)
    x, _, _, _, best_loss, initial_loss = problem
    target_loss = best_loss + 0.05 * (initial_loss - best_loss)
    per_sample_s = per_partition_ms / 1e3 / (len(x) // n)
    death_step = max(2, steps // 4)
    print(f"bench stragglers: n={n} workers, s={b}, model {args.model}, {steps} steps x {repeats} repeat(s); "
          f"EMULATED compute {per_partition_ms:g} ms per partition x straggler factor; real gradients; "
          f"target loss {target_loss:.4f} (L* {best_loss:.4f}, L0 {initial_loss:.4f})", flush=True)
    started_here = not ray.is_initialized()
    if started_here:
        init_ray(max(4, (n + b) // 2 + 1))
    pool = WorkerPool(num_cpus_per_worker=0.25)
    t0 = time.perf_counter()
    try:
        overhead_s = _overhead(args, problem, pool)
        print(f"runtime overhead: {overhead_s * 1e3:.1f} ms per step (sync, no emulated compute)", flush=True)
        runs, labels = _run_policies(args, policies, args.model, steps, repeats, death_step, problem, pool, per_sample_s)
        death_runs = None
        if args.model != "death" and not args.no_death_run:
            death_steps = max(8, steps // 3)
            print(f"death run: {b} worker(s) die at step {death_steps // 3}", flush=True)
            death_runs, death_labels = _run_policies(args, policies, "death", death_steps, 1, death_steps // 3,
                                                     problem, pool, per_sample_s)
    finally:
        pool.shutdown()
        if started_here:
            ray.shutdown()
    workers_used = {p: make_policy(p, workers=n, stragglers=b).num_workers for p in policies}
    pol = {p: _figures(runs[p], target_loss, workers_used[p]) for p in policies}
    sync_ttt = pol.get("sync", {}).get("time_to_target_s")
    ratios = {p: (f["time_to_target_s"] / sync_ttt if f["time_to_target_s"] is not None and sync_ttt else None)
              for p, f in pol.items()}
    death = None
    if death_runs is not None:
        death = {p: {"stalled": any(r.stalled for r in rs), "stalled_reason": next((r.stalled for r in rs if r.stalled), None),
                     "steps_completed": min(len(r.records) for r in rs), "final_loss": _median([r.final_loss for r in rs]),
                     "straggler_model": death_labels[p]} for p, rs in death_runs.items()}
    label = labels[policies[0]]
    rows = [[p, f["step_time_p50_s"] * 1e3 if f["step_time_p50_s"] else None,
             f["step_time_p99_s"] * 1e3 if f["step_time_p99_s"] else None,
             f["time_to_target_s"], ratios[p], f["final_loss"], f["partitions_per_step"], f["partitions_per_step_mean"],
             f["grad_cosine"], f["exact_fraction"], f["workers_used"], "STALLED" if f["stalled"] else ""]
            for p, f in pol.items()]
    print_table(["policy", "p50_ms", "p99_ms", "to_target_s", "vs_sync", "final_loss", "parts/step", "parts_mean",
                 "grad_cos", "exact", "workers", ""], rows,
                title=f"bench stragglers [{label}] (EMULATED compute; medians of {repeats} repeat(s))")
    if death:
        print_table(["policy", "steps", "final_loss", "stalled"],
                    [[p, d["steps_completed"], d["final_loss"], d["stalled_reason"] or ""] for p, d in death.items()],
                    title=f"worker death run [{next(iter(death.values()))['straggler_model']}] (EMULATED death)")
    targets = _targets(pol, ratios, death if death else ({p: {"stalled": f["stalled"]} for p, f in pol.items()}
                                                        if args.model == "death" else None))
    for name, t in targets.items():
        v = t["value"]
        print(f"  target {'met    ' if t['met'] else 'MISSED '} {name}: {v if v is None else round(v, 4)} (target {t['target']})")
    result: dict[str, Any] = {
        "workers": n, "stragglers": b, "straggler_model": label, "steps": steps, "repeats": repeats,
        "per_partition_ms": per_partition_ms, "lr": args.lr, "target_loss": target_loss, "optimal_loss": best_loss,
        "initial_loss": initial_loss, "ray_overhead_step_s": overhead_s, "policies": pol, "time_to_target_ratio_vs_sync": ratios,
        "step_time_ratios": {k: v for p in ("pgc-fr", "pgc-cr") if p in pol for k, v in step_time_ratios(pol, p).items()},
        "death_run": death,
        "targets": targets, "wall_s": time.perf_counter() - t0,
    }
    emulated = {"compute": f"EMULATED: real gradients, then a sleep of {per_partition_ms:g} ms per partition of n "
                           "x the straggler model's factor (cut short when the step is over)",
                "stragglers": label, "deaths": "EMULATED: the worker's process exits at its death step",
                "grad_cosine": "full gradient on the aggregator at the same parameters, outside the timed step"}
    return finish(args, result, emulated)
