"""``pdml-ray simulate --scenario FILE`` with ``kind: stragglers``: straggler policies side by side on the
simulated clock (``pdml_ray.stragglers.simulate``), no Ray.

Every policy trains the same L2-regularised logistic regression (the benchmark's convex problem) on the
same seeded straggler model; compute is EMULATED (``per_sample_ms`` x the model's slowdown factor per
sample). Keys (all optional):

    kind: stragglers
    workers: 8            # n, 1 to 64
    stragglers: 1         # s tolerated (b backup workers), 0 to n - 1
    model: shifted-exp    # none, fixed, shifted-exp, pareto, correlated, death
    policies: [sync, gc-fr, pgc-fr]   # default: all registered policies
    steps: 40             # 1 to 1000
    lr: 2.0               # SGD learning rate
    per_sample_ms: 1.0    # EMULATED compute per sample at factor 1
    mean_extra: 1.0       # shifted-exp/death: factor = 1 + Exp(mean)
    slowdown: 3.0         # fixed/correlated
    alpha: 2.0            # pareto tail index
    death_step: 10        # death: the step the chosen workers die
    seed: 0
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from pdml_ray.cli.args import float_range, int_range, items, seed
from pdml_ray.cli.scenario import load_scenario, scenario_values
from pdml_ray.errors import ConfigError

DIM, L2, SAMPLES_PER_PARTITION = 16, 0.01, 16


def _names(text: str) -> list[str]:
    from pdml_ray.stragglers.registry import POLICIES

    names = items(text, "policies", example="sync,gc-cr")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown policy name(s) {unknown}; valid names: {sorted(POLICIES)}")
    return names


def _model(text: str) -> str:
    from pdml_ray.stragglers.delays import STRAGGLER_MODELS

    if text not in STRAGGLER_MODELS:
        raise argparse.ArgumentTypeError(f"must be one of {list(STRAGGLER_MODELS)}, got {text!r}")
    return text


TYPES: dict[str, Callable[[str], Any]] = {
    "workers": int_range(1, 64), "stragglers": int_range(0, 63), "model": _model, "policies": _names,
    "steps": int_range(1, 1000), "lr": float_range(0.0, 100.0, low_open=True),
    "per_sample_ms": float_range(0.0, 1e4, low_open=True), "mean_extra": float_range(0.0, 100.0),
    "slowdown": float_range(1.0, 1000.0), "alpha": float_range(0.0, 100.0, low_open=True),
    "death_step": int_range(0, 10**6), "seed": seed}
DEFAULTS: dict[str, Any] = {"workers": 8, "stragglers": 1, "model": "shifted-exp", "policies": None, "steps": 40,
                            "lr": 2.0, "per_sample_ms": 1.0, "mean_extra": 1.0, "slowdown": 3.0, "alpha": 2.0,
                            "death_step": 10, "seed": 0}


def resolve(path: str) -> dict[str, Any]:
    v = DEFAULTS | scenario_values(load_scenario(path), path, TYPES)
    if v["stragglers"] >= v["workers"]:
        raise ConfigError(f"--scenario {path}: stragglers ({v['stragglers']}) must be below workers ({v['workers']})")
    return v


def report(v: dict[str, Any], json_path: str | None = None) -> int:
    """Simulate every policy of the resolved scenario ``v`` and print (and write) the comparison."""
    import torch

    from pdml_ray.bench.common import print_table
    from pdml_ray.stragglers.delays import make_straggler_model
    from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model, make_workers
    from pdml_ray.stragglers.registry import POLICIES, make_policy
    from pdml_ray.stragglers.run import FullObjective
    from pdml_ray.stragglers.simulate import simulate

    n, s = v["workers"], v["stragglers"]
    x, y = logistic_data(n * (n + s) * SAMPLES_PER_PARTITION, DIM, seed=v["seed"])  # splits into n and n + b parts
    evaluate = FullObjective(logistic_model(DIM), logistic_loss, x, y, L2)
    rows, out = [], {}
    for name in v["policies"] or list(POLICIES):
        try:
            policy = make_policy(name, workers=n, stragglers=s, seed=v["seed"])
        except ConfigError as e:  # e.g. FR codes need (s + 1) | n: say so and compare the rest
            rows.append([name, "-", "-", "-", "-", f"not applicable: {e}"])
            continue
        model = make_straggler_model(v["model"], workers=n, stragglers=s, seed=v["seed"], death_step=v["death_step"],
                                     slowdown=v["slowdown"], mean_extra=v["mean_extra"], alpha=v["alpha"])
        workers = make_workers(policy, x, y, l2=L2, straggler_model=model, per_sample_s=v["per_sample_ms"] / 1e3)
        r = simulate(policy, workers, torch.zeros(DIM + 1), lr=v["lr"], steps=v["steps"], evaluate=evaluate, label=v["model"])
        p50, p99 = r.step_time_quantile(0.5), r.step_time_quantile(0.99)
        rows.append([name, p50 if p50 is not None else "-", p99 if p99 is not None else "-",
                     float(r.step_times.sum()), r.final_loss, r.stalled or ""])
        out[name] = {"step_s_p50": p50, "step_s_p99": p99, "total_s": float(r.step_times.sum()),
                     "final_loss": r.final_loss, "initial_loss": r.initial_loss, "stalled": r.stalled,
                     "grad_cosine": r.grad_cosine, "steps_run": len(r.records)}
    print(f"simulated straggler scenario: {n} workers, s={s}, model {v['model']}, {v['steps']} steps, lr {v['lr']}; "
          f"compute EMULATED at {v['per_sample_ms']} ms/sample x the model's factor")
    print_table(["policy", "step_s p50", "step_s p99", "total_s", "final loss", "stalled"], rows,
                title="per policy (simulated clock)")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"scenario": v, "policies": out}, f, indent=2)
        print(f"wrote {json_path}")
    return 0
