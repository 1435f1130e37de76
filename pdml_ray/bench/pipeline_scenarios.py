"""``bench pipeline``'s non-stationary section: osprey against the best static order per scenario.

Scenarios (``pdml_ray.pipeline.scenarios``): homogeneous, drift, uneven, comm-delay, memory-cap, each
on a few shapes (stages x replicas x micro-batches) over ``seeds`` seeds, all SIMULATED. Every static
order, the project's and torch's (``best_static`` is the fastest of them per seed), runs the same
steps. Osprey plans through the run's scheduler exactly as the pipeline runtime does, fetched one step
ahead (``ScheduledPlans``, in-process), free to choose split-backward and two-chunk plans
(``OspreyConfig(plans="any")``): the plan for step t is asked for before step t - 1's
measurements arrive, so it sees measurements through step t - 2 — the one-step-old view is in every
figure. Where lengths vary (uneven, memory-cap) every schedule is told each step's micro-batch
lengths before the step is planned (``simulate_schedule``; osprey through ``ScheduledPlans.tell_sizes``,
a step ahead like its plans); static orders ignore them. A seed's makespan is the mean over steps ``SKIP_STEPS``.. (osprey's first two plans are its
warm start); one record per scenario cell, with medians and the worst seed over seeds.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.registry import STATIC_SCHEDULES, TORCH_SCHEDULES
from pdml_ray.pipeline.scenarios import SCENARIOS, ScenarioConfig

SKIP_STEPS = 2
"""Steps left out of a seed's mean makespan: planning ahead, osprey runs its warm start for two steps."""
STATIC = STATIC_SCHEDULES + tuple(TORCH_SCHEDULES)
SCHEDULES = ("osprey",) + STATIC
TARGETS = {"drift_median": 0.85, "drift_worst_cell": 0.95, "uneven_median": 0.85, "uneven_worst_cell": 0.95,
           "homogeneous_worst_cell": 1.01, "memory_cap_osprey_violations": 0}
"""Osprey over the best static order (median over cells of the per-cell median over seeds, and the
worst cell); the homogeneous one per shape; osprey's memory violations where every static order
exceeds the cap."""


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
    makespan, bound, violations, not_applicable = {}, {}, {}, {}
    for name in SCHEDULES:
        source: Any
        if name == "osprey":
            # Osprey is told the link's nominal transfer time (what a user knows), not the late transfers.
            osprey = PipelineConfig(schedule="osprey", memory_limit=profile.memory_limit, transfer_s=profile.transfer_s,
                                    osprey=OspreyConfig(plans="any"))
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
        makespan[name] = statistics.fmean(r.makespan_s for r in results)
        bound[name] = statistics.fmean(r.lower_bound_s for r in results)
        violations[name] = sum(r.memory_violations for r in results)
    best = min((n for n in STATIC if n in makespan), key=lambda n: makespan[n])
    return {"seed": seed, "makespan_s": makespan, "lower_bound_s": bound, "memory_violations": violations,
            "not_applicable": not_applicable, "best_static": best,
            "osprey_over_best_static": makespan["osprey"] / makespan[best],
            "osprey_over_lower_bound": makespan["osprey"] / bound["osprey"]}


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
        "not_applicable": runs[0]["not_applicable"]}
    for key in ("osprey_over_best_static", "osprey_over_lower_bound"):
        values = [r[key] for r in runs]
        record[key], record[f"{key}_worst"], record[f"{key}_per_seed"] = med(values), max(values), values
    return record


def run_scenarios(*, quick: bool, seeds: Sequence[int], steps: int, scenarios: Sequence[str] = SCENARIOS,
                  config: ScenarioConfig | None = None) -> list[dict[str, Any]]:
    """Every scenario cell's record (``cell_record``)."""
    return [cell_record(sc, shape, [run_seed(sc, *shape, seed=s, steps=steps, config=config) for s in seeds])
            for sc in scenarios for shape in shapes(quick)]


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
    return out


def check_targets(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``TARGETS`` on the records, in the form ``--check`` reads (value, target, met, basis)."""
    summary = summarize(records)
    targets: dict[str, dict[str, Any]] = {}
    for sc in ("drift", "uneven"):
        if sc in summary:
            for part, key in (("median", "median"), ("worst_cell", "worst_cell")):
                value, target = float(summary[sc][key]), TARGETS[f"{sc}_{part}"]
                targets[f"{sc}_osprey_over_best_static_{part}"] = {
                    "value": value, "target": target, "met": value <= target,
                    "basis": f"{'median over cells' if part == 'median' else 'worst cell'} of the per-cell median "
                             "over seeds (mean makespan per seed, osprey planning one step ahead)",
                    "worst_seed_value": float(summary[sc]["worst_seed"])}
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


def _shape(cell: dict[str, Any]) -> str:
    return f"{cell['stages']}x{cell['replicas']}x{cell['microbatches']}"
