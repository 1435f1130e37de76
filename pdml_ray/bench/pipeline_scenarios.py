"""``bench pipeline``'s non-stationary section: osprey against the best static order per scenario.

Scenarios (``pdml_ray.pipeline.scenarios``): homogeneous, drift, uneven, comm-delay, memory-cap, each
on a few shapes (stages x replicas x micro-batches) over ``seeds`` seeds, all SIMULATED. Every static
order, the project's and torch's (``best_static`` is the fastest of them per seed), runs the same
steps. Osprey plans through the run's scheduler exactly as the pipeline runtime does, fetched one step
ahead (``ScheduledPlans``, in-process), free to choose split-backward plans of two to four chunks per rank
(``OspreyConfig(plans="any")``): the plan for step t is asked for before step t - 1's
measurements arrive, so it sees measurements through step t - 2 — the one-step-old view is in every
figure. Osprey re-plans a step after one that ran far from its plan's prediction
(``OspreyConfig.replan_on_shift``, off by default: on the Ray-actor runtime's ~1 ms actions noise
re-planned most steps; full size here it took drift from 0.885 to 0.853 of the best static order, and
with osprey's own zero-bubble lanes to 0.837, over two to four chunks to 0.828, and left the other
scenarios as they were); each cell lists the re-plans per seed (``osprey_replans_per_seed``), the steps
that waited for planning. Where lengths vary (uneven, memory-cap) every schedule is told each step's micro-batch lengths before
the step is planned (``simulate_schedule``; osprey through ``ScheduledPlans.tell_sizes``,
a step ahead like its plans); static orders ignore them. A seed's makespan is the mean over steps ``SKIP_STEPS``.. (osprey's first two plans are its
warm start); one record per scenario cell, with medians and the worst seed over seeds.

``slow-stage`` (one stage slowed for good) also runs layer re-balancing (``PipelineConfig.rebalance``,
``pdml_ray.pipeline.rebalance``) through the same scheduler path, the simulator moving the layers at the
step each move names: osprey as in every scenario, osprey over F and B only (the Ray-actor runtime's
plans) and 1F1B, each with and without it, reported as ratios (``rebalance``): re-balanced over not
(mean over the same steps as every figure, and at the last step, after the move), and over the best
static order. The issue names no target for it. ``--quick`` leaves it out unless named
(``default_scenarios``): its re-balancing runs double its cost.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.registry import STATIC_SCHEDULES, TORCH_SCHEDULES
from pdml_ray.pipeline.scenarios import SCENARIOS, ScenarioConfig

REBALANCED = {"osprey": ("osprey", "any"), "osprey-fb": ("osprey", "full-backward"), "1f1b": ("1f1b", "full-backward")}
"""The schedules ``slow-stage`` runs with and without layer re-balancing, and osprey's ``plans`` (osprey: as in
every scenario; osprey-fb: over F and B only, what the Ray-actor runtime runs)."""
QUICK_LEAVES_OUT = ("slow-stage",)
"""Scenarios ``--quick`` runs only when named (``--scenarios slow-stage``)."""
SKIP_STEPS = 2
"""Steps left out of a seed's mean makespan: planning ahead, osprey runs its warm start for two steps."""
STATIC = STATIC_SCHEDULES + tuple(TORCH_SCHEDULES)
SCHEDULES = ("osprey",) + STATIC
TARGETS = {"drift_median": 0.85, "drift_worst_cell": 0.95, "uneven_median": 0.85, "uneven_worst_cell": 0.95,
           "homogeneous_worst_cell": 1.01, "memory_cap_osprey_violations": 0}
"""Osprey over the best static order (median over cells of the per-cell median over seeds, and the
worst cell); the homogeneous one per shape; osprey's memory violations where every static order
exceeds the cap."""


def default_scenarios(quick: bool) -> list[str]:
    """The scenarios run when none are named: all of them, but for ``QUICK_LEAVES_OUT`` with ``--quick``."""
    return [n for n in SCENARIOS if not (quick and n in QUICK_LEAVES_OUT)]


def shapes(quick: bool) -> list[tuple[int, int, int]]:
    """(stages, replicas, micro-batches) of the scenario cells."""
    if quick:
        return [(4, 1, 16), (4, 4, 16), (8, 4, 16)]
    return [(s, r, m) for s in (4, 8) for r in (1, 2, 4) for m in (16, 32)]


