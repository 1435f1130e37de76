"""``pdml-ray bench gradients``: where gradient priorities act, on the straggler-tolerant runtime (Ray
worker actors, L2-regularised logistic regression, the same seeded straggler models and EMULATED
compute as ``bench stragglers``).

Arms, side by side in one run:

    sync                 wait for all n, average (the baseline)
    ignore-stragglers    first n - s, averaged
    topk-fixed           first n - s, top K by priority with the prior weights (0.5, 0.3, 0.2) pinned
    topk-tuned           the same with the weights tuned by the deriver's bandit
    topk-random          the same K (from its own deriver), workers chosen at random (Horvitz-Thompson
                         weights: unbiased); the control that shows whether the priority carries information
    async                bounded staleness: updates of n - async_s gradients, fresh or stale, weighted 1/(1+s);
                         it runs steps x n / (n - async_s) steps: the same number of gradients as sync
    topk-w=(a,b,g)       the six simplex grid points (R = 2) pinned, for the tuned-vs-best-fixed target
                         (--quick runs three of them: the vertices; say --fixed-sweep 6 for all)

The headline is the priority arms (top-K by priority, every weight setting) against ignore-stragglers
and against random top-K: what the priority adds to dropping the stragglers, and whether it beats
choosing the same K by chance. ``async`` uses no priority and is reported apart.

The priority arms (and ``async``, whose staleness bound is the deriver's) feed the step's reports to
the run's scheduler actor, as the straggler runtime does by default; the aggregator's time on the feed
over the summed step times is ``deriver_overhead_fraction``, and the actor's own CPU per step is
``scheduler_cpu_ms_per_step`` (on a small machine that actor shares the workers' cores; on a cluster it
runs on the head node).

Figures per arm (medians over --repeats): time to the target loss (summed step times; target
``L* + 5% of (L0 - L*)`` with L* from L-BFGS), final loss, final held-out accuracy (percent, on
4096 samples drawn from the same distribution and never trained on), the high/low gradient-norm
ratio (the deriver's: mean reported gradient norm of the higher-priority half of the workers over the
lower half), K over time, and the deriver's share of step time. ``steps_to_target`` is there too:
on a busy machine the topk arms make near-identical updates, so their time-to-target differences of
~10% with one repeat are step-time noise (see the steps); use the full run's medians of 3.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any, Callable

DESCRIPTION = ("gradient priorities on the straggler runtime: sync, ignore-stragglers, topk (fixed, tuned, random), "
               "async, Ray actors")

MODELS = ("shifted-exp", "pareto", "correlated", "fixed")
GRID = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.0), (0.5, 0.0, 0.5), (0.0, 1.0, 0.0), (0.0, 0.5, 0.5), (0.0, 0.0, 1.0))
QUICK_GRID = (GRID[0], GRID[3], GRID[5])  # the vertices: gradient only, data only, node only
HELD_OUT = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=8, help="n: workers and data partitions (default 8)")
    parser.add_argument("--stragglers", type=int, default=1, help="s: the step completes at n - s arrivals (default 1)")
    parser.add_argument("--async-stragglers", type=int, default=None,
                        help="async: an update every n - this many gradients (default n // 2)")
    parser.add_argument("--model", choices=MODELS, default="shifted-exp", help="straggler model (default shifted-exp)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per arm (default 40, --quick 30)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per arm, medians reported (default 3, --quick 1)")
    parser.add_argument("--per-partition-ms", type=float, default=None,
                        help="EMULATED compute per partition at factor 1 (default 80, --quick 60)")
    parser.add_argument("--mean-extra", type=float, default=1.0, help="shifted-exp: factor = 1 + Exp(mean) (default 1)")
    parser.add_argument("--slowdown", type=float, default=3.0, help="fixed/correlated: slowdown factor (default 3)")
    parser.add_argument("--alpha", type=float, default=2.0, help="pareto tail index (default 2)")
    parser.add_argument("--lr", type=float, default=2.0, help="SGD learning rate (default 2.0)")
    parser.add_argument("--fixed-sweep", type=int, choices=(0, 3, 6), default=None,
                        help="fixed-weight settings swept (default 6, --quick 3: the simplex vertices)")
    parser.add_argument("--step-timeout-s", type=float, default=20.0, help="a step waiting longer stalls the run")


def _problem(n: int, seed: int):
    """Train (n x 256 samples) and held-out (4096) sets from one draw, so one w_true; L* and L0."""
    import torch

    from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model
    from pdml_ray.stragglers.run import FullObjective, minimize

    dim, l2 = 16, 1e-2
    train = n * max(1, 2048 // n)
    x_all, y_all = logistic_data(train + HELD_OUT, dim, seed)
    x, y, x_test, y_test = x_all[:train], y_all[:train], x_all[train:], y_all[train:]
    evaluate = FullObjective(logistic_model(dim), logistic_loss, x, y, l2)
    best, theta = minimize(evaluate, dim)
    return {"x": x, "y": y, "x_test": x_test, "y_test": y_test, "l2": l2, "dim": dim,
            "best_loss": best, "initial_loss": evaluate(torch.zeros(dim + 1))[0],
            "best_accuracy": _accuracy(theta.detach(), x_test, y_test)}


def _accuracy(params, x, y) -> float:
    """Held-out accuracy in percent of ``nn.Linear(dim, 1)``'s flat parameters (weight, then bias)."""
    w, b = params[:-1].float(), params[-1].float()
    return float((((x @ w + b) > 0).float() == y.squeeze(1)).float().mean()) * 100.0


