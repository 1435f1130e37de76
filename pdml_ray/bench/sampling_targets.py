"""``bench sampling``'s targets (BENCHMARKS.md): the figures a run is checked against, each with its
value, its target and whether it was met, for the run's data (``--imbalance``, ``--label-noise``) and arms.
"""

from __future__ import annotations

import argparse
from typing import Any

# Targets of the issues (BENCHMARKS.md): priority vs uniform (issue 24), the best label-free arm at imbalance
# 1000, rho-loss on noisy labels, the balanced control with the switch, sum-tree and continuity costs (issue 26).
_STEP_RATIO_TARGET, _TIME_RATIO_TARGET, _CONTROL_SLOWDOWN = 3.0, 2.0, 1.05
_HIGH_IMBALANCE, _HIGH_STEP_RATIO, _HIGH_TIME_RATIO = 1000, 10.0, 3.0
_RHO_VS_LABELS = 1.2  # rho-loss steps at most this times label-aware oversampling's, on noisy labels
_SUMTREE_MS_TARGET, _CONTINUITY_FRACTION_TARGET = 2.0, 1e-3


def targets(args: argparse.Namespace, summary: dict[str, Any], control: dict[str, Any], tree: dict[str, Any],
            at_scale: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The targets that apply to this run's data (--imbalance, --label-noise) and arms."""
    def at_least(value: float | None, target: float) -> dict[str, Any]:
        return {"value": value, "target": target, "met": value is not None and value >= target}

    def below(value: float | None, target: float) -> dict[str, Any]:
        return {"value": value, "target": target, "met": value is not None and value < target}

    arms, best = summary["arms"], summary["best_label_free"]
    out = {
        "step_ratio >= 3 (uniform / priority steps to target)": at_least(summary["step_ratio"], _STEP_RATIO_TARGET),
        "time_ratio >= 2 (uniform / priority time to target)": at_least(summary["time_ratio"], _TIME_RATIO_TARGET),
    }
    if args.imbalance >= _HIGH_IMBALANCE and args.label_noise == 0:
        out[f"imbalance >= 1000: best label-free arm ({best}) >= 10x fewer steps than tuned uniform"] = \
            at_least(arms[best]["step_ratio"], _HIGH_STEP_RATIO)
        out[f"imbalance >= 1000: best label-free arm ({best}) >= 3x less wall time than tuned uniform"] = \
            at_least(arms[best]["time_ratio"], _HIGH_TIME_RATIO)
    if args.label_noise > 0 and "rho_loss" in arms and "priority" in arms:
        # fewer median steps (a miss counts as the budget): rho_loss over priority > 1 beats it
        out["noisy labels: rho_loss beats importance sampling (priority steps / rho_loss steps > 1)"] = {
            "value": arms["priority"]["steps_to_target"] / arms["rho_loss"]["steps_to_target"], "target": 1.0,
            "met": arms["rho_loss"]["steps_to_target"] < arms["priority"]["steps_to_target"]}
        if "label_balanced" in arms:
            out["noisy labels: rho_loss within 1.2x of label-aware oversampling (rho_loss / label_balanced steps)"] = \
                below(arms["rho_loss"]["steps_to_target"] / arms["label_balanced"]["steps_to_target"], _RHO_VS_LABELS
                      + 1e-12)
    out["balanced control: priority with the pay switch at most 1.05x slower (time_ratio >= 1/1.05)"] = \
        at_least(control["time_ratio"], round(1.0 / _CONTROL_SLOWDOWN, 4))
    if "budget_time_ratio" in control:  # the same over the whole budget: the switch's cost while it stays off
        out["balanced control: over the whole budget at most 1.05x slower (uniform / priority training time)"] = \
            at_least(control["budget_time_ratio"], round(1.0 / _CONTROL_SLOWDOWN, 4))
    out["sum-tree draw + update, B = 1024, N = 1e7: median < 2 ms"] = below(tree["draw_update_ms_median"],
                                                                           _SUMTREE_MS_TARGET)
    out["sample table plan + update (the library's path), B = 1024, N = 1e7: median < 2 ms"] = \
        below(at_scale["table_plan_update_ms_median"], _SUMTREE_MS_TARGET)
    out["continuity cost < 0.1% of a step (library default interval)"] = \
        below(summary["continuity_overhead_fraction"], _CONTINUITY_FRACTION_TARGET)
    out["continuity cost at N = 1e7 < 0.1% of the reference step"] = \
        below(at_scale["incremental_fraction_of_step"], _CONTINUITY_FRACTION_TARGET)
    return out
