"""``pdml-ray bench pipeline``: osprey vs static pipeline schedules, in the simulator and on Ray actors.

Simulated grid: stages {4, 8} x replicas {1, 4} x micro-batches {16, 64} x profiles
homogeneous / heterogeneous (replica speeds uniform in [0.8, 1.2], one replica at half speed) / noisy
(lognormal noise sigma 0.2, per-micro-batch variation 0.1, speed drift 0.05 per step). Every schedule
runs the same simulated steps (same noise per step); the memory limit is ``stages`` activations per
replica, 1F1B's own peak, so no schedule gets more memory than 1F1B uses. Figures are steady-state
medians over the second half of the steps; ``warmup_steps`` is the first step at which osprey's
makespan is within 5% of its steady state. The ``ray`` section runs the real Ray-actor pipeline
(``pdml_ray.bench.pipeline_actors.compare_schedules``) with one emulated slow replica.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from pdml_ray.pipeline.registry import SCHEDULERS

DESCRIPTION = "pipeline schedules: osprey vs GPipe / 1F1B / critical path (simulated grid + Ray actors)"

SCHEDULES = tuple(SCHEDULERS)  # every registered schedule, in registry order
TARGETS = {"heterogeneous_osprey_over_1f1b": 0.8, "heterogeneous_osprey_over_lower_bound": 1.15,
           "homogeneous_osprey_over_1f1b": 1.03, "warmup_steps": 10, "memory_violations": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, help="simulated global steps per case (default 16, quick 10)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray-actor comparison")


def _grid(quick: bool) -> list[tuple[int, int, int, str]]:
    if quick:
        return [(s, r, 16, p) for s in (4, 8) for r in (1, 4) for p in ("homogeneous", "heterogeneous", "noisy")]
    return [(s, r, m, p) for s in (4, 8) for r in (1, 4) for m in (16, 64)
            for p in ("homogeneous", "heterogeneous", "noisy")]


def run_case(stages: int, replicas: int, microbatches: int, profile_name: str, steps: int, seed: int) -> dict[str, Any]:
    from pdml_ray.config import PipelineConfig
    from pdml_ray.pipeline.simulate import ClusterProfile, compare_in_simulation, steady_state

    profile = ClusterProfile.build(stages, replicas, profile=profile_name, seed=seed, memory_limit=stages)
    res = compare_in_simulation(profile, microbatches, SCHEDULES, steps=steps,
                                config=PipelineConfig(memory_limit=stages), seed=seed)
    steady = steady_state(res, steps // 2)
    med, lower = steady["makespan_s"], steady["lower_bound_s"]
    osprey = res["osprey"]["makespan_s"]
    warmup = next(t for t, x in enumerate(osprey) if x <= 1.05 * med["osprey"])
    return {"stages": stages, "replicas": replicas, "microbatches": microbatches, "profile": profile_name,
            "makespan_s": med, "bubble_fraction": steady["bubble_fraction"], "lower_bound_s": lower, "osprey_over_1f1b": med["osprey"] / med["1f1b"],
            "osprey_over_lower_bound": med["osprey"] / lower, "warmup_steps": warmup,
            "memory_violations": {n: r["memory_violations"] for n, r in res.items()},
            "peak_activations": {n: max(r["peak_memory"].values()) for n, r in res.items()},
            "auto": {k: res["auto"]["decision"].get(k) for k in ("schedule", "reason")}}


def measure_speed(seed: int, repeats: int = 9) -> dict[str, float]:
    """Simulator ms per step and osprey's decision time per micro-batch at 8 stages x 4 replicas x 64."""
    from pdml_ray.config import PipelineConfig
    from pdml_ray.pipeline.osprey import OspreyScheduler
    from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator

    S, R, M = 8, 4, 64
    sim = PipelineSimulator(ClusterProfile.build(S, R, profile="noisy", seed=seed, memory_limit=S), seed)
    osprey = OspreyScheduler(stages=S, replicas=(R,) * S, microbatches=M, config=PipelineConfig(memory_limit=S))
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
    import os

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
        return compare_schedules("1f1b", "osprey", quick=args.quick, seed=args.seed)
    except Exception as exc:  # a failed Ray run must not discard the simulated grid
        return {"error": f"{type(exc).__name__}: {exc}"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pdml_ray.bench.common import check_device, finish, print_table

    check_device(args.device)
    steps = args.steps or (10 if args.quick else 16)
    t0 = time.perf_counter()
    grid = [run_case(s, r, m, p, steps, args.seed) for s, r, m, p in _grid(args.quick)]
    speed = measure_speed(args.seed)
    rows = [[c["stages"], c["replicas"], c["microbatches"], c["profile"], c["makespan_s"]["gpipe"],
             c["makespan_s"]["1f1b"], c["makespan_s"]["critical-path"], c["makespan_s"]["osprey"],
             c["makespan_s"]["auto"], c["lower_bound_s"], c["osprey_over_1f1b"], c["osprey_over_lower_bound"],
             c["warmup_steps"], c["memory_violations"]["osprey"]] for c in grid]
    print_table(["S", "R", "M", "profile", "gpipe", "1f1b", "crit-path", "osprey", "auto", "lower_bd",
                 "osp/1f1b", "osp/LB", "warmup", "osp_mem_viol"], rows,
                title=f"simulated steady-state makespan (s), median of steps {steps // 2}..{steps - 1}")
    print(f"simulator {speed['sim_step_ms']:.2f} ms per step (best {speed['sim_step_ms_best']:.2f}), osprey decision "
          f"{speed['decision_us_per_microbatch']:.1f} us per micro-batch (best {speed['decision_us_per_microbatch_best']:.1f}); "
          f"8 stages x 4 replicas x 64 micro-batches, load average {speed['load_average_1min']:.1f}")
    targets = _check_targets(grid)
    for name, t in targets.items():
        print(f"target {name}: {'met' if t['met'] else 'NOT met'} (worst {t['worst']:.4g}, target {t['target']})")
    ray_section = run_ray(args)
    if "osprey_over_static" in ray_section:
        print(f"Ray actors: osprey / 1f1b step time = {ray_section['osprey_over_static']:.3f}")
    else:
        print(f"Ray actors: {ray_section}")
    result = {"grid": grid, "schedules": list(SCHEDULES), "steps": steps, **speed, "targets": targets,
              "ray": ray_section, "wall_s": time.perf_counter() - t0}
    emulated = {"simulated": "discrete-event pipeline simulator (pdml_ray.pipeline.simulate); no model is trained "
                             "in the grid",
                "speeds": "heterogeneous: uniform [0.8, 1.2] per replica, one replica of the middle stage at half",
                "noise": "noisy: lognormal sigma 0.2 per action, micro-batch cv 0.1, drift 0.05 per step",
                "memory_limit": "stages activations per replica (1F1B's peak)",
                "ray": "one emulated slow replica (sleep) in the Ray-actor run"}
    return finish(args, result, emulated)


def _check_targets(grid: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Worst case of each target over the cases it applies to (replicas > 1 for re-balancing targets)."""
    hetero = [c for c in grid if c["profile"] == "heterogeneous" and c["replicas"] > 1]
    homo = [c for c in grid if c["profile"] == "homogeneous"]
    checks = {
        "heterogeneous_osprey_over_1f1b": max(c["osprey_over_1f1b"] for c in hetero),
        "heterogeneous_osprey_over_lower_bound": max(c["osprey_over_lower_bound"] for c in hetero),
        "homogeneous_osprey_over_1f1b": max(c["osprey_over_1f1b"] for c in homo),
        "warmup_steps": max(c["warmup_steps"] for c in grid),
        "memory_violations": sum(c["memory_violations"]["osprey"] for c in grid),
    }
    return {k: {"worst": v, "target": TARGETS[k], "met": v <= TARGETS[k]} for k, v in checks.items()}
