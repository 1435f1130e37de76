"""``bench pipeline``'s torch-runtime section: registry plans run by torch.distributed.pipelining's own
runtime (``pdml_ray.pipeline.torch_exec``) against torch's own schedule class running the same order.

Two gloo ranks on this machine, each with its share of the cores, train a real MLP (two stages, one
per rank, real forward and backward, real point-to-point transfers; nothing emulated). Per pair, a
registry plan (``torch-1f1b``: the order ``Schedule1F1B`` generates, read by ``torch_orders``) runs on
``TorchPlanRuntime`` (torch's generic ``_PipelineScheduleRuntime`` lowering the plan, the project's loop
running the lowered order) and torch's own class (``Schedule1F1B``, with its hand-written loop) runs the
same order; the same plan on torch's own generic loop (``TORCH_LOOP``) is measured beside them; all from
the same weights on the same batch, interleaved round by round (which side goes first alternates), each
step timed between two barriers, so a step is the slower rank's. Figures: per pair the median over
``REPEATS`` runs (fresh processes each) of each run's median over rounds of the paired ratio (plan on
torch's runtime over torch's class), and planning per step over
the median step: each schedule's next plan is made a step ahead on a thread while the round's steps
run (planning ahead, as the scheduler actor does for the Ray-actor runtime), and the step loop's
blocked time is its wait for that plan plus ``TorchPlanRuntime.load`` (validation, the conversion and
torch's lowering); the planning thread's own time is reported beside it. Schedules: the registry's
torch orders above, and osprey's per-step plans at this shape run on torch's runtime too (osprey's
latencies come from one SIMULATED step: torch's runtime reports none).
"""

from __future__ import annotations

import concurrent.futures
import copy
import os
import statistics
import time
from typing import Any, Sequence

PAIRS = {"torch-1f1b": "Schedule1F1B", "torch-gpipe": "ScheduleGPipe"}
"""Registry plan -> torch's class that runs the same order."""
CONTROL = "Schedule1F1B (control)"
"""A second ``Schedule1F1B`` paired with the first: how far apart identical code measures on this machine."""
TORCH_LOOP = "torch-1f1b on torch's loop"
"""The torch-1f1b plan on ``TorchPlanRuntime(action_ranges=True)``: torch's own ``_PipelineScheduleRuntime``
loop (a profiler range and a dispatch per action), paired with ``Schedule1F1B`` too: what the project's
order loop saves."""
TARGETS = {"torch_runtime_step_over_torch_class": 1.03, "torch_runtime_planning_over_step": 0.01}
MICROBATCHES = 4
RANKS = 2


def _model(width: int, layers: int, seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(width, 8))


class _OspreyOnSimulatedLatencies:
    """Osprey at 2 stages x 1 replica x MICROBATCHES, told before each plan the SIMULATED latencies of its
    previous plan on a noisy profile (second stage at 0.7x): its plans change from step to step as a run's
    would (torch's runtime reports no per-action latencies to feed it)."""

    def __init__(self, seed: int) -> None:
        from pdml_ray.pipeline.osprey import OspreySchedule
        from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator

        self.osprey = OspreySchedule(stages=RANKS, replicas=(1,) * RANKS, microbatches=MICROBATCHES)
        self.sim = PipelineSimulator(ClusterProfile.build(RANKS, 1, profile="noisy", seed=seed, speeds=((1.0,), (0.7,))), seed)
        self.last: Any = None
        self.observed = 0

    def plan(self, step: int) -> Any:
        if self.last is not None:
            self.osprey.observe(self.sim.run_step(self.last, self.observed).measurements)
            self.observed += 1
        self.last = self.osprey.plan(step)
        return self.last


def _timed_plan(source: Any, step: int) -> tuple[Any, float]:
    t0 = time.perf_counter()  # osprey's simulated observation included: an upper bound of its planning
    plan = source.plan(step)
    return plan, time.perf_counter() - t0


