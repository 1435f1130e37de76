"""``pdml-ray simulate``: what each pipeline schedule would do on your cluster, before spending GPU hours.

Describe the cluster (stages, replicas per stage, micro-batches, per-replica speeds, noise) and every
schedule runs for a few global steps in the discrete-event simulator (pdml_ray.pipeline.simulate);
the table shows steady-state makespan, bubble, peak activations and the ratio to 1F1B and to a lower
bound, and to 1F1B weighted by the replicas' measured speeds (``1f1b-weighted``, the hand-tuned static
baseline). All of it is SIMULATED: no model runs and no device is used. ``--show-plan`` prints each
schedule's step-by-replica grid.

A scenario can live in a YAML file (``--scenario FILE``): its keys are the flags' names with ``_``
(``stages: 4``, ``replicas: [2, 2, 1, 2]``, ``speeds: [[1, 1], [1, 0.5]]``, ``slow: ["2:0=0.5"]``,
``schedules: [1f1b, osprey]``, ...), checked exactly as the flags are; a flag on the command line wins.
``kind: stragglers`` simulates straggler policies instead (``pdml_ray.cli.simulate_stragglers``).

Examples:
    pdml-ray simulate --stages 4 --replicas 2 --microbatches 16 --slow 2:0=0.5
    pdml-ray simulate --stages 8 --replicas 4 --microbatches 64 --profile noisy --memory-limit 8
    pdml-ray simulate --stages 3 --replicas 1,2,1 --speeds "1;1,0.6;1" --show-plan
    pdml-ray simulate --scenario scenario.yaml
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Callable

from pdml_ray.cli.args import file_path, float_range, int_range, items, seed
from pdml_ray.cli.scenario import load_scenario, scenario_values
from pdml_ray.errors import ConfigError

DESCRIPTION = "simulate a pipeline cluster profile (or a straggler scenario) under every registered schedule"
MAX_STAGES = MAX_REPLICAS = 64
MAX_ACTIONS = 5_000_000
"""Simulated actions (2 x stages x micro-batches x steps x schedules) above which a run is refused: about a
minute or two on 2 cores; past it a typo (a zero too many) would look like a hang."""
PROGRESS_ACTIONS = 100_000
"""Above this many simulated actions each schedule's start is shown on stderr (a few seconds and more)."""
PROFILES = ("homogeneous", "heterogeneous", "noisy")
DEFAULTS: dict[str, Any] = {"stages": 4, "replicas": [2], "microbatches": 16, "profile": "homogeneous",
                            "speeds": None, "slow": [], "forward_s": 1.0, "backward_s": 2.0, "noise": None,
                            "mb_cv": None, "drift": None, "transfer_s": 0.0, "memory_limit": None, "steps": 10,
                            "schedules": None, "seed": 0}
"""Built-in values, taken when neither the command line nor the scenario file gives one."""


def _replica_counts(text: str) -> list[int]:
    return [int_range(1, MAX_REPLICAS)(x) for x in items(text, "--replicas", example="2,2,1,2")]


def _speed_grid(text: str) -> list[list[float]]:
    speed = float_range(0.0, 1000.0, low_open=True, hint=" (1.0 = nominal)")
    return [[speed(x) for x in items(row, "--speeds", example="1,1;1,0.5")]
            for row in items(text, "--speeds", sep=";", example="1,1;1,0.5")]


def _slow(text: str) -> tuple[int, int, float]:
    where, sep, factor = text.partition("=")
    stage, sep2, replica = where.partition(":")
    if not sep or not sep2:
        raise argparse.ArgumentTypeError(f"expected STAGE:REPLICA=FACTOR, e.g. 2:0=0.5, got {text!r}")
    index = int_range(0, MAX_STAGES - 1)
    return index(stage), index(replica), float_range(0.0, 1000.0, low_open=True)(factor)


