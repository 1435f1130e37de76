"""Continuity check: the measures are right, collapses either way are caught, recalibration recovers."""

import math

import numpy as np
import pytest

from pdml_ray.config import ContinuityConfig
from pdml_ray.priority.continuity import (ContinuityMonitor, Recalibration, RunningSquares, measure,
                                          recalibrate_priorities)


def test_measures_of_known_vectors():
    n = 1000
    uniform = measure(np.full(n, 3.0))
    assert uniform.normalized_ess == pytest.approx(1.0)
    assert uniform.normalized_entropy == pytest.approx(1.0)
    assert uniform.tie_fraction == 1.0

    one_hot = np.zeros(n)
    one_hot[7] = 5.0
    m = measure(one_hot)
    assert m.normalized_ess == pytest.approx(1.0 / n)
    assert m.normalized_entropy == pytest.approx(0.0, abs=1e-12)

    # k equal items out of n: ESS = k / n, entropy = log k / log n.
    k_hot = np.zeros(n)
    k_hot[:50] = 2.0
    m = measure(k_hot)
    assert m.normalized_ess == pytest.approx(50 / n)
    assert m.normalized_entropy == pytest.approx(math.log(50) / math.log(n))

    # Exponential scores: ESS = (E s)^2 / E s^2 = 1/2; no ties.
    expo = measure(np.random.default_rng(0).exponential(size=200_000), max_items=None)
    assert expo.normalized_ess == pytest.approx(0.5, abs=0.01)
    assert expo.tie_fraction < 0.01


def test_measure_edge_cases_and_scale_invariance():
    assert measure(np.array([4.0])).normalized_ess == 1.0
    assert measure(np.zeros(10)).normalized_ess == 1.0  # nothing to prefer: uniform
    p = np.random.default_rng(1).exponential(size=500)
    a, b = measure(p), measure(p * 1e200)
    assert a.normalized_ess == pytest.approx(b.normalized_ess, rel=1e-9)
    assert a.normalized_entropy == pytest.approx(b.normalized_entropy, rel=1e-9)
    with pytest.raises(ValueError, match="finite and >= 0"):
        measure(np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="empty"):
        measure(np.array([]))


def test_subsampled_measure_tracks_full_measure():
    rng = np.random.default_rng(2)
    p = rng.lognormal(0.0, 1.0, size=1_000_000)  # ESS = exp(-sigma^2) = 0.368
    m = measure(p, max_items=1 << 16, rng=rng)
    assert m.num_items == 1 << 16
    assert m.normalized_ess == pytest.approx(math.exp(-1.0), rel=0.05)