def _arms(args: argparse.Namespace, grid: tuple) -> dict[str, Callable[[], Any]]:
    from pdml_ray.stragglers.policies.topk import TopKPolicy
    from pdml_ray.stragglers.registry import make_policy

    n, s, seed = args.workers, args.stragglers, args.seed
    async_s = args.async_stragglers if args.async_stragglers is not None else n // 2
    arms: dict[str, Callable[[], Any]] = {
        "sync": lambda: make_policy("sync", workers=n, stragglers=s, seed=seed),
        "ignore-stragglers": lambda: make_policy("ignore-stragglers", workers=n, stragglers=s, seed=seed),
        "topk-fixed": lambda: TopKPolicy(n, s, seed, fixed_weights=(0.5, 0.3, 0.2)),
        "topk-tuned": lambda: TopKPolicy(n, s, seed),
        "topk-random": lambda: TopKPolicy(n, s, seed, selection="random"),
        "async": lambda: make_policy("async", workers=n, stragglers=async_s, seed=seed),
    }
    for w in grid:
        arms[_grid_name(w)] = _pinned(n, s, seed, w)
    return arms


def _pinned(n: int, s: int, seed: int, w: tuple[float, float, float]) -> Callable[[], Any]:
    from pdml_ray.stragglers.policies.topk import TopKPolicy

    return lambda: TopKPolicy(n, s, seed, fixed_weights=w)


def _grid_name(w: tuple[float, float, float]) -> str:
    return "topk-w=({:g},{:g},{:g})".format(*w)


def _run_arms(args, arms, steps, repeats, problem, pool, per_sample_s) -> tuple[dict[str, list], str]:
    from pdml_ray.bench.stragglers import _straggler_model
    from pdml_ray.runtime.stragglers import StragglerRuntime
    from pdml_ray.stragglers.problem import logistic_loss, logistic_model

    runs: dict[str, list] = {a: [] for a in arms}
    label = ""
    for rep in range(repeats):
        for name, build in arms.items():
            policy = build()
            arm_steps = math.ceil(steps * policy.num_workers / policy.needed) if policy.asynchronous else steps
            model = _straggler_model(args, args.model, policy.num_workers, args.seed + rep, 10**9)
            label = model.label + (f" (seeds {args.seed}..{args.seed + repeats - 1})" if repeats > 1 else "")
            rt = StragglerRuntime(policy, logistic_model(problem["dim"]), logistic_loss, problem["x"], problem["y"],
                                  lr=args.lr, l2=problem["l2"], straggler_model=model, per_sample_s=per_sample_s,
                                  step_timeout_s=args.step_timeout_s, pool=pool)
            t0 = time.perf_counter()
            try:
                result = rt.train(arm_steps)
            finally:
                rt.shutdown()
            runs[name].append((result, rt.feed))
            print(f"  [{model.label}] {name:22s} rep {rep + 1}: {len(result.records)} steps in "
                  f"{time.perf_counter() - t0:.1f} s, final loss {result.final_loss:.4f}"
                  f"{', STALLED: ' + result.stalled if result.stalled else ''}", flush=True)
    return runs, label


