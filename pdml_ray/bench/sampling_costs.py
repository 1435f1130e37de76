"""``bench sampling``'s costs at scale: the sum-tree's draw + update, the sample table's plan + update and
the continuity check on a table of N = 10^7 synthetic scores (random exponential, no model is trained at
that size), the check both as the library runs it (incremental sum of squares) and as a full pass.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pdml_ray.config import SamplePriorityConfig

_LARGE_N = 10_000_000


def sumtree_timing(reps: int, seed: int) -> dict[str, Any]:
    """Milliseconds of one draw of B = 1024 plus the update of their scores, ``reps`` times."""
    from pdml_ray.priority.sumtree import SumTree

    n, batch = _LARGE_N, 1024
    rng = np.random.default_rng(seed)
    tree = SumTree(n, rng.exponential(size=n))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        idx = tree.draw(batch, rng)
        tree.update(idx, rng.exponential(size=batch))
        times.append(time.perf_counter() - t0)
    ms = 1e3 * np.asarray(times)
    return {"n": n, "batch": batch, "repetitions": reps, "synthetic_scores": True,
            "draw_update_ms_median": float(np.median(ms)), "draw_update_ms_max": float(ms.max())}


def continuity_cost_at_scale(args: argparse.Namespace, config: SamplePriorityConfig, steps: int,
                             reference_step_ms: float) -> dict[str, Any]:
    """The continuity check on a table of N = 10^7 synthetic scores with the priority arm's ``config`` (a
    running sum of squares at this size), driven like the benchmark's priority arm (plans for
    ``plan_ahead`` steps, one update per interval, a check every ``check_interval`` steps), against
    one full pass over the table per check (what the check costs on tables below
    ``continuity.running_sums_from``)).
    Fractions are of ``reference_step_ms``: the priority arm's measured step, a small MLP on one CPU
    core, i.e. about the smallest step a model has (a pessimistic reference)."""
    from pdml_ray.config import ContinuityConfig
    from pdml_ray.priority.continuity import dot
    from pdml_ray.priority.sample import SamplePrioritizer

    n = _LARGE_N
    continuity = ContinuityConfig() if args.check_interval is None else ContinuityConfig(check_interval=args.check_interval)
    sp = SamplePrioritizer(n, config, continuity, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    sp.update(np.arange(n), rng.exponential(size=n), step=0)  # every sample seen: the steady state
    sp.check_seconds = sp.squares_seconds = 0.0
    assert sp.monitor is not None
    checks0, k = sp.monitor.checks, args.plan_ahead
    for first in range(1, steps + 1, k):
        plans = sp.plans(first, k, [args.batch_size])
        idx = np.concatenate([p.indices[0] for p in plans])
        sp.update(idx, rng.exponential(size=idx.size), first + k - 1)  # a check runs when one is due
    checks = sp.monitor.checks - checks0
    leaves = sp.tree.leaves
    full = []
    for _ in range(5):
        t0 = time.perf_counter()
        dot(leaves, leaves)
        full.append(time.perf_counter() - t0)
    full_s = float(np.median(full))
    # The library's own path at this size: one plan of B = 1024 (draw, probabilities, weights, the pay
    # switch's verdict) plus the update of its 1,024 losses (scores, sum-tree, running sums), per call.
    table_ms = []
    for step in range(steps + 1, steps + 1 + (10 if args.quick else 50)):
        t0 = time.perf_counter()
        plan = sp.plans(step, 1, [1024])[0]
        sp.update(plan.indices[0], rng.exponential(size=1024), step)
        table_ms.append(1e3 * (time.perf_counter() - t0))
    incremental_step_s = sp.check_seconds / steps
    full_step_s = full_s / continuity.check_interval + (sp.check_seconds - sp.squares_seconds) / steps
    ref = reference_step_ms / 1e3
    return {
        "n": n, "synthetic_scores": True, "steps": steps, "checks": checks, "check_interval": continuity.check_interval,
        "table_plan_update_ms_median": float(np.median(table_ms)), "table_plan_update_ms_max": float(np.max(table_ms)),
        "table_batch": 1024, "table_mode": sp.config.mode, "table_pay_threshold": sp.config.pay_threshold,
        "update_batch": k * args.batch_size, "reference_step_ms": reference_step_ms,
        "reference_step": "the benchmark's measured priority step (small MLP, one CPU core): a pessimistic reference",
        "incremental_check_us": 1e6 * (sp.check_seconds - sp.squares_seconds) / max(checks, 1),
        "incremental_update_us": 1e6 * sp.squares_seconds / max(steps // k, 1),
        "incremental_per_step_us": 1e6 * incremental_step_s,
        "incremental_fraction_of_step": incremental_step_s / ref,
        "full_pass_us": 1e6 * full_s, "full_pass_per_step_us": 1e6 * full_step_s,
        "full_pass_fraction_of_step": full_step_s / ref,
        # a mid-size model's step on one accelerator, for scale (not measured here)
        "incremental_fraction_of_100ms_step": incremental_step_s / 0.1, "full_pass_fraction_of_100ms_step": full_step_s / 0.1,
        "note": "incremental_update_us includes gathering the changed leaves' old values, which also brings "
                "them into cache for the tree's own write right after: an upper bound on the marginal cost",
    }