def run_seed(scenario: str, stages: int, replicas: int, microbatches: int, *, seed: int, steps: int,
             config: ScenarioConfig | None = None) -> dict[str, Any]:
    """One scenario cell on one seed: every schedule's mean makespan over steps ``SKIP_STEPS``.., its
    lower bound (same mean) and memory violations; torch's that the shape does not fit are listed apart."""
    from pdml_ray.config import OspreyConfig, PDMLConfig, PipelineConfig
    from pdml_ray.pipeline.registry import make_schedule
    from pdml_ray.pipeline.scenarios import scenario_profile
    from pdml_ray.pipeline.simulate import PipelineSimulator, simulate_schedule
    from pdml_ray.runtime.pipeline_plans import ScheduledPlans

    profile = scenario_profile(scenario, stages, replicas, seed=seed, steps=steps, config=config)
    pipeline = PipelineConfig(memory_limit=profile.memory_limit)
    makespan, bound, violations, not_applicable, replans = {}, {}, {}, {}, 0
    for name in SCHEDULES:
        source: Any
        if name == "osprey":
            # Osprey is told the link's nominal transfer time (what a user knows), not the late transfers.
            osprey = PipelineConfig(schedule="osprey", memory_limit=profile.memory_limit, transfer_s=profile.transfer_s,
                                    osprey=OspreyConfig(plans="any", replan_on_shift=True))
            source = ScheduledPlans(PDMLConfig(pipeline=osprey), stages=stages, replicas=replicas,
                                    microbatches=microbatches, in_process=True)
        else:
            try:
                source = make_schedule(name, stages=stages, replicas=replicas, microbatches=microbatches,
                                        config=pipeline)
            except ConfigError as err:  # torch's own size rules
                if name not in TORCH_SCHEDULES:
                    raise
                not_applicable[name] = str(err)
                continue
        results = simulate_schedule(source, PipelineSimulator(profile, seed), steps)[min(SKIP_STEPS, steps - 1):]
        if name == "osprey":
            replans = source.replans
        makespan[name] = statistics.fmean(r.makespan_s for r in results)
        bound[name] = statistics.fmean(r.lower_bound_s for r in results)
        violations[name] = sum(r.memory_violations for r in results)
    best = min((n for n in STATIC if n in makespan), key=lambda n: makespan[n])
    out = {"seed": seed, "makespan_s": makespan, "lower_bound_s": bound, "memory_violations": violations,
           "not_applicable": not_applicable, "best_static": best,
           "osprey_over_best_static": makespan["osprey"] / makespan[best],
           "osprey_over_lower_bound": makespan["osprey"] / bound["osprey"], "osprey_replans": replans}
    if scenario == "slow-stage":
        out["rebalance"] = _rebalance_runs(profile, stages, replicas, microbatches, seed=seed, steps=steps,
                                           config=config, best_static_s=makespan[best])
    return out


def _rebalance_runs(profile: Any, stages: int, replicas: int, microbatches: int, *, seed: int, steps: int,
                    config: ScenarioConfig | None, best_static_s: float) -> dict[str, Any]:
    """``slow-stage`` with and without layer re-balancing, for each of ``REBALANCED``: mean makespans (same
    steps as the other schedules), the moves made, and the ratios."""
    from pdml_ray.config import OspreyConfig, PDMLConfig, PipelineConfig, RebalanceConfig
    from pdml_ray.pipeline.scenarios import scenario_layers
    from pdml_ray.pipeline.simulate import PipelineSimulator, simulate_schedule
    from pdml_ray.runtime.pipeline_plans import ScheduledPlans

    layers, cuts = scenario_layers(stages, config)
    out: dict[str, Any] = {}
    for label, (schedule, plan_set) in REBALANCED.items():
        makespan, last, moves = {}, {}, []
        for on in (False, True):
            pipeline = PipelineConfig(schedule=schedule, memory_limit=profile.memory_limit, transfer_s=profile.transfer_s,
                                      osprey=OspreyConfig(plans=plan_set, replan_on_shift=True),
                                      rebalance=RebalanceConfig(enabled=on))
            plans = ScheduledPlans(PDMLConfig(pipeline=pipeline), stages=stages, replicas=replicas,
                                   microbatches=microbatches, in_process=True,
                                   layers=[f + b for f, b in zip(layers.forward_s, layers.backward_s)], cuts=cuts)
            try:
                found: list[Any] = []

                def moved(step: int, plans: ScheduledPlans = plans, found: list[Any] = found) -> Any:
                    move = plans.layer_move(step)
                    if move is not None:
                        found.append(move)
                    return move

                results = simulate_schedule(plans, PipelineSimulator(profile, seed), steps, moves=moved, layers=layers)
            finally:
                plans.close()
            makespan[on] = statistics.fmean(r.makespan_s for r in results[min(SKIP_STEPS, steps - 1):])
            last[on] = results[-1].makespan_s
            if on:
                moves = [{"step": m.effective_step, "stage": m.stage, "cuts_after": list(m.cuts_after)} for m in found]
        out[label] = {"makespan_s": makespan[False], "rebalanced_makespan_s": makespan[True], "moves": moves,
                      "rebalanced_over_not": makespan[True] / makespan[False],
                      "rebalanced_over_not_last_step": last[True] / last[False],
                      "rebalanced_over_best_static": makespan[True] / best_static_s}
    return out