def _median(values: list[Any]) -> float | None:
    present = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(statistics.median(present)) if present else None


def _figures(runs: list, target_loss: float, problem: dict[str, Any]) -> dict[str, Any]:
    results = [r for r, _ in runs]
    feeds = [f for _, f in runs if f is not None]
    ttt = [r.time_to_target(target_loss) for r in results]
    reached = [t for t in ttt if t is not None]
    total_s = [float(r.step_times.sum()) for r, f in runs if f is not None]
    first = feeds[0] if feeds else None
    return {
        "time_to_target_s": _median(reached) if len(reached) * 2 > len(ttt) else None,  # None unless most reached it
        "steps_to_target": _median([next((i + 1 for i, rec in enumerate(r.records) if rec.loss <= target_loss), None)
                                    for r in results]),
        "final_loss": _median([r.final_loss for r in results]),
        "final_accuracy": _median([_accuracy(r.params, problem["x_test"], problem["y_test"]) for r in results]),
        "norm_ratio_high_low": _median([f.stats()["high_low_grad_norm_ratio"] for f in feeds]) if feeds else None,
        "deriver_overhead_fraction": (_median([f.cost_s / t for f, t in zip(feeds, total_s) if t > 0]) if feeds
                                      else 0.0),
        "deriver_ms_per_step": _median([1e3 * f.cost_s / max(1, len(r.records)) for r, f in runs if f is not None]),
        "scheduler_cpu_ms_per_step": _median([1e3 * cpu_s / max(1, len(r.records)) for r, f in runs
                                              if f is not None and (cpu_s := f.stats()["scheduler_cpu_s"])]),
        "step_time_p50_s": _median([r.step_time_quantile(0.5) for r in results]),
        "k_over_time": [[s, round(k, 4)] for s, k in first.k_history] if first else None,
        "weights_over_time": [[s, list(w)] for s, w in first.weight_history] if first else None,
        "applied_per_step": _median([statistics.mean(len(rec.combination.weights) for rec in r.records)
                                     for r in results if r.records]),
        "max_staleness": max((rec.combination.max_staleness for r in results for rec in r.records), default=0),
        "stalled": next((r.stalled for r in results if r.stalled), None),
        "steps": max(len(r.records) for r in results),
    }