def _rank(rank: int, world_size: int, rounds: int, width: int, layers: int, batch: int, seed: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules as torch_schedules

    from pdml_ray.pipeline.registry import make_schedule
    from pdml_ray.pipeline.torch_exec import TorchPlanRuntime, pipeline_stages

    loss_fn = torch.nn.functional.mse_loss
    base, cpu = _model(width, layers, seed), torch.device("cpu")
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(batch, width, generator=gen), torch.randn(batch, 8, generator=gen)
    sources: dict[str, Any] = {name: make_schedule(name, stages=RANKS, replicas=1, microbatches=MICROBATCHES)
                               for name in PAIRS}
    sources["osprey"] = _OspreyOnSimulatedLatencies(seed)
    arms: dict[str, tuple[Any, Any]] = {}  # arm -> (model, what steps it)
    runtimes: dict[str, Any] = {}
    for name, source in sources.items():
        plan = source.plan(0)
        model = copy.deepcopy(base)
        runtimes[name] = TorchPlanRuntime(pipeline_stages(model, plan, rank, cpu), MICROBATCHES, loss_fn=loss_fn)
        runtimes[name].load(plan)
        arms[name] = (model, runtimes[name])
        if name in PAIRS:
            model = copy.deepcopy(base)
            cls = getattr(torch_schedules, PAIRS[name])
            arms[PAIRS[name]] = (model, cls(pipeline_stages(model, plan, rank, cpu)[0], MICROBATCHES, loss_fn=loss_fn))
    one_f_one_b = sources["torch-1f1b"].plan(0)
    # torch's own loop over the same lowered order, beside the project's
    model = copy.deepcopy(base)
    arms[TORCH_LOOP] = (model, TorchPlanRuntime(pipeline_stages(model, one_f_one_b, rank, cpu), MICROBATCHES,
                                                loss_fn=loss_fn, action_ranges=True))
    arms[TORCH_LOOP][1].load(one_f_one_b)
    # The control: a second Schedule1F1B, the same code on its own copy; its ratio is the noise floor.
    model = copy.deepcopy(base)
    arms[CONTROL] = (model, torch_schedules.Schedule1F1B(pipeline_stages(model, one_f_one_b, rank, cpu)[0], MICROBATCHES,
                                                         loss_fn=loss_fn))
    step_s: dict[str, list[float]] = {arm: [] for arm in arms}
    plan_s: dict[str, list[float]] = {name: [] for name in sources}  # making the plan, on the planning thread
    blocked_s: dict[str, list[float]] = {name: [] for name in sources}  # the step loop waiting for it, and load
    lowered_s: dict[str, list[float]] = {name: [] for name in sources}  # those of the steps whose plan changed
    names = list(arms)
    with concurrent.futures.ThreadPoolExecutor(1) as planner:
        for r in range(-1, rounds):  # round -1 warms up (shape inference, first allocations) and is not kept
            ahead: dict[str, Any] = {}
            for arm in (names if r % 2 == 0 else names[::-1]):
                if arm == "osprey":
                    # Step r + 1's plans are made on a thread while osprey's step r runs (plan ahead; torch's
                    # ops release the GIL): only osprey's step shares its rank with the planning.
                    ahead = {name: planner.submit(_timed_plan, source, r + 1) for name, source in sources.items()}
                model, runner = arms[arm]
                model.zero_grad(set_to_none=True)
                dist.barrier()
                t0 = time.perf_counter()
                runner.step(x, target=y)
                dist.barrier()
                if r >= 0:
                    step_s[arm].append(time.perf_counter() - t0)
            for name, future in ahead.items():
                t0 = time.perf_counter()
                plan, seconds = future.result()
                lowered = runtimes[name].load(plan)
                if r >= 0:
                    blocked_s[name].append(time.perf_counter() - t0)
                    plan_s[name].append(seconds)
                    if lowered:
                        lowered_s[name].append(blocked_s[name][-1])
    # What loading costs when the plan does change (torch lowers it again): the 1f1b and gpipe plans in
    # turn on osprey's runtime (its stages fit any plan of this shape), then osprey's plan back.
    switch_s = []
    for i in range(6):
        t0 = time.perf_counter()
        runtimes["osprey"].load(sources["torch-1f1b" if i % 2 else "torch-gpipe"].plan(0))
        switch_s.append(time.perf_counter() - t0)
    runtimes["osprey"].load(sources["osprey"].last)
    grads = {arm: {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
             for arm, (model, _) in arms.items()}
    diff = {name: max((float((grads[name][n] - grads[cls][n]).abs().max()) for n in grads[cls]), default=0.0)
            for name, cls in PAIRS.items()}
    return {"step_s": step_s, "plan_s": plan_s, "blocked_s": blocked_s, "lowered_s": lowered_s,
            "load_changed_plan_s": statistics.median(switch_s), "grad_max_abs_diff": diff, "threads": torch.get_num_threads(),
            "osprey_schedule_chosen": getattr(sources["osprey"].osprey.last_decision, "chosen", None)}


REPEATS = 3
"""Two-rank runs per measurement, each in fresh processes (seeds ``seed``, ``seed + 1``, ...). On 2 cores one
run's pairs differed from the next's by up to 4-7% (Schedule1F1B against itself: 0.979-1.037 over five
full-size runs; torch-1f1b over Schedule1F1B 0.987-1.074), more than the rounds within a run vary, so
the figures are medians over runs of each run's median over its rounds."""


def measure_torch_runtime(*, quick: bool, seed: int = 0, repeats: int = REPEATS) -> dict[str, Any]:
    """The section's figures (module docstring): medians over ``repeats`` two-rank runs (``REPEATS``) of
    ``rounds`` interleaved rounds each."""
    from pdml_ray.pipeline.torch_exec import run_local_ranks

    rounds, width, layers, batch = (31, 384, 4, 128) if quick else (41, 512, 4, 256)
    load_before, t0 = os.getloadavg()[0], time.perf_counter()
    runs = [_run_figures(run_local_ranks(_rank, RANKS, rounds, width, layers, batch, seed + i, timeout_s=300.0))
            for i in range(repeats)]
    section = combine_runs(runs)
    section.update({
        "model": f"MLP {layers} x Linear({width}, {width}) + Tanh, then Linear({width}, 8); batch {batch}, MSE loss",
        "rounds": rounds, "wall_s": time.perf_counter() - t0,
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]}, "seed": seed})
    return section


