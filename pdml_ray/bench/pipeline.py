"""``pdml-ray bench pipeline``: osprey vs static pipeline schedules, in the simulator and on Ray actors.

Simulated grid: stages {4, 8} x replicas {1, 4} x micro-batches {16, 64} x profiles
homogeneous / heterogeneous (replica speeds uniform in [0.8, 1.2], one replica at half speed) / noisy
(lognormal noise sigma 0.2, per-micro-batch variation 0.1, speed drift 0.05 per step), each over
``--seeds`` seeds (speeds, noise and drift drawn per seed). Every schedule runs the same simulated
steps (same noise per step); the memory limit is ``stages`` activations per replica, 1F1B's own
peak, so no schedule gets more memory than 1F1B uses. Two baselines: plain 1F1B (round-robin) and
``1f1b-weighted`` (1F1B with micro-batches in proportion to the replicas' measured speeds, what a
careful engineer would configure by hand). Beside them every schedule torch ships, from the orders its
own classes generate (``pdml_ray.pipeline.torch_orders``: one pipeline per replica, two-chunk schedules
on half-cost chunks, torch's size rules applied: a schedule a cell's shape does not fit is listed in
``not_applicable``); ``best_static`` is the fastest static order of the cell, the project's or torch's,
and ``osprey_over_best_static`` osprey's makespan over it. ``lower_bound_s`` is the bound of osprey's
own action set (F + B, one chunk per stage); ``lower_bound_any_s`` the least over every schedule's
(split backward and two chunks lower it). Per seed, figures are steady-state medians over the
second half of the steps; per cell, the median and the worst over seeds. ``warmup_steps`` is the
first step at which osprey's makespan is within 5% of its steady state. Targets are judged on the
per-cell median over seeds, worst cell (``basis`` in the JSON); the worst single seed is reported
beside it. The simulated grid runs on no device at all.

The ``ray`` section runs the real Ray-actor pipeline (``pdml_ray.bench.pipeline_actors``) with one
EMULATED slow replica; by default compute is EMULATED too (``--compute sleep``): six actors on two
cores cannot show a schedule's effect with real compute. It reports paired per-round ratios.

The ``torch_runtime`` section (``pdml_ray.bench.pipeline_torch``; ``--no-torch-runtime`` skips it) runs
registry plans on torch.distributed.pipelining's own runtime against torch's schedule classes running
the same order: two gloo ranks, real compute, nothing emulated but osprey's latencies.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Any, Iterator, Sequence

from pdml_ray.bench.common import init_ray, ratio_key
from pdml_ray.errors import UsageError
from pdml_ray.pipeline.registry import ALL_SCHEDULES, PROJECT_SCHEDULES, STATIC_SCHEDULES, TORCH_SCHEDULES

DESCRIPTION = ("pipeline schedules: osprey vs GPipe / 1F1B / speed-weighted 1F1B / critical path / every schedule "
               "torch ships (simulated grid over seeds + Ray actors)")

SCHEDULES = tuple(ALL_SCHEDULES)  # every registered schedule, the project's then torch's, in registry order
STATIC = STATIC_SCHEDULES + tuple(TORCH_SCHEDULES)
"""The static orders ``best_static`` is picked from, per cell: the project's and torch's."""
BASELINES = ("1f1b", "1f1b-weighted")  # osprey's ratios are reported against both
TARGETS = {"heterogeneous_osprey_over_1f1b": 0.8, "heterogeneous_osprey_over_lower_bound": 1.15,
           "homogeneous_osprey_over_1f1b": 1.03, "warmup_steps": 10, "memory_violations": 0}
DEFAULT_SEEDS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pdml_ray.bench.common import add_compute_argument

    parser.add_argument("--steps", type=int, help="simulated global steps per case (default 16, quick 10)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                        help=f"seeds per grid cell, --seed, --seed + 1, ... (default {DEFAULT_SEEDS})")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray-actor comparison")
    parser.add_argument("--scenarios", type=_scenario_names, default=None,
                        help="non-stationary scenarios to run, comma-separated from "
                             "homogeneous,drift,uneven,comm-delay,memory-cap,slow-stage (default all, but slow-stage "
                             "only when named with --quick; 'none' skips them)")
    parser.add_argument("--no-torch-runtime", action="store_true",
                        help="skip the torch-runtime section (registry plans on torch.distributed.pipelining's runtime "
                             "vs torch's own schedule classes, two gloo ranks, a few seconds)")
    parser.add_argument("--ray-steps", type=int, help="timed rounds of the Ray-actor comparison (default 16, quick 6)")
    # The Ray-actor run's compute defaults to sleep here: real compute on a few shared cores measures
    # CPU contention, not the schedule.
    add_compute_argument(parser, default="sleep", help_text=(
        "compute of the Ray-actor run. sleep (default here): each action runs a small real forward/backward, "
        "then sleeps micro-batch samples x --per-sample-ms / speed (x2 for a backward): EMULATED compute, so six "
        "actors on a few cores keep their speeds; real: a larger MLP's own compute, the slow replica sleeping "
        "(1/speed - 1) x its compute"))


def _scenario_names(text: str) -> tuple[str, ...]:
    """The names in ``text``, or none for 'none'. A tuple: the CLI reads an empty list as a bare ``--``."""
    from pdml_ray.pipeline.scenarios import SCENARIOS

    names = () if text.strip() == "none" else tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {unknown}; valid names: {list(SCENARIOS)} or none")
    return names


_scenario_names.__name__ = "scenario names"


def _grid(quick: bool) -> list[tuple[int, int, int, str]]:
    if quick:
        return [(s, r, 16, p) for s in (4, 8) for r in (1, 4) for p in ("homogeneous", "heterogeneous", "noisy")]
    return [(s, r, m, p) for s in (4, 8) for r in (1, 4) for m in (16, 64)
            for p in ("homogeneous", "heterogeneous", "noisy")]


def run_case(stages: int, replicas: int, microbatches: int, profile_name: str, steps: int, seed: int) -> dict[str, Any]:
    """One grid cell on one seed: steady-state medians of every schedule and osprey's ratios."""
    from pdml_ray.config import PipelineConfig
    from pdml_ray.pipeline.simulate import ClusterProfile, compare_in_simulation, steady_state

    from pdml_ray.errors import ConfigError

    profile = ClusterProfile.build(stages, replicas, profile=profile_name, seed=seed, memory_limit=stages)
    res: dict[str, dict[str, Any]] = {}
    not_applicable: dict[str, str] = {}
    for name in SCHEDULES:
        try:
            res |= compare_in_simulation(profile, microbatches, [name], steps=steps,
                                         config=PipelineConfig(memory_limit=stages), seed=seed)
        except ConfigError as err:  # torch's own size rules (e.g. DualPipeV needs micro-batches >= stages)
            if name not in TORCH_SCHEDULES:
                raise
            not_applicable[name] = str(err)
    steady = steady_state(res, steps // 2)
    med, lower = steady["makespan_s"], steady["schedule_lower_bound_s"]["osprey"]
    best = min((n for n in STATIC if n in med), key=lambda n: med[n])
    osprey = res["osprey"]["makespan_s"]
    warmup = next(t for t, x in enumerate(osprey) if x <= 1.05 * med["osprey"])
    return {"stages": stages, "replicas": replicas, "microbatches": microbatches, "profile": profile_name,
            "seed": seed, "makespan_s": med, "bubble_fraction": steady["bubble_fraction"], "lower_bound_s": lower,
            "lower_bound_any_s": steady["lower_bound_s"], "not_applicable": not_applicable,
            "best_static": {"name": best, "makespan_s": med[best]},
            **{ratio_key("osprey", b): med["osprey"] / med[b] for b in BASELINES},
            "osprey_over_best_static": med["osprey"] / med[best],
            "osprey_over_lower_bound": med["osprey"] / lower, "warmup_steps": warmup,
            "memory_violations": {n: r["memory_violations"] for n, r in res.items()},
            "peak_activations": {n: max(r["peak_memory"].values()) for n, r in res.items()},
            "auto": {k: res["auto"]["decision"].get(k) for k in ("schedule", "reason")}}


RATIOS = tuple(ratio_key("osprey", b) for b in BASELINES) + ("osprey_over_best_static", "osprey_over_lower_bound")


def summarize_cell(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One grid cell over seeds: medians of every figure, ``<ratio>_worst`` (largest over seeds) and
    the per-seed ratios; warm-up steps and peaks are worst cases, memory violations totals."""
    first = runs[0]
    med = statistics.median
    cell: dict[str, Any] = {k: first[k] for k in ("stages", "replicas", "microbatches", "profile")}
    cell["seeds"] = [r["seed"] for r in runs]
    cell["makespan_s"] = {n: med(r["makespan_s"][n] for r in runs) for n in first["makespan_s"]}
    cell["bubble_fraction"] = {n: med(r["bubble_fraction"][n] for r in runs) for n in first["bubble_fraction"]}
    cell["lower_bound_s"] = med(r["lower_bound_s"] for r in runs)
    cell["lower_bound_any_s"] = med(r["lower_bound_any_s"] for r in runs)
    cell["not_applicable"] = first["not_applicable"]
    # The best static schedule of the cell: least median makespan over seeds (each seed's own best is
    # what osprey_over_best_static divides by).
    best = min((n for n in STATIC if n in cell["makespan_s"]), key=lambda n: cell["makespan_s"][n])
    cell["best_static"] = {"name": best, "makespan_s": cell["makespan_s"][best],
                           "per_seed": [r["best_static"]["name"] for r in runs]}
    for key in RATIOS:
        values = [r[key] for r in runs]
        cell[key], cell[f"{key}_worst"], cell[f"{key}_per_seed"] = med(values), max(values), values
    cell["warmup_steps"] = max(r["warmup_steps"] for r in runs)
    cell["memory_violations"] = {n: sum(r["memory_violations"][n] for r in runs) for n in first["memory_violations"]}
    cell["peak_activations"] = {n: max(r["peak_activations"][n] for r in runs) for n in first["peak_activations"]}
    cell["auto"] = [r["auto"] for r in runs]
    return cell


def measure_speed(seed: int, repeats: int = 9) -> dict[str, float]:
    """Simulator ms per step and osprey's decision time per micro-batch at 8 stages x 4 replicas x 64."""
    import os

    from pdml_ray.config import PipelineConfig
    from pdml_ray.pipeline.osprey import OspreySchedule
    from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator

    S, R, M = 8, 4, 64
    sim = PipelineSimulator(ClusterProfile.build(S, R, profile="noisy", seed=seed, memory_limit=S), seed)
    osprey = OspreySchedule(stages=S, replicas=(R,) * S, microbatches=M, config=PipelineConfig(memory_limit=S))
    osprey.observe(sim.run_step(osprey.plan(0), 0).measurements)
    sim_s, plan_s = [], []
    for step in range(1, repeats + 1):
        t0 = time.perf_counter()
        plan = osprey.plan(step)
        t1 = time.perf_counter()
        result = sim.run_step(plan, step)
        t2 = time.perf_counter()
        osprey.observe(result.measurements)
        plan_s.append(t1 - t0)
        sim_s.append(t2 - t1)
    # Medians and bests over the repeats; the load average says how busy the machine was meanwhile.
    return {"sim_step_ms": 1e3 * statistics.median(sim_s), "sim_step_ms_best": 1e3 * min(sim_s),
            "decision_us_per_microbatch": 1e6 * statistics.median(plan_s) / M,
            "decision_us_per_microbatch_best": 1e6 * min(plan_s) / M,
            "load_average_1min": os.getloadavg()[0]}


def run_ray(args: argparse.Namespace) -> dict[str, Any]:
    if args.no_ray:
        return {"skipped": "--no-ray"}
    try:
        from pdml_ray.bench.pipeline_actors import compare_schedules
    except ImportError:
        return {"skipped": "runtime not available"}
    try:
        return compare_schedules("1f1b", "osprey", quick=args.quick, seed=args.seed, steps=args.ray_steps,
                                 compute=args.compute, per_sample_ms=args.per_sample_ms, also=("1f1b-weighted",))
    except Exception as exc:  # a failed Ray run must not discard the simulated grid
        return {"error": f"{type(exc).__name__}: {exc}", "compute": args.compute}


def run_planning(args: argparse.Namespace) -> dict[str, Any]:
    """What planning through the run's scheduler actor costs the driver (``pdml_ray.bench.pipeline_planning``)."""
    if args.no_ray:
        return {"skipped": "--no-ray"}
    from pdml_ray.bench.pipeline_planning import measure_planning

    try:
        return measure_planning(steps=8 if args.quick else 20, repeats=2 if args.quick else 3, seed=args.seed)
    except Exception as exc:  # a failed measurement must not discard the simulated grid
        return {"error": f"{type(exc).__name__}: {exc}"}


@contextlib.contextmanager
def _ray_session(args: argparse.Namespace) -> Iterator[None]:
    """One Ray instance for both Ray sections (each start costs seconds on a small machine): the running
    one, the cluster in RAY_ADDRESS, or a private local one with a logical CPU for each of the Ray
    section's 3 x 2 stage actors; stops only what it started."""
    if args.no_ray:
        yield
        return
    import ray

    started = not ray.is_initialized()
    if started:
        init_ray(max(os.cpu_count() or 1, 6))
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def run_torch_runtime(args: argparse.Namespace) -> dict[str, Any]:
    """Registry plans on torch's own pipeline runtime vs torch's schedule classes (``pdml_ray.bench.pipeline_torch``)."""
    from pdml_ray.bench.pipeline_torch import TARGETS as TORCH_RUNTIME_TARGETS, measure_torch_runtime

    if args.no_torch_runtime:
        return {"skipped": "--no-torch-runtime", "targets": {}}

    try:
        return measure_torch_runtime(quick=args.quick, seed=args.seed)
    except Exception as exc:  # a failed measurement must not discard the simulated grid, and misses its targets
        error = f"{type(exc).__name__}: {exc}"
        return {"error": error, "targets": {name: {"value": float("nan"), "target": target, "met": False,
                                                   "basis": f"not measured: {error}"}
                                            for name, target in TORCH_RUNTIME_TARGETS.items()}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pdml_ray.bench.common import finish, print_table

    if args.device != "cpu":
        # Nothing here can use a GPU yet: the grid is a simulation, the stage actors compute on the CPU.
        raise UsageError(f"bench pipeline: --device {args.device} is not supported: the grid is a discrete-event "
                         "simulation (no device) and the Ray-actor stages run on the CPU (--compute sleep emulates "
                         "their compute time); run it with --device cpu")
    if args.seeds < 1 or (args.steps is not None and args.steps < 2):
        raise UsageError(f"--seeds must be >= 1 and --steps >= 2, got {args.seeds} and {args.steps}")
    steps = args.steps or (10 if args.quick else 16)
    seeds = [args.seed + i for i in range(args.seeds)]
    t0 = time.perf_counter()
    grid, cells = [], _grid(args.quick)
    for i, (s, r, m, p) in enumerate(cells, 1):
        print(f"grid cell {i}/{len(cells)}: {s}x{r}x{m} {p}, {len(seeds)} seed(s) x {steps} steps ...", flush=True)
        grid.append(summarize_cell([run_case(s, r, m, p, steps, seed) for seed in seeds]))
    speed = measure_speed(args.seed)
    _print_grid(grid, steps, seeds, print_table)
    print(f"simulator {speed['sim_step_ms']:.2f} ms per step (best {speed['sim_step_ms_best']:.2f}), osprey decision "
          f"{speed['decision_us_per_microbatch']:.1f} us per micro-batch (best {speed['decision_us_per_microbatch_best']:.1f}); "
          f"8 stages x 4 replicas x 64 micro-batches, load average {speed['load_average_1min']:.1f}")
    summary = _summary(grid)
    for profile, figures in summary.items():
        print(f"{profile} (replicas > 1, SIMULATED): " + "; ".join(
            f"{k.replace('_', ' ')} median {v['median']:.3f}, worst cell median {v['worst_cell_median']:.3f}, "
            f"worst seed {v['worst_seed']:.3f}" for k, v in figures.items()))
    targets = check_targets(grid, len(seeds))
    for name, t in targets.items():
        print(f"target {name}: {'met' if t['met'] else 'NOT met'} ({t['basis']}: {t['value']:.4g}, target "
              f"{t['target']}; worst single seed {t['worst_seed_value']:.4g}: "
              f"{'met' if t['met_every_seed'] else 'not met'} on every seed)")
    scenarios = run_scenario_section(args, seeds, steps)
    targets.update(scenarios["targets"])
    # before the Ray section: its paired step times are the run's most load-sensitive figure, and a local
    # Ray instance's processes keep loading the cores for a while after it stops
    from pdml_ray.bench.pipeline_torch import torch_runtime_line

    torch_runtime = run_torch_runtime(args)
    print(torch_runtime_line(torch_runtime))
    for name, t in torch_runtime["targets"].items():
        print(f"target {name}: {'met' if t['met'] else 'NOT met'} ({t['basis']}: {t['value']:.4g}, target {t['target']})")
    targets.update(torch_runtime["targets"])
    with _ray_session(args):
        ray_section = run_ray(args)
        print(_ray_line(ray_section))
        planning = run_planning(args)
    if "actor_blocked_s_per_step" in planning:
        targets["planning_actor_blocked_over_in_process"] = planning["target"]
        print(f"planning ({planning['stages']} stages x {planning['replicas']} replicas x {planning['microbatches']} "
              f"micro-batches, {planning['schedule']}; steps EMULATED): blocked {1e3 * planning['actor_blocked_s_per_step']:.2f} "
              f"ms per step through the scheduler actor, fetched ahead, vs {1e3 * planning['in_process_plan_s_per_step']:.2f} "
              f"ms planning in-process ({planning['actor_blocked_over_in_process']:.2f}x, target <= "
              f"{planning['target']['target']}); planning ahead costs osprey "
              f"{planning['plan_ahead_makespan_over_fresh']:.3f}x in simulated makespan")
    from pdml_ray.pipeline.torch_orders import ADJUSTMENTS, SUPPORTED_TORCH

    result = {"grid": grid, "schedules": list(SCHEDULES), "baselines": list(BASELINES), "steps": steps,
              "torch_orders": {"torch": SUPPORTED_TORCH, "adjustments": {k: v for k, v in ADJUSTMENTS.items() if v}},
              "seeds": seeds, "summary": summary, "scenarios": scenarios, **speed, "targets": targets,
              "ray": ray_section, "planning": planning, "torch_runtime": torch_runtime,
              "compute": ray_section.get("compute", "none (Ray run skipped)"),
              "devices": {"grid": "none: discrete-event simulator, no model runs",
                          "ray": "cpu" if "skipped" not in ray_section else "not run",
                          "torch_runtime": "cpu, gloo" if "pairs" in torch_runtime else "not run"},
              "wall_s": time.perf_counter() - t0}
    emulated = {"simulated": "discrete-event pipeline simulator (pdml_ray.pipeline.simulate); no model is trained "
                             "in the grid and no device is used",
                "speeds": "heterogeneous: uniform [0.8, 1.2] per replica, one replica of the middle stage at half",
                "noise": "noisy: lognormal sigma 0.2 per action, micro-batch cv 0.1, drift 0.05 per step",
                "memory_limit": "stages activations per replica (1F1B's peak)",
                "scenarios": "non-stationary scenarios SIMULATED (pdml_ray.pipeline.scenarios): a replica slowed for a "
                             "window of steps, long-tailed sequence lengths (attention quadratic), late transfers, a "
                             "memory cap below 1F1B's warm-up (lengths truncated at it); every schedule is told each step's "
                             "micro-batch lengths a step ahead (osprey plans on them, static orders ignore them); "
                             "osprey plans one step ahead through the scheduler",
                "torch_schedules": "torch's generated orders, one pipeline per data-parallel replica; a two-chunk "
                                   "schedule's chunks each cost half their rank's stage (and hold half its activation)",
                "ray": "one EMULATED slow replica in the Ray-actor run",
                "planning": planning.get("emulated", "planning not measured"),
                "compute": ray_section.get("emulated", "Ray run not made"),
                "torch_runtime": torch_runtime.get("emulated", "torch-runtime section not run")}
    # The machine record names the device that actually ran something: the CPU for the stage actors,
    # none at all when only the simulator ran.
    ran_on_cpu = "skipped" not in ray_section or "pairs" in torch_runtime
    used = argparse.Namespace(**{**vars(args), "device": "cpu" if ran_on_cpu else "none"})
    return finish(used, result, emulated)


def run_scenario_section(args: argparse.Namespace, seeds: list[int], steps: int) -> dict[str, Any]:
    """The non-stationary scenarios (``pdml_ray.bench.pipeline_scenarios``): records, summary, targets."""
    from pdml_ray.bench.common import print_table
    from pdml_ray.bench.pipeline_scenarios import (check_targets as scenario_targets, default_scenarios, rebalance_lines,
                                                   run_scenarios, summarize)

    names = default_scenarios(args.quick) if args.scenarios is None else args.scenarios
    if not names:
        return {"skipped": "--scenarios none", "targets": {}}
    records = run_scenarios(quick=args.quick, seeds=seeds, steps=steps, scenarios=names)
    rows = [[r["scenario"], r["stages"], r["replicas"], r["microbatches"], r["makespan_s"]["osprey"],
             f"{r['best_static']['name']} {r['best_static']['makespan_s']:.4g}",
             f"{r['osprey_over_best_static']:.3f} ({r['osprey_over_best_static_worst']:.3f})",
             f"{r['osprey_over_lower_bound']:.3f}", r["memory_violations"]["osprey"],
             sum(1 for n, v in r["memory_violations"].items() if n != "osprey" and v > 0)] for r in records]
    print_table(["scenario", "S", "R", "M", "osprey", "best static", "osp/best (worst)", "osp/LB", "osp_mem_viol",
                 "statics over cap"], rows,
                title=f"SIMULATED non-stationary scenarios: mean makespan (s) over steps 2..{steps - 1}, median over "
                      f"seeds {seeds}; osprey plans one step ahead")
    for line in rebalance_lines(records):
        print(line)
    targets = scenario_targets(records)
    for name, t in targets.items():
        bound = "" if "lower_bound_value" not in t else (
            f"; the lower bound's same figure {t['lower_bound_value']:.4g}: "
            + ("attainable" if t["attainable"] else "no schedule can meet it"))
        print(f"target {name}: {'met' if t['met'] else 'NOT met'} ({t['basis']}: {t['value']:.4g}, target {t['target']}{bound})")
    return {"records": records, "summary": summarize(records), "targets": targets}


def _print_grid(grid: list[dict[str, Any]], steps: int, seeds: list[int], print_table: Any) -> None:
    def both(c: dict[str, Any], key: str) -> str:
        return f"{c[key]:.3f} ({c[key + '_worst']:.3f})"

    rows = [[c["stages"], c["replicas"], c["microbatches"], c["profile"], c["makespan_s"]["gpipe"],
             c["makespan_s"]["1f1b"], c["makespan_s"]["1f1b-weighted"], c["makespan_s"]["critical-path"],
             c["makespan_s"]["osprey"], c["makespan_s"]["auto"],
             f"{c['best_static']['name']} {c['best_static']['makespan_s']:.4g}", c["lower_bound_s"],
             both(c, "osprey_over_1f1b"), both(c, "osprey_over_1f1b_weighted"), both(c, "osprey_over_best_static"),
             both(c, "osprey_over_lower_bound"), c["warmup_steps"], c["memory_violations"]["osprey"]] for c in grid]
    print_table(["S", "R", "M", "profile", "gpipe", "1f1b", "1f1b-w", "crit-path", "osprey", "auto", "best static",
                 "lower_bd", "osp/1f1b (worst)", "osp/1f1b-w (worst)", "osp/best (worst)", "osp/LB (worst)", "warmup",
                 "osp_mem_viol"], rows,
                title=f"SIMULATED steady-state makespan (s): median over {len(seeds)} seeds {seeds} of each seed's "
                      f"median of steps {steps // 2}..{steps - 1}; ratios: median over seeds (worst seed)")


def _summary(grid: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per profile, over cells with replicas > 1 (where re-assignment is possible): osprey's ratios to
    both baselines, the median and worst of the per-cell medians and the worst single seed."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for profile in ("homogeneous", "heterogeneous", "noisy"):
        cells = [c for c in grid if c["profile"] == profile and c["replicas"] > 1]
        if cells:
            out[profile] = {key: {"median": float(statistics.median(c[key] for c in cells)),
                                  "worst_cell_median": max(c[key] for c in cells),
                                  "worst_seed": max(c[f"{key}_worst"] for c in cells)}
                            for key in (ratio_key("osprey", b) for b in BASELINES)}
    return out


def check_targets(grid: list[dict[str, Any]], num_seeds: int) -> dict[str, dict[str, Any]]:
    """Each target on the cells it applies to (replicas > 1 for re-balancing targets).

    Ratio targets are judged on each cell's median over seeds, worst cell; ``worst_seed_value`` is
    the worst single seed of any cell and ``met_every_seed`` whether that one meets the target too.
    Warm-up is the worst over all cells and seeds, memory violations the total over them.
    """
    hetero = [c for c in grid if c["profile"] == "heterogeneous" and c["replicas"] > 1]
    homo = [c for c in grid if c["profile"] == "homogeneous"]
    basis = f"worst cell of the per-cell median over {num_seeds} seeds"

    def ratio(cells: list[dict[str, Any]], key: str, target: float) -> dict[str, Any]:
        worst = max(cells, key=lambda c: c[key])
        worst_seed = max(c[f"{key}_worst"] for c in cells)
        return {"value": float(worst[key]), "target": target, "met": bool(worst[key] <= target), "basis": basis,
                "worst_cell": f"{worst['stages']}x{worst['replicas']}x{worst['microbatches']} {worst['profile']}",
                "worst_seed_value": float(worst_seed), "met_every_seed": bool(worst_seed <= target)}

    targets = {
        "heterogeneous_osprey_over_1f1b": ratio(hetero, "osprey_over_1f1b", TARGETS["heterogeneous_osprey_over_1f1b"]),
        "heterogeneous_osprey_over_lower_bound": ratio(hetero, "osprey_over_lower_bound",
                                                       TARGETS["heterogeneous_osprey_over_lower_bound"]),
        "homogeneous_osprey_over_1f1b": ratio(homo, "osprey_over_1f1b", TARGETS["homogeneous_osprey_over_1f1b"]),
    }
    warmup = max(c["warmup_steps"] for c in grid)
    violations = sum(c["memory_violations"]["osprey"] for c in grid)
    for name, value, what in (("warmup_steps", warmup, "worst over all cells and seeds"),
                              ("memory_violations", violations, "osprey's total over all cells and seeds")):
        met = bool(value <= TARGETS[name])
        targets[name] = {"value": float(value), "target": TARGETS[name], "met": met, "basis": what,
                         "worst_seed_value": float(value), "met_every_seed": met}
    return targets


def _ray_line(ray: dict[str, Any]) -> str:
    """The console line of the Ray-actor run, saying what was emulated."""
    if "paired" not in ray:
        return f"Ray actors: {ray}"
    mode = ("compute EMULATED (sleep, " + f"{ray['per_sample_ms']:g} ms/sample)" if ray["compute"] == "sleep"
            else "compute real")
    parts = [f"{name.replace('_', ' ')}: paired median {p['median_ratio']:.3f} over {p['rounds']} rounds "
             f"(osprey faster in {p['rounds_method_faster']}, baseline in {p['rounds_baseline_faster']}, "
             f"sign test p={p['sign_test_p']:.2g}; ratio of medians {p['ratio_of_medians']:.3f})"
             for name, p in ray["paired"].items()]
    line = (f"Ray actors ({ray['stages']} stages x {ray['replicas']} replicas, {mode}, speeds EMULATED: "
            f"{ray['slow_replica']} at {ray['speeds'][ray['slow_replica']]}): " + "; ".join(parts))
    if ray.get("simulated_step_s"):
        line += "\n  median step s measured / simulated on the same costs: " + ", ".join(
            f"{name} {s['median_step_s']:.3f} / {ray['simulated_step_s'][name]:.3f}" for name, s in ray["schedules"].items())
    return line
