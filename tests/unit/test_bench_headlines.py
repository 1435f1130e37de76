"""Benchmark headlines read against the right baseline, Ray-free on the targets' functions:
``bench stragglers`` compares each pgc policy with both plain codes, naming the pair, and
``bench gradients`` heads with the priority arms against ignore-stragglers and random top-K,
with ``async`` (no priority) apart."""

from pdml_ray.bench.gradients import GRID, _grid_name
from pdml_ray.bench.gradients import _targets as gradient_targets
from pdml_ray.bench.stragglers import _targets as straggler_targets


def _policy(step_ms, ttt=2.0):
    return {"step_time_p50_s": step_ms / 1e3, "time_to_target_s": ttt, "partitions_per_step": 1.0,
            "grad_cosine_min": 1.0}


def test_each_pgc_policy_is_read_against_both_plain_codes():
    # stragglers.json's medians: gc-fr 340 ms, gc-cr 447 ms, pgc-fr 175 ms, pgc-cr 239 ms
    pol = {"sync": _policy(339), "ignore-stragglers": _policy(237), "gc-fr": _policy(340), "gc-cr": _policy(447),
           "pgc-fr": _policy(175), "pgc-cr": _policy(239)}
    t = straggler_targets(pol, {p: 1.0 for p in pol}, None)
    assert round(t["pgc_cr_over_gc_fr_step_time"]["value"], 2) == 0.70
    assert not t["pgc_cr_over_gc_fr_step_time"]["met"]  # read against gc-cr alone it looked met (0.53)
    assert t["pgc_cr_over_gc_cr_step_time"]["met"] and t["pgc_fr_over_gc_fr_step_time"]["met"]
    assert {"pgc_fr_over_gc_cr_step_time"} <= set(t)


def _arm(ttt, acc=95.5):
    return {"time_to_target_s": ttt, "final_accuracy": acc, "deriver_overhead_fraction": 0.002}


def test_async_is_not_the_best_priority_arm_and_the_headline_is_priority_vs_its_controls():
    # gradients.json's medians: async far ahead without any priority, the top-K arms all alike
    arms = {"sync": _arm(3.33), "ignore-stragglers": _arm(2.46), "topk-fixed": _arm(2.46), "topk-tuned": _arm(2.47),
            "topk-random": _arm(2.46), "async": _arm(1.66)}
    arms.update({_grid_name(w): _arm(2.45) for w in GRID})
    t, comparison = gradient_targets(arms, GRID)
    assert comparison["best_priority_arm"] != "async" and comparison["best_priority_arm"].startswith("topk-w=")
    assert "async" not in comparison["priority_arms"] and "topk-random" not in comparison["priority_arms"]
    assert round(comparison["async_time_to_target_vs_sync"], 3) == round(1.66 / 3.33, 3)
    tuned = comparison["priority_arms"]["topk-tuned"]
    assert round(tuned["over_topk_random"], 3) == round(2.47 / 2.46, 3)
    assert not t["topk_tuned_over_topk_random"]["met"] and not t["topk_tuned_over_ignore_stragglers"]["met"]
    assert round(t["best_priority_arm_time_to_target_vs_sync"]["value"], 3) == round(2.45 / 3.33, 3)