def _schedule_names(text: str) -> list[str]:
    from pdml_ray.pipeline.registry import ALL_SCHEDULES

    names = items(text, "--schedules", example="1f1b,osprey")
    unknown = [n for n in names if n not in ALL_SCHEDULES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown schedule(s) {unknown}; valid names: {sorted(ALL_SCHEDULES)}")
    return names


_replica_counts.__name__, _speed_grid.__name__, _slow.__name__ = "replica counts", "speeds", "STAGE:REPLICA=FACTOR"
_schedule_names.__name__ = "schedule names"


def _profile(text: str) -> str:
    if text not in PROFILES:
        raise argparse.ArgumentTypeError(f"must be one of {list(PROFILES)}, got {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pdml_ray.pipeline.registry import ALL_SCHEDULES

    add = parser.add_argument
    add("--scenario", metavar="FILE", type=file_path("scenario file"),
        help="YAML file with the scenario (keys as the flags below; kind: pipeline or stragglers)")
    add("--stages", type=int_range(1, MAX_STAGES), help="pipeline stages, 1 to 64 (default 4)")
    add("--replicas", type=_replica_counts, help="replicas per stage: one int, or one per stage as 2,2,1,2 (default 2)")
    add("--microbatches", type=int_range(1, 4096), help="micro-batches per global step, 1 to 4096 (default 16)")
    add("--profile", choices=PROFILES, help="starting profile (default homogeneous); the flags below refine it")
    add("--speeds", type=_speed_grid, help='relative replica speeds, stages separated by ";" and replicas by ",", '
                                           'e.g. "1,1;1,0.5" (1.0 = nominal)')
    add("--slow", action="append", type=_slow, metavar="STAGE:REPLICA=FACTOR",
        help="multiply one replica's speed, e.g. 2:0=0.5 (repeatable)")
    seconds = float_range(0.0, 1e6, low_open=True, hint=" seconds")
    add("--forward-s", type=seconds, help="forward seconds per micro-batch at speed 1 (default 1)")
    add("--backward-s", type=seconds, help="backward seconds per micro-batch at speed 1 (default 2)")
    add("--noise", type=float_range(0.0, 3.0), help="lognormal sigma of per-action noise, 0 to 3 (e.g. 0.2)")
    add("--mb-cv", type=float_range(0.0, 3.0), help="relative std of per-micro-batch cost, 0 to 3 (e.g. 0.1)")
    add("--drift", type=float_range(0.0, 1.0), help="per-step sigma of each replica's log-speed random walk, 0 to 1")
    add("--transfer-s", type=float_range(0.0, 1e6, hint=" seconds"), help="seconds to move an activation between stages")
    add("--memory-limit", type=int_range(1, 10**6), help="activations per replica (default: stages, 1F1B's peak)")
    add("--steps", type=int_range(1, 10_000), help="global steps to simulate (default 10)")
    add("--schedules", type=_schedule_names, help=f"comma-separated names (default: all of {', '.join(ALL_SCHEDULES)}; "
                                                  "torch's that do not fit the shape are skipped, saying why)")
    add("--seed", type=seed, help="seed of speeds, noise and drift (default 0)")
    add("--show-plan", action="store_true", help="print each schedule's step-by-replica grid")
    add("--json", metavar="FILE", type=file_path("JSON file"), help="also write the results as JSON")


PIPELINE_TYPES: dict[str, Callable[[str], Any]] = {
    "stages": int_range(1, MAX_STAGES), "replicas": _replica_counts, "microbatches": int_range(1, 4096),
    "profile": _profile, "speeds": _speed_grid, "slow": _slow,
    "forward_s": float_range(0.0, 1e6, low_open=True), "backward_s": float_range(0.0, 1e6, low_open=True),
    "noise": float_range(0.0, 3.0), "mb_cv": float_range(0.0, 3.0), "drift": float_range(0.0, 1.0),
    "transfer_s": float_range(0.0, 1e6), "memory_limit": int_range(1, 10**6), "steps": int_range(1, 10_000),
    "schedules": _schedule_names, "seed": seed}


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario's values: the command line, else the scenario file, else ``DEFAULTS``."""
    from_file = (scenario_values(load_scenario(args.scenario), args.scenario, PIPELINE_TYPES, frozenset({"slow"}))
                 if args.scenario else {})
    return {key: getattr(args, key) if getattr(args, key) is not None else from_file.get(key, default)
            for key, default in DEFAULTS.items()}


def build_profile(v: dict[str, Any]) -> Any:
    """The ``ClusterProfile`` of resolved values; every shape mismatch is a ConfigError naming the flag."""
    import dataclasses

    from pdml_ray.pipeline.simulate import ClusterProfile

    stages, reps = v["stages"], v["replicas"]
    if len(reps) == 1:
        reps = reps * stages
    if len(reps) != stages:
        raise ConfigError(f"--replicas lists {len(reps)} counts for {stages} stages; give one per stage, or one for all")
    overrides: dict[str, Any] = {"transfer_s": v["transfer_s"],
                                 "memory_limit": v["memory_limit"] if v["memory_limit"] is not None else stages}
    for key, field in (("noise", "noise_sigma"), ("mb_cv", "microbatch_cv"), ("drift", "drift_sigma")):
        if v[key] is not None:
            overrides[field] = v[key]
    profile = ClusterProfile.build(stages, reps, profile=v["profile"], forward_s=v["forward_s"],
                                   backward_s=v["backward_s"], seed=v["seed"], **overrides)
    speeds = [list(s) for s in profile.speeds]
    if v["speeds"]:
        if [len(r) for r in v["speeds"]] != [len(r) for r in speeds]:
            raise ConfigError(f"--speeds has shape {[len(r) for r in v['speeds']]}, the cluster "
                              f"{[len(r) for r in speeds]} (replicas per stage); give one speed per replica")
        speeds = [list(r) for r in v["speeds"]]
    for k, r, factor in v["slow"]:
        if k >= stages or r >= len(speeds[k]):
            raise ConfigError(f"--slow {k}:{r}={factor:g}: no replica {r} of stage {k} in a cluster of {stages} "
                              f"stages x replicas {reps}")
        speeds[k][r] *= factor
    if not all(math.isfinite(s) and s > 0 for row in speeds for s in row):
        raise ConfigError("--speeds x --slow factors give a speed that is not a positive finite number; use smaller factors")
    return dataclasses.replace(profile, speeds=tuple(tuple(s) for s in speeds))


def run(args: argparse.Namespace) -> int:
    if args.scenario and load_scenario(args.scenario).get("kind", "pipeline") == "stragglers":
        from pdml_ray.cli import simulate_stragglers

        return simulate_stragglers.report(simulate_stragglers.resolve(args.scenario), json_path=args.json)
    from pdml_ray.pipeline.registry import ALL_SCHEDULES

    v = resolve(args)
    profile = build_profile(v)
    names = v["schedules"] or list(ALL_SCHEDULES)
    actions = 2 * profile.stages * v["microbatches"] * v["steps"] * len(names)
    if actions > MAX_ACTIONS:
        raise ConfigError(f"{actions:,} simulated actions (2 x stages x micro-batches x steps x schedules) is more than "
                          f"{MAX_ACTIONS:,} (minutes of work); use fewer --steps, --microbatches or --schedules")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise ConfigError(f"--json {args.json}: its folder does not exist; create it or write elsewhere")
    return report(profile, v, names, args.show_plan, args.json, progress=actions > PROGRESS_ACTIONS)


def report(profile: Any, v: dict[str, Any], names: list[str], show_plan: bool, json_path: str | None,
           progress: bool) -> int:
    from pdml_ray.bench.common import print_table
    from pdml_ray.config import PipelineConfig
    from pdml_ray.pipeline.plan import format as format_plan
    from pdml_ray.pipeline.simulate import compare_in_simulation, steady_state

    from pdml_ray.pipeline.registry import TORCH_SCHEDULES

    config = PipelineConfig(memory_limit=profile.memory_limit)
    microbatches, steps = v["microbatches"], v["steps"]
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for i, name in enumerate(names):  # one at a time: each schedule runs on its own simulator anyway
        if progress:
            print(f"simulating {name} ({i + 1}/{len(names)}, {steps} steps) ...", file=sys.stderr, flush=True)
        try:
            results |= compare_in_simulation(profile, microbatches, [name], steps=steps, config=config, seed=v["seed"])
        except ConfigError as err:
            # torch's baselines have their own size rules; by default one that does not fit is skipped.
            if v["schedules"] or name not in TORCH_SCHEDULES:
                raise
            skipped[name] = str(err)
    half = steps // 2  # steady state: the second half of the steps
    summary = steady_state(results, half)
    steady, bubble, lower = summary["makespan_s"], summary["bubble_fraction"], summary["lower_bound_s"]
    own_bound = summary["schedule_lower_bound_s"]
    base, weighted = steady.get("1f1b"), steady.get("1f1b-weighted")
    rows = []
    for n, r in results.items():
        rows.append([n, steady[n], bubble[n], max(r["peak_memory"].values()),
                     r["memory_violations"], steady[n] / base if base else float("nan"),
                     steady[n] / weighted if weighted else float("nan"), steady[n] / own_bound[n]])
    print(f"simulated cluster: {profile.stages} stages x replicas {list(profile.replicas)}, "
          f"{microbatches} micro-batches, speeds {[[round(s, 2) for s in row] for row in profile.speeds]}, "
          f"noise {profile.noise_sigma}, mb variation {profile.microbatch_cv}, drift {profile.drift_sigma}, "
          f"transfer {profile.transfer_s}s, memory limit {profile.memory_limit} activations/replica")
    print_table(["schedule", "makespan_s", "bubble", "peak_act", "mem_viol", "x 1f1b", "x 1f1b-weighted",
                 "x lower_bound"], rows,
                title=f"steady state (median of steps {half}..{steps - 1}); lower bound {lower:.4g}s over every "
                      "action set compared; x lower_bound: to the bound of the schedule's own action set and chunks")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if "auto" in results:
        print(f"auto chose {results['auto']['decision'].get('schedule')}: {results['auto']['decision'].get('reason')}")
    if show_plan:
        for n, r in results.items():
            print()
            print(format_plan(r["last_plan"]))
    if json_path:
        import dataclasses

        payload = {n: {k: val for k, val in r.items() if k != "last_plan"} | {"plan": r["last_plan"].to_dict()}
                   for n, r in results.items()}
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"profile": dataclasses.asdict(profile), "microbatches": microbatches,
                       "steady_makespan_s": steady, "lower_bound_s": lower, "schedule_lower_bound_s": own_bound,
                       "schedules": payload,
                       "skipped": skipped}, f, indent=2)
        print(f"wrote {json_path}")
    return 0