def cell_record(scenario: str, shape: tuple[int, int, int], runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record per scenario cell: medians over seeds, the worst seed, per-seed values."""
    med = statistics.median
    names = list(runs[0]["makespan_s"])
    makespan = {n: med(r["makespan_s"][n] for r in runs) for n in names}
    best = min((n for n in STATIC if n in makespan), key=lambda n: makespan[n])
    record: dict[str, Any] = {
        "scenario": scenario, "stages": shape[0], "replicas": shape[1], "microbatches": shape[2],
        "seeds": [r["seed"] for r in runs], "makespan_s": makespan,
        "best_static": {"name": best, "makespan_s": makespan[best], "per_seed": [r["best_static"] for r in runs]},
        "lower_bound_s": med(r["lower_bound_s"]["osprey"] for r in runs),
        "lower_bound_any_s": med(min(r["lower_bound_s"].values()) for r in runs),
        "memory_violations": {n: sum(r["memory_violations"][n] for r in runs) for n in names},
        "osprey_replans_per_seed": [r.get("osprey_replans", 0) for r in runs],
        "not_applicable": runs[0]["not_applicable"]}
    for key in ("osprey_over_best_static", "osprey_over_lower_bound"):
        values = [r[key] for r in runs]
        record[key], record[f"{key}_worst"], record[f"{key}_per_seed"] = med(values), max(values), values
    if "rebalance" in runs[0]:
        record["rebalance"] = {}
        for label in runs[0]["rebalance"]:
            per_seed = [r["rebalance"][label] for r in runs]
            entry: dict[str, Any] = {"moves_per_seed": [len(p["moves"]) for p in per_seed],
                                     "moves": [p["moves"] for p in per_seed]}
            for key in ("rebalanced_over_not", "rebalanced_over_not_last_step", "rebalanced_over_best_static"):
                values = [p[key] for p in per_seed]
                entry[key], entry[f"{key}_worst"], entry[f"{key}_per_seed"] = med(values), max(values), values
            record["rebalance"][label] = entry
    return record


def run_scenarios(*, quick: bool, seeds: Sequence[int], steps: int, scenarios: Sequence[str] = SCENARIOS,
                  config: ScenarioConfig | None = None) -> list[dict[str, Any]]:
    """Every scenario cell's record (``cell_record``), with a progress line per cell (a full run takes
    tens of minutes)."""
    cells = [(sc, shape) for sc in scenarios for shape in shapes(quick)]
    out = []
    for i, (sc, shape) in enumerate(cells, 1):
        print(f"scenario cell {i}/{len(cells)}: {sc} {'x'.join(map(str, shape))}, {len(seeds)} seed(s) x "
              f"{steps} steps ...", flush=True)
        out.append(cell_record(sc, shape, [run_seed(sc, *shape, seed=s, steps=steps, config=config) for s in seeds]))
    return out


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario: osprey over the best static order, median over cells and the worst cell (of the
    per-cell medians over seeds), the worst single seed, and which static order was best how often."""
    out: dict[str, dict[str, Any]] = {}
    for sc in dict.fromkeys(r["scenario"] for r in records):
        cells = [r for r in records if r["scenario"] == sc]
        worst = max(cells, key=lambda c: c["osprey_over_best_static"])
        best_names = [n for c in cells for n in c["best_static"]["per_seed"]]
        out[sc] = {"median": statistics.median(c["osprey_over_best_static"] for c in cells),
                   "worst_cell": worst["osprey_over_best_static"], "worst_cell_shape": _shape(worst),
                   "worst_seed": max(c["osprey_over_best_static_worst"] for c in cells),
                   "best_static_counts": {n: best_names.count(n) for n in sorted(set(best_names))}}
        if "rebalance" in cells[0]:  # re-balanced over not, and over the best static order: median and worst cell
            out[sc]["rebalance"] = {
                label: {f"{key}_{part}": f(c["rebalance"][label][key] for c in cells)
                        for key in ("rebalanced_over_not", "rebalanced_over_not_last_step", "rebalanced_over_best_static")
                        for part, f in (("median", statistics.median), ("worst_cell", max))}
                for label in cells[0]["rebalance"]}
    return out