def _target(value: float | None, target: str, met: bool) -> dict[str, Any]:
    return {"value": value, "target": target, "met": bool(met)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def priority_arms(arms: dict[str, Any]) -> list[str]:
    """The arms that choose gradients by priority: top-K by priority, every weight setting. Not
    ``topk-random`` (the same K by chance: the control) and not ``async`` (no priority at all)."""
    return [a for a in arms if a.startswith("topk") and a != "topk-random"]


def _targets(arms: dict[str, dict[str, Any]], grid: tuple) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Targets and the headline: the priority arms against ignore-stragglers (the same arrivals,
    averaged) and against random top-K (the same K, chosen by chance), on time to target. ``topk-tuned``
    (weights tuned by the deriver, the library's default) is the headline arm; ``async``, which uses no
    priority, is reported apart (``async_time_to_target_vs_sync``)."""
    sync, ignore, rnd = (arms[a]["time_to_target_s"] for a in ("sync", "ignore-stragglers", "topk-random"))
    mine = priority_arms(arms)
    timed = {a: arms[a]["time_to_target_s"] for a in mine if arms[a]["time_to_target_s"] is not None}
    best = min(timed, key=lambda a: timed[a]) if timed else None
    headline = {a: {"over_ignore_stragglers": _ratio(arms[a]["time_to_target_s"], ignore),
                    "over_topk_random": _ratio(arms[a]["time_to_target_s"], rnd),
                    "over_sync": _ratio(arms[a]["time_to_target_s"], sync)} for a in mine}
    t: dict[str, dict[str, Any]] = {}
    tuned = headline["topk-tuned"]
    # a priority worth having is faster than what it adds to: 5% beyond the arms it refines
    t["topk_tuned_over_ignore_stragglers"] = _target(tuned["over_ignore_stragglers"], "<= 0.95",
                                                     tuned["over_ignore_stragglers"] is not None
                                                     and tuned["over_ignore_stragglers"] <= 0.95)
    t["topk_tuned_over_topk_random"] = _target(tuned["over_topk_random"], "<= 0.95",
                                               tuned["over_topk_random"] is not None and tuned["over_topk_random"] <= 0.95)
    ratio = _ratio(timed.get(best) if best else None, sync)
    t["best_priority_arm_time_to_target_vs_sync"] = _target(ratio, f"<= 0.8 ({best}; top-K by priority only)",
                                                            ratio is not None and ratio <= 0.8)
    sync_acc = arms["sync"]["final_accuracy"]
    acc_gap = sync_acc - arms[best]["final_accuracy"] if best and sync_acc is not None else None
    t["best_priority_arm_accuracy_gap_points"] = _target(acc_gap, f"<= 0.5 points below sync ({best})",
                                                         acc_gap is not None and acc_gap <= 0.5)
    fixed = {_grid_name(w): arms[_grid_name(w)]["time_to_target_s"] for w in grid}
    fixed_reached = {a: v for a, v in fixed.items() if v is not None}
    tuned_s = arms["topk-tuned"]["time_to_target_s"]
    best_fixed = min(fixed_reached.values()) if fixed_reached else None
    r = tuned_s / best_fixed if tuned_s is not None and best_fixed else None
    t["tuned_vs_best_fixed_time_to_target"] = _target(
        r, f"<= 1.05 (best of {len(grid)} fixed settings{'' if len(grid) == 6 else ', NOT all six'})",
        tuned_s is not None and (best_fixed is None or r is not None and r <= 1.05))
    overhead = max((a["deriver_overhead_fraction"] for a in arms.values() if a["deriver_overhead_fraction"]),
                   default=0.0)
    t["deriver_overhead_fraction_max"] = _target(overhead, "< 0.005", overhead < 0.005)
    return t, {"best_priority_arm": best, "priority_arms": headline,
               "async_time_to_target_vs_sync": _ratio(arms["async"]["time_to_target_s"], sync)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from pdml_ray.bench.common import check_device, finish, init_ray, print_table
    from pdml_ray.bench.stragglers import _overhead
    from pdml_ray.errors import ConfigError
    from pdml_ray.runtime.stragglers import WorkerPool

    check_device(args.device)
    if args.device == "cuda":
        print("note: the logistic-regression workload is tiny; it runs on the CPU whatever --device says")
    if not (1 <= args.stragglers < args.workers):
        raise ConfigError(f"--stragglers must be in [1, workers={args.workers}) (with 0 every policy is sync)")
    steps = args.steps or (30 if args.quick else 40)
    repeats = args.repeats or (1 if args.quick else 3)
    per_partition_ms = args.per_partition_ms or (60.0 if args.quick else 80.0)
    sweep = args.fixed_sweep if args.fixed_sweep is not None else (3 if args.quick else 6)
    grid = {0: (), 3: QUICK_GRID, 6: GRID}[sweep]
    n = args.workers
    problem = _problem(n, args.seed)
    target_loss = problem["best_loss"] + 0.05 * (problem["initial_loss"] - problem["best_loss"])
    per_sample_s = per_partition_ms / 1e3 / (len(problem["x"]) // n)
    arms = _arms(args, grid)
    print(f"bench gradients: n={n} workers, s={args.stragglers}, model {args.model}, {steps} steps x {repeats} "
          f"repeat(s), {len(arms)} arms; EMULATED compute {per_partition_ms:g} ms per partition x straggler factor; "
          f"target loss {target_loss:.4f} (L* {problem['best_loss']:.4f}, L0 {problem['initial_loss']:.4f}); "
          f"held-out accuracy at L*: {problem['best_accuracy']:.2f}%", flush=True)
    started_here = not ray.is_initialized()
    if started_here:
        init_ray(max(4, n // 2 + 1))
    pool = WorkerPool(num_cpus_per_worker=0.25)
    t0 = time.perf_counter()
    try:
        overhead_s = _overhead(args, (problem["x"], problem["y"], problem["l2"], problem["dim"], None, None), pool)
        print(f"runtime overhead: {overhead_s * 1e3:.1f} ms per step (sync, no emulated compute)", flush=True)
        runs, label = _run_arms(args, arms, steps, repeats, problem, pool, per_sample_s)
    finally:
        pool.shutdown()
        if started_here:
            ray.shutdown()
    figures = {a: _figures(runs[a], target_loss, problem) for a in arms}
    sync_ttt = figures["sync"]["time_to_target_s"]
    for f in figures.values():
        f["time_to_target_vs_sync"] = (f["time_to_target_s"] / sync_ttt
                                       if f["time_to_target_s"] is not None and sync_ttt else None)
    targets, comparison = _targets(figures, grid)
    rows = [[a, f["time_to_target_s"], f["time_to_target_vs_sync"], f["steps_to_target"], f["final_loss"], f["final_accuracy"],
             f["norm_ratio_high_low"], (f["deriver_overhead_fraction"] or 0.0) * 100, f["applied_per_step"],
             f["step_time_p50_s"] * 1e3 if f["step_time_p50_s"] else None,
             f["k_over_time"][-1][1] if f["k_over_time"] else "", f["stalled"] or ""] for a, f in figures.items()]
    print_table(["arm", "to_target_s", "vs_sync", "steps", "final_loss", "accuracy%", "hi/lo_norm", "deriver%", "applied",
                 "p50_ms", "K_last", ""], rows,
                title=f"bench gradients [{label}] (EMULATED compute and stragglers; medians of {repeats} repeat(s))")
    for name, t in targets.items():
        v = t["value"]
        print(f"  target {'met    ' if t['met'] else 'MISSED '} {name}: {v if v is None else round(v, 4)} "
              f"(target {t['target']})")
    def shown_ratio(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    print_table(["priority arm (top-K by priority)", "over ignore-stragglers", "over topk-random", "over sync"],
                [[a, shown_ratio(h["over_ignore_stragglers"]), shown_ratio(h["over_topk_random"]),
                  shown_ratio(h["over_sync"])] for a, h in comparison["priority_arms"].items()],
                title="headline: time to target, < 1 = the priority arm is faster")
    print(f"  async (bounded staleness, no priority), reported apart: "
          f"{shown_ratio(comparison['async_time_to_target_vs_sync'])} x sync's time to target")
    result: dict[str, Any] = {
        "workers": n, "stragglers": args.stragglers, "straggler_model": label, "steps": steps, "repeats": repeats,
        "per_partition_ms": per_partition_ms, "lr": args.lr, "target_loss": target_loss,
        "optimal_loss": problem["best_loss"], "initial_loss": problem["initial_loss"],
        "optimal_accuracy": problem["best_accuracy"], "held_out_samples": HELD_OUT,
        "fixed_weight_settings": [list(w) for w in grid], "fixed_sweep_complete": len(grid) == 6,
        "ray_overhead_step_s": overhead_s, "arms": figures, **comparison, "targets": targets,
        "wall_s": time.perf_counter() - t0,
    }
    emulated = {"compute": f"EMULATED: real gradients, then a sleep of {per_partition_ms:g} ms per partition "
                           "x the straggler model's factor (cut short when the step is over; async: only once more than S steps stale)",
                "stragglers": label,
                "deriver": "real: the run's scheduler actor (its gradient deriver), fed and polled inside the timed step",
                "accuracy": f"held-out: {HELD_OUT} samples from the same generator, never trained on"}
    # the workload ran on the CPU whatever --device asked for: the machine record names what really ran it
    return finish(argparse.Namespace(**{**vars(args), "device": "cpu"}), result, emulated)