def test_healthy_loss_distributions_are_not_flagged():
    mon = ContinuityMonitor(ContinuityConfig())
    rng = np.random.default_rng(3)
    n = 20_000
    # Losses at initialisation: narrow (CV 2%) but continuous -> ESS > 0.999, yet no ties.
    assert mon.check(0.69 * (1 + 0.02 * rng.standard_normal(n)), 0).healthy
    # Typical mid-training losses.
    assert mon.check(rng.exponential(size=n), 10).healthy
    # Imbalanced data: 0.5% rare samples carry most of the loss (ESS ~ 0.005).
    losses = rng.exponential(0.01, size=n)
    losses[: n // 200] = rng.uniform(2, 5, size=n // 200)
    v = mon.check(losses, 20)
    assert v.healthy and 0.002 < v.measures.normalized_ess < 0.02
    assert mon.collapsed_flat == 0 and mon.collapsed_peaked == 0


def test_naive_percentile_check_misses_a_peak_that_this_catches():
    # The source article's check: share below the 20th / above the 80th percentile >= 0.2.
    def proof_of_continuity(p, threshold=0.2):
        low = np.mean(p < np.percentile(p, 20))
        high = np.mean(p > np.percentile(p, 80))
        return low >= threshold and high >= threshold

    rng = np.random.default_rng(4)
    peaked = rng.uniform(1.0, 2.0, size=10_000)
    peaked[:3] = 1e7  # three samples take ~100% of the probability
    assert proof_of_continuity(peaked)  # "healthy" to the naive check
    assert ContinuityMonitor(ContinuityConfig()).check(peaked, 0).collapse == "peaked"


def _drive(kind: str, steps: int, cfg: ContinuityConfig, seed: int = 5):
    """Priorities evolving step by step into a collapse; returns (monitor, first detection step, p)."""
    rng = np.random.default_rng(seed)
    n = 10_000
    p = rng.lognormal(0.0, 1.0, size=n)
    mon = ContinuityMonitor(cfg)
    detected = None
    for step in range(1, steps + 1):
        if kind == "flat":  # a deriver that stops discriminating: scores shrink towards their mean
            p = p.mean() + 0.6 * (p - p.mean())
        else:  # a deriver that fixates on a handful of items: their scores grow 50% a step
            p[:5] *= 1.5
        if mon.due(step, mon.last.step if mon.last else None):
            v = mon.check(p, step)
            if not v.healthy and detected is None:
                detected = step
                return mon, detected, p, v
    return mon, detected, p, None


def test_a_check_is_due_every_interval_even_when_steps_are_skipped():
    mon = ContinuityMonitor(ContinuityConfig(check_interval=10))
    assert mon.due(4, None)
    assert not mon.due(13, 4) and mon.due(14, 4) and mon.due(19, 4)  # feedback folded in 5 steps at a time


@pytest.mark.parametrize("kind", ["flat", "peaked"])
def test_collapse_is_detected_within_50_steps_and_recalibration_recovers(kind):
    cfg = ContinuityConfig(check_interval=10)
    mon, detected, p, verdict = _drive(kind, 200, cfg)
    # First step at which the collapse condition actually holds (checked every step on a copy).
    probe = ContinuityMonitor(ContinuityConfig(check_interval=1))
    rng = np.random.default_rng(5)
    q = rng.lognormal(0.0, 1.0, size=10_000)
    onset = None
    for step in range(1, 201):
        if kind == "flat":
            q = q.mean() + 0.6 * (q - q.mean())
        else:
            q[:5] *= 1.5
        if not probe.check(q, step).healthy:
            onset = step
            break
    assert onset is not None and onset > 1, "the drive must start from a healthy distribution"
    assert detected is not None and detected - onset < 50
    assert verdict.collapse == kind
    assert getattr(mon, f"collapsed_{kind}") == 1
    recal = verdict.recalibration
    assert isinstance(recal, Recalibration) and recal.until_step == detected + cfg.recalibration_steps
    assert recal.uniform_mix == cfg.recalibration_mix
    fixed = recalibrate_priorities(p, recal, np.random.default_rng(0))
    after = mon.check(fixed, detected + 1)
    assert after.healthy, after.reason
    if kind == "peaked":
        assert after.measures.normalized_ess > 10 * verdict.measures.normalized_ess


def test_recalibration_compresses_peaks_geometrically():
    p = np.array([1.0, 1.0, 1.0, 1e6, 0.0])
    recal = Recalibration(kind="peaked", noise=0.0, reset_fraction=0.5, uniform_mix=0.5, until_step=10)
    out = recalibrate_priorities(p, recal, np.random.default_rng(0))
    np.testing.assert_allclose(out, [1.0, 1.0, 1.0, 1e3, 0.0])  # prior = median of positives = 1


def test_config_messages_say_how_to_fix():
    with pytest.raises(ValueError, match="max_tie_fraction must be a number in \\(0.5, 1\\]"):
        ContinuityConfig(max_tie_fraction=0.3)
    with pytest.raises(ValueError, match="check_interval must be an integer in \\[1,"):
        ContinuityConfig(check_interval=0)
    with pytest.raises(ValueError, match=r"min_normalized_ess must be a number in \[0, 0.4\) \(below max_normalized_ess\)"):
        ContinuityConfig(min_normalized_ess=0.5, max_normalized_ess=0.4)
    with pytest.raises(ValueError, match="reset_fraction must be a number in \\[0, 1\\]"):
        ContinuityConfig(reset_fraction=1.5)


def _sums_check(mon: ContinuityMonitor, p: np.ndarray, step: int):
    return mon.check_sums(p.size, float(p.sum()), float(p @ p), step, lambda: p)


@pytest.mark.parametrize("kind", ["healthy", "flat", "peaked"])
def test_check_from_running_sums_agrees_with_the_full_check(kind):
    rng = np.random.default_rng(6)
    p = {"healthy": rng.exponential(size=20_000),
         "flat": np.full(20_000, 0.7) * (1 + 1e-6 * rng.standard_normal(20_000)),
         "peaked": np.concatenate([np.full(3, 1e6), rng.uniform(1, 2, size=19_997)])}[kind]
    full = ContinuityMonitor(ContinuityConfig()).check(p, 0)
    sums = _sums_check(ContinuityMonitor(ContinuityConfig()), p, 0)
    assert sums.collapse == full.collapse == (None if kind == "healthy" else kind)
    assert sums.measures.normalized_ess == pytest.approx(full.measures.normalized_ess, rel=1e-9)
    assert math.isnan(sums.measures.normalized_entropy)
    # Ties are only counted when the ESS reads flat: they cannot make the verdict otherwise.
    assert math.isnan(sums.measures.tie_fraction) == (kind != "flat")


def test_running_sums_catch_a_peak_that_a_subsample_misses():
    # 5 of a million items hold ~98% of the mass: a 4,096-item subsample almost surely misses all 5.
    p = np.random.default_rng(7).uniform(1.0, 2.0, size=1_000_000)
    p[:5] = 1e7
    cfg = ContinuityConfig(max_check_items=4096)
    assert ContinuityMonitor(cfg, seed=0).check(p, 0).healthy
    verdict = _sums_check(ContinuityMonitor(cfg), p, 0)
    assert verdict.collapse == "peaked" and verdict.measures.normalized_ess < 1e-5


def test_a_rare_class_holding_a_large_tables_mass_is_not_a_collapse():
    # 1 positive in 2,000 among 100,000 samples, the positives carrying most of the loss: the
    # distribution covers ~45 items (normalised ESS ~5e-4). Three items holding it all is a collapse.
    rng = np.random.default_rng(9)
    losses = rng.exponential(1e-4, size=100_000)
    losses[:50] = rng.uniform(2.0, 5.0, size=50)
    mon = ContinuityMonitor(ContinuityConfig())
    verdict = _sums_check(mon, losses, 0)
    assert verdict.measures.normalized_ess < ContinuityConfig().min_normalized_ess  # the fraction alone would flag it
    assert verdict.healthy
    losses[:3] = 1e4
    assert _sums_check(mon, losses, 1).collapse == "peaked"
    losses[:3] = losses[3]  # the rare class again; judged by the fraction alone it reads peaked
    assert _sums_check(ContinuityMonitor(ContinuityConfig(min_effective_items=math.inf)), losses, 2).collapse == "peaked"
    with pytest.raises(ValueError, match="min_effective_items must be a number in \\[0,"):
        ContinuityConfig(min_effective_items=-1)


# ---------------------------------------------------------------- running sum of squares


def test_running_squares_equal_the_full_sum_through_updates():
    rng = np.random.default_rng(11)
    p = rng.exponential(size=5000)
    running = RunningSquares()
    assert running.value is None  # no exact sum yet
    running.reset(p)
    for _ in range(300):
        idx = np.unique(rng.integers(0, p.size, size=200))
        new = rng.exponential(size=idx.size) * rng.choice([0.0, 1.0, 30.0], size=idx.size)
        running.replace(p[idx], new)
        p[idx] = new
        assert running.value == pytest.approx(float(p @ p), rel=1e-11)
    assert running.resets == 1  # healthy churn never forced a recomputation


def test_running_squares_ask_for_a_recomputation_after_a_peak_came_and_went():
    rng = np.random.default_rng(12)
    p = rng.uniform(1.0, 2.0, size=1000)
    running = RunningSquares()
    running.reset(p)
    old = p[:3].copy()
    running.replace(old, np.full(3, 1e9))   # a peak of 3e18 in the sum
    running.replace(np.full(3, 1e9), old)   # and gone again: the running sum lost its low digits
    assert abs(running.square - float(p @ p)) > 1e-6 * float(p @ p)  # what a plain running sum would report
    assert running.value is None           # so it asks for the exact sum instead
    running.reset(p)
    assert running.value == pytest.approx(float(p @ p), rel=1e-15) and running.resets == 2
    running.replace(p[:1], np.array([1e200]))  # the square overflows
    assert running.value is None


def test_running_sums_threshold_is_validated():
    assert ContinuityConfig().running_sums_from == 1 << 20 and ContinuityConfig().check_interval == 50
    with pytest.raises(ValueError, match="running_sums_from must be an integer in \\[0,"):
        ContinuityConfig(running_sums_from=-1)