def _run_figures(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One two-rank run's figures: per pair the paired statistics over its rounds, the control's, and
    planning per step (the slower rank's)."""
    from pdml_ray.bench.common import paired_ratio_stats

    # Every arm's step is timed between barriers, so ranks agree to within a barrier: rank 0's times.
    steps = per_rank[0]["step_s"]
    pairs = {name: {"torch_class": cls, **paired_ratio_stats(steps[cls], steps[name]),
                    "median_step_s": statistics.median(steps[name]), "torch_class_median_step_s": statistics.median(steps[cls]),
                    "best_step_ratio": min(steps[name]) / min(steps[cls]),
                    "grad_max_abs_diff": max(r["grad_max_abs_diff"][name] for r in per_rank)}
             for name, cls in PAIRS.items()}
    planning = {name: {"median_blocked_s": max(statistics.median(r["blocked_s"][name]) for r in per_rank),
                       "median_plan_s": max(statistics.median(r["plan_s"][name]) for r in per_rank),
                       "median_step_s": statistics.median(steps[name]),
                       "plans_changed": len(per_rank[0]["lowered_s"][name]),
                       "median_blocked_s_when_changed": max((statistics.median(r["lowered_s"][name])
                                                             for r in per_rank if r["lowered_s"][name]), default=None)}
                for name in per_rank[0]["plan_s"]}
    for p in planning.values():
        p["blocked_over_step"] = p["median_blocked_s"] / p["median_step_s"]
        p["plan_over_step"] = p["median_plan_s"] / p["median_step_s"]
    return {"pairs": pairs, "control": {"torch_class": "Schedule1F1B", **paired_ratio_stats(steps["Schedule1F1B"], steps[CONTROL])},
            "torch_loop": {"torch_class": "Schedule1F1B", **paired_ratio_stats(steps["Schedule1F1B"], steps[TORCH_LOOP])},
            "planning": planning, "load_changed_plan_s": max(r["load_changed_plan_s"] for r in per_rank),
            "threads_per_rank": per_rank[0]["threads"], "osprey_chosen": per_rank[0]["osprey_schedule_chosen"]}


def combine_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The section from its runs (``_run_figures``): every figure the median over runs, gradients' largest
    difference the largest, plans changed summed; each run's median ratios kept (``per_run_median_ratio``),
    and the targets judged on the medians over runs."""
    from pdml_ray.pipeline.torch_orders import SUPPORTED_TORCH

    med = statistics.median

    def paired(key: Any) -> dict[str, Any]:
        per_run = [key(r) for r in runs]
        return {"torch_class": per_run[0]["torch_class"], "runs": len(runs), "rounds_per_run": per_run[0]["rounds"],
                "median_ratio": med(p["median_ratio"] for p in per_run),
                "per_run_median_ratio": [p["median_ratio"] for p in per_run],
                "rounds_method_faster": sum(p["rounds_method_faster"] for p in per_run),
                "rounds_baseline_faster": sum(p["rounds_baseline_faster"] for p in per_run),
                **{k: med(p[k] for p in per_run) for k in per_run[0]
                   if k in ("median_step_s", "torch_class_median_step_s", "best_step_ratio", "ratio_of_medians")},
                **({"grad_max_abs_diff": max(p["grad_max_abs_diff"] for p in per_run)} if "grad_max_abs_diff" in per_run[0] else {})}

    pairs = {name: paired(lambda r, n=name: r["pairs"][n]) for name in runs[0]["pairs"]}
    control = paired(lambda r: r["control"])
    torch_loop = paired(lambda r: r["torch_loop"])
    planning = {}
    for name in runs[0]["planning"]:
        per_run = [r["planning"][name] for r in runs]
        changed = [p["median_blocked_s_when_changed"] for p in per_run if p["median_blocked_s_when_changed"] is not None]
        planning[name] = {**{k: med(p[k] for p in per_run) for k in per_run[0]
                             if k not in ("plans_changed", "median_blocked_s_when_changed")},
                          "plans_changed": sum(p["plans_changed"] for p in per_run),
                          "median_blocked_s_when_changed": med(changed) if changed else None}
    worst_pair = max(pairs, key=lambda n: pairs[n]["median_ratio"])
    worst_plan = max(planning, key=lambda n: planning[n]["blocked_over_step"])
    load_changed = med(r["load_changed_plan_s"] for r in runs)
    targets = {
        "torch_runtime_step_over_torch_class": {
            "value": pairs[worst_pair]["median_ratio"], "target": TARGETS["torch_runtime_step_over_torch_class"],
            "met": pairs[worst_pair]["median_ratio"] <= TARGETS["torch_runtime_step_over_torch_class"],
            "basis": f"worst pair ({worst_pair} vs {PAIRS[worst_pair]}): median over {len(runs)} runs of each run's "
                     f"median paired step-time ratio over its interleaved rounds (per run "
                     f"{', '.join(f'{x:.3f}' for x in pairs[worst_pair]['per_run_median_ratio'])}; Schedule1F1B "
                     f"against itself {control['median_ratio']:.3f}, per run "
                     f"{', '.join(f'{x:.3f}' for x in control['per_run_median_ratio'])})"},
        "torch_runtime_planning_over_step": {
            "value": planning[worst_plan]["blocked_over_step"], "target": TARGETS["torch_runtime_planning_over_step"],
            "met": planning[worst_plan]["blocked_over_step"] <= TARGETS["torch_runtime_planning_over_step"],
            "basis": f"worst schedule ({worst_plan}): median time the step loop waits for its next plan (made a step "
                     "ahead on a thread) plus loading it into torch's runtime, the slower rank, over its median step "
                     f"(median over {len(runs)} runs)"}}
    return {"torch": SUPPORTED_TORCH, "ranks": RANKS, "stages": RANKS, "microbatches": MICROBATCHES, "runs": len(runs),
            "threads_per_rank": runs[0]["threads_per_rank"], "pairs": pairs, "control": control,
            "torch_loop": torch_loop, "planning": planning,
            "load_changed_plan_s": load_changed,
            "load_changed_plan_over_step": load_changed / planning["osprey"]["median_step_s"],
            "osprey_chosen": runs[0]["osprey_chosen"], "targets": targets,
            "real": "torch's own pipeline runtime and schedule classes, gloo point-to-point between two processes, "
                    "real forward and backward compute on the CPU",
            "emulated": "osprey's latencies: SIMULATED (its previous plan on a noisy profile, the second stage at "
                        "0.7x); plans are made a step ahead on a thread of each rank"}


def torch_runtime_line(section: dict[str, Any]) -> str:
    """The console lines of the section, saying what is real."""
    if "pairs" not in section:
        return f"torch runtime: {section}"
    def runs(p: dict[str, Any]) -> str:
        return f"{p['median_ratio']:.3f} (runs {', '.join(f'{x:.3f}' for x in p['per_run_median_ratio'])})"

    parts = [f"{name} on torch's runtime / torch's {p['torch_class']}: paired median {runs(p)} over {p['runs']} runs of "
             f"{p['rounds_per_run']} rounds ({1e3 * p['median_step_s']:.1f} vs {1e3 * p['torch_class_median_step_s']:.1f} ms; "
             f"gradients equal to {p['grad_max_abs_diff']:.1e})" for name, p in section["pairs"].items()]
    parts.append(f"the torch-1f1b plan on torch's own action loop (action_ranges=True) / Schedule1F1B: paired median "
                 f"{runs(section['torch_loop'])}")
    parts.append(f"control, Schedule1F1B against a second copy of itself: paired median {runs(section['control'])}")
    plans = [f"{name} {1e3 * p['median_blocked_s']:.3f} ms blocked ({100 * p['blocked_over_step']:.2f}% of its step; "
             f"planning {1e3 * p['median_plan_s']:.3f} ms on the thread; plan changed in {p['plans_changed']} of "
             f"{section['runs'] * section['rounds']} steps" + ("" if p["median_blocked_s_when_changed"] is None else
                                             f", {1e3 * p['median_blocked_s_when_changed']:.3f} ms blocked then") + ")"
             for name, p in section["planning"].items()]
    load = section["load_average_1min"]
    return (f"torch runtime ({section['ranks']} gloo ranks, {section['model']}, {section['microbatches']} micro-batches; "
            f"REAL: {section['real']}; load average {load['before']:.1f} -> {load['after']:.1f}): " + "; ".join(parts)
            + "\n  planning per step (made a step ahead; blocked = waiting for it + loading it into torch's runtime): "
            + ", ".join(plans) + f"; loading a changed plan (torch lowers it again) {1e3 * section['load_changed_plan_s']:.3f} "
            f"ms ({100 * section['load_changed_plan_over_step']:.2f}% of osprey's step); {section['emulated']}")