def check_targets(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``TARGETS`` on the records, in the form ``--check`` reads (value, target, met, basis)."""
    summary = summarize(records)
    targets: dict[str, dict[str, Any]] = {}
    for sc in ("drift", "uneven"):
        if sc in summary:
            floor = [bound_over_best_static(r) for r in records if r["scenario"] == sc]
            for part, key in (("median", "median"), ("worst_cell", "worst_cell")):
                value, target = float(summary[sc][key]), TARGETS[f"{sc}_{part}"]
                bound = float(statistics.median(floor) if part == "median" else max(floor))
                targets[f"{sc}_osprey_over_best_static_{part}"] = {
                    "value": value, "target": target, "met": value <= target,
                    "basis": f"{'median over cells' if part == 'median' else 'worst cell'} of the per-cell median "
                             "over seeds (mean makespan per seed, osprey planning one step ahead)",
                    "worst_seed_value": float(summary[sc]["worst_seed"]),
                    "lower_bound_value": bound, "attainable": bound <= target}
    homo = [r for r in records if r["scenario"] == "homogeneous"]
    if homo:
        worst = max(homo, key=lambda c: c["osprey_over_best_static"])
        value = float(worst["osprey_over_best_static"])
        targets["homogeneous_osprey_over_best_static"] = {
            "value": value, "target": TARGETS["homogeneous_worst_cell"], "met": value <= TARGETS["homogeneous_worst_cell"],
            "basis": f"worst shape ({_shape(worst)}) of the per-cell median over seeds"}
    capped = [r for r in records if r["scenario"] == "memory-cap"
              and all(r["memory_violations"][n] > 0 for n in STATIC if n in r["memory_violations"])]
    if [r for r in records if r["scenario"] == "memory-cap"]:
        value = float(sum(r["memory_violations"]["osprey"] for r in capped))
        targets["memory_cap_osprey_violations"] = {
            "value": value, "target": TARGETS["memory_cap_osprey_violations"],
            "met": value <= TARGETS["memory_cap_osprey_violations"],
            "basis": f"osprey's violations over the {len(capped)} memory-cap cells where every static order exceeds "
                     "the cap (all seeds)"}
    return targets


def bound_over_best_static(cell: dict[str, Any]) -> float:
    """The least any schedule could reach in a cell, over its best static order: the per-step lower
    bound (the least over every schedule's action set, told each step's true latencies, so no plan made
    ahead can beat it) over the best static makespan, medians over seeds. Where it is above a target, no
    schedule meets that target in the cell (``attainable`` in ``check_targets``)."""
    return cell["lower_bound_any_s"] / cell["best_static"]["makespan_s"]


def rebalance_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """One printed line per ``slow-stage`` cell and re-balanced schedule: the ratios, medians (worst) over seeds."""
    lines = []
    for r in records:
        for label, e in r.get("rebalance", {}).items():
            lines.append(f"slow-stage {_shape(r)} {label}: re-balanced / not {e['rebalanced_over_not']:.3f} "
                         f"({e['rebalanced_over_not_worst']:.3f}), at the last step "
                         f"{e['rebalanced_over_not_last_step']:.3f}; / best static ({r['best_static']['name']}) "
                         f"{e['rebalanced_over_best_static']:.3f} ({e['rebalanced_over_best_static_worst']:.3f}); "
                         f"moves per seed {e['moves_per_seed']} (SIMULATED)")
    return lines


def _shape(cell: dict[str, Any]) -> str:
    return f"{cell['stages']}x{cell['replicas']}x{cell['microbatches']}"
