"""SamplePrioritizer: draws follow p, weights make estimates unbiased, the table behaves and survives checkpoints."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.config import ContinuityConfig, SamplePriorityConfig
from pdml_ray.priority.continuity import measure
from pdml_ray.priority.sample import SamplePrioritizer


def _seeded(n: int, scores: np.ndarray, **cfg) -> SamplePrioritizer:
    sp = SamplePrioritizer(n, SamplePriorityConfig(**cfg), seed=0)
    sp.update(np.arange(n), scores, step=0)
    return sp


def test_probabilities_follow_the_formula_and_sum_to_one():
    n = 50
    scores = np.linspace(0.0, 3.0, n)
    sp = _seeded(n, scores, exponent=2.0, uniform_mix=0.2)
    p = sp.probabilities(np.arange(n), step=1)
    expected = 0.8 * scores**2 / (scores**2).sum() + 0.2 / n
    np.testing.assert_allclose(p, expected, rtol=1e-12)
    assert p.sum() == pytest.approx(1.0)


def test_draw_frequencies_match_p_chi_square():
    n = 20
    scores = np.random.default_rng(0).exponential(size=n)
    sp = _seeded(n, scores, exponent=1.5, uniform_mix=0.1)
    counts = np.zeros(n)
    for step in range(1, 201):
        plan = sp.plan(step, [100, 100])
        counts += np.bincount(np.concatenate(plan.indices), minlength=n)
    expected = counts.sum() * sp.probabilities(np.arange(n), 1)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 43.82  # 99.9% quantile, 19 degrees of freedom


def test_importance_weighted_gradient_is_unbiased_with_beta_1():
    """Weighted mean of per-sample gradients of a linear model over priority draws == the uniform mean."""
    rng = np.random.default_rng(1)
    n, d = 400, 3
    x = rng.standard_normal((n, d))
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.standard_normal(n) > 1.5).astype(float)  # rare-ish 1s
    w = np.array([0.2, 0.1, -0.3])
    grads = ((x @ w - y)[:, None] * x)                      # (n, d) squared-loss gradients
    losses = 0.5 * (x @ w - y) ** 2
    sp = _seeded(n, losses, exponent=1.0, uniform_mix=0.05, is_exponent_start=1.0, is_anneal_steps=0)
    estimates, naive = [], []
    for step in range(1, 401):
        plan = sp.plan(step, [64])
        idx = plan.indices[0]
        inv = 1.0 / (n * sp.probabilities(idx, step))     # (B,) un-normalised weights, beta = 1
        np.testing.assert_allclose(plan.weights[0], inv / inv.max(), rtol=1e-5)
        estimates.append((inv[:, None] * grads[idx]).mean(axis=0))
        naive.append(grads[idx].mean(axis=0))
    estimates, naive = np.array(estimates), np.array(naive)
    truth = grads.mean(axis=0)
    se = estimates.std(axis=0, ddof=1) / np.sqrt(len(estimates))
    assert np.all(np.abs(estimates.mean(axis=0) - truth) < 4 * se), (estimates.mean(axis=0), truth, se)
    # The test has power: without the weights the same draws are far off.
    se_naive = naive.std(axis=0, ddof=1) / np.sqrt(len(naive))
    assert np.any(np.abs(naive.mean(axis=0) - truth) > 8 * se_naive)


def test_unseen_samples_get_the_max_score_so_far():
    n = 100
    sp = SamplePrioritizer(n, SamplePriorityConfig(uniform_mix=0.0), seed=0)
    p0 = sp.probabilities(np.arange(n), 0)
    np.testing.assert_allclose(p0, 1.0 / n)  # nothing seen: uniform
    sp.update(np.array([0, 1, 2]), np.array([1.0, 4.0, 2.0]), step=0)
    p = sp.probabilities(np.arange(n), 1)
    assert p[5] == pytest.approx(p[1])  # unseen == the max (4.0)
    assert p[0] == pytest.approx(p[1] / 4)
    sp.update(np.array([1]), np.array([0.5]), step=1)  # the max ever seen stays the reference
    assert sp.probabilities(np.array([5]), 2)[0] == pytest.approx(4 * sp.probabilities(np.array([0]), 2)[0])
    assert sp.stats().seen_fraction == pytest.approx(0.03)
    mean_sp = SamplePrioritizer(n, SamplePriorityConfig(uniform_mix=0.0, unseen_score="mean"), seed=0)
    mean_sp.update(np.array([0, 1, 2]), np.array([1.0, 4.0, 1.0]), step=0)
    assert mean_sp.probabilities(np.array([9]), 1)[0] == pytest.approx(2 * mean_sp.probabilities(np.array([0]), 1)[0])


def test_unseen_samples_are_drawn_first():
    n = 1000
    sp = SamplePrioritizer(n, SamplePriorityConfig(uniform_mix=0.0), seed=0)
    sp.update(np.arange(10), np.full(10, 1.0), step=0)  # 10 seen, all at the max: equal weight
    idx = np.concatenate(sp.plan(1, [500]).indices)
    assert np.mean(idx >= 10) > 0.97  # 990 of 1000 samples are unseen


def test_update_duplicates_last_wins_and_ema():
    sp = SamplePrioritizer(10, SamplePriorityConfig(score="loss"), seed=0)
    sp.update(np.array([3, 3, 4]), np.array([1.0, 5.0, 2.0]), step=0)
    assert sp.scores[3] == 5.0 and sp.scores[4] == 2.0
    ema = SamplePrioritizer(10, SamplePriorityConfig(score="loss_ema", score_ema=0.25), seed=0)
    ema.update(np.array([3]), np.array([4.0]), step=0)
    ema.update(np.array([3]), np.array([8.0]), step=1)
    assert ema.scores[3] == pytest.approx(0.75 * 4.0 + 0.25 * 8.0)
    sp.update(np.array([5, 6]), np.array([np.nan, -3.0]), step=2)  # NaN dropped, negative -> 0
    assert not sp.seen[5] and sp.seen[6] and sp.scores[6] == 0.0
    with pytest.raises(ValueError, match="one loss per index"):
        sp.update(np.array([1, 2]), np.array([1.0]), step=3)


def test_staleness_decay_pulls_old_scores_to_the_mean_in_sweeps():
    n = 1000
    cfg = SamplePriorityConfig(staleness_decay=0.5, stale_after=10, uniform_mix=0.0)
    sp = SamplePrioritizer(n, cfg, seed=0)
    scores = np.ones(n)
    scores[0] = 101.0  # mean = 1.1
    sp.update(np.arange(n), scores, step=0)
    mean = scores.mean()
    assert sp._chunk == 100  # N / stale_after samples visited per step: never all N
    for step in range(1, 40):
        sp.update(np.array([1]), np.array([1.0]), step=step)  # keep sample 1 fresh
    assert abs(sp.scores[0] - mean) < 0.05 * (101.0 - mean)  # decayed most of the way
    assert sp.scores[1] == 1.0
    assert sp.seen_sum == pytest.approx(sp.scores.sum())
    assert sp.tree.total == pytest.approx(sp.scores.sum())


def test_without_replacement_draws_distinct_indices():
    n = 300
    sp = _seeded(n, np.random.default_rng(2).exponential(size=n) ** 4, replacement=False, uniform_mix=0.0)
    plan = sp.plan(1, [100, 150, 50])
    idx = np.concatenate(plan.indices)
    assert idx.size == 300 and np.unique(idx).size == 300
    # a step larger than the data set is as distinct as it can be (every sample, one twice), not an error
    idx = np.concatenate(sp.plan(2, [301]).indices)
    assert idx.size == 301 and np.unique(idx).size == 300 and sp.stats().distinct_shortfalls == 1


def test_all_zero_scores_fall_back_to_uniform():
    n = 40
    sp = _seeded(n, np.zeros(n), uniform_mix=0.0)
    idx = np.concatenate(sp.plan(1, [400]).indices)
    assert np.unique(idx).size > 30
    assert sp.stats().uniform_fallbacks == 1.0


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6), n=st.integers(1, 200), step=st.integers(0, 3000))
def test_property_plan_shapes_and_weights(sizes, n, step):
    sp = SamplePrioritizer(n, SamplePriorityConfig(), seed=1)
    sp.update(np.arange(n), np.random.default_rng(n).exponential(size=n), step=0)
    plan = sp.plan(step, sizes)
    plan.validate(tuple(sizes), n)
    w = np.concatenate(plan.weights)
    if w.size:
        assert w.max() == pytest.approx(1.0) and w.min() > 0


def test_beta_anneals_to_one():
    sp = SamplePrioritizer(10, SamplePriorityConfig(is_exponent_start=0.4, is_anneal_steps=100), seed=0)
    assert sp.beta(0) == pytest.approx(0.4)
    assert sp.beta(50) == pytest.approx(0.7)
    assert sp.beta(100) == 1.0 and sp.beta(10_000) == 1.0


def test_peaked_collapse_is_caught_and_recalibrated_through_updates():
    n = 5000
    cfg = SamplePriorityConfig(uniform_mix=0.1)
    cont = ContinuityConfig(check_interval=10, recalibration_steps=30, recalibration_mix=0.5)
    sp = SamplePrioritizer(n, cfg, cont, seed=0)
    rng = np.random.default_rng(3)
    sp.update(np.arange(n), rng.exponential(size=n), step=0)
    detected = None
    for step in range(1, 100):
        sp.plan(step, [64])
        # The deriver fixates: 3 samples' losses grow 40% a step, the rest stay put.
        sp.update(np.arange(3), sp.scores[:3] * 1.4 + 1.0, step)
        if detected is None and sp.stats().collapsed_peaked >= 1:
            detected = step
            assert sp.mix(step) == 0.5 and sp.mix(step + 29) == 0.5 and sp.mix(step + 30) == 0.1
            assert sp.stats().normalized_ess < cont.min_normalized_ess
            break
    assert detected is not None and detected <= 50
    assert sp.stats().recalibrations == 1.0
    assert sp.check(detected + 1).healthy  # the recalibrated table is a healthy distribution again


def test_flat_collapse_is_caught_through_updates_and_the_table_recovers():
    n = 5000
    cont = ContinuityConfig(check_interval=10, recalibration_steps=30)
    sp = SamplePrioritizer(n, SamplePriorityConfig(staleness_decay=0.05, stale_after=5), cont, seed=0)
    rng = np.random.default_rng(8)
    sp.update(np.arange(n), rng.exponential(size=n), step=0)
    detected = None
    for step in range(1, 80):
        idx = np.concatenate(sp.plan(step, [64]).indices)
        if step < 20:  # a healthy table: fresh, varied losses (and stale ones decaying towards the mean)
            sp.update(idx, rng.exponential(size=idx.size), step)
        else:  # the deriver stops discriminating: every sample scores the same
            sp.update(np.arange(n), np.full(n, 0.7), step)
        if sp.stats().collapsed_flat >= 1:
            detected = step
            break
        assert sp.stats().recalibrations == 0.0, sp.monitor.last.reason
        if sp.monitor.last.step == step:  # the check's ESS (from the tree's sums) is that of the seen s^alpha
            exact = measure(sp.tree.values()[sp.seen]).normalized_ess
            assert sp.stats().normalized_ess == pytest.approx(exact, rel=1e-9)
    assert detected is not None and 20 <= detected < 30
    assert sp.stats().recalibrations == 1.0 and sp.mix(detected) == cont.recalibration_mix
    assert sp.check(detected + 1).healthy  # noise broke the ties


def test_flat_collapse_is_caught_with_few_samples_seen():
    # 20 of 1,000,000 samples seen, all with the same loss: ties are counted on all the seen ones
    # (a uniform subsample of the table would most likely hold none of them).
    sp = SamplePrioritizer(1_000_000, SamplePriorityConfig(), ContinuityConfig(), seed=0)
    verdict = sp.update(np.arange(0, 1_000_000, 50_000), np.full(20, 0.3), step=0)  # the first check is due
    assert verdict.collapse == "flat" and verdict.measures.num_items == 20
    assert verdict.measures.tie_fraction == 1.0 and sp.recalibrations == 1


def test_check_survives_huge_scores():
    sp = SamplePrioritizer(100, SamplePriorityConfig(), ContinuityConfig(), seed=0)
    sp.update(np.arange(100), np.full(100, 1e200) * np.linspace(1.0, 2.0, 100), step=0)
    verdict = sp.check(1)
    assert verdict.healthy and 0.9 < verdict.measures.normalized_ess < 1.0


def test_state_dict_round_trip():
    n = 500
    cfg = SamplePriorityConfig(staleness_decay=0.1, stale_after=5)
    cont = ContinuityConfig(check_interval=10)  # a check in steps 30-39 on both (the last verdict is not state)
    a = SamplePrioritizer(n, cfg, cont, seed=7)
    rng = np.random.default_rng(4)
    for step in range(30):
        idx = np.concatenate(a.plan(step, [20, 12]).indices)
        a.update(idx, rng.exponential(size=idx.size), step)
    state = a.state_dict()
    assert all(isinstance(v, (np.ndarray, int, float, dict, type(None))) for v in state.values())
    b = SamplePrioritizer(n, cfg, cont, seed=123)
    b.load_state_dict(state)
    losses = rng.exponential(size=32)
    for step in range(30, 40):
        pa, pb = a.plan(step, [20, 12]), b.plan(step, [20, 12])
        for ia, ib, wa, wb in zip(pa.indices, pb.indices, pa.weights, pb.weights):
            np.testing.assert_array_equal(ia, ib)
            np.testing.assert_allclose(wa, wb, rtol=1e-6)
        idx = np.concatenate(pa.indices)
        a.update(idx, losses, step)
        b.update(idx, losses, step)
    np.testing.assert_allclose(a.scores, b.scores)
    sa, sb = dataclasses.asdict(a.stats()), dataclasses.asdict(b.stats())
    sa.pop("selection_seconds"), sb.pop("selection_seconds")  # wall time of each copy's own calls
    assert sa == pytest.approx(sb, nan_ok=True, abs=1e-3)
    with pytest.raises(ValueError, match="same data set"):
        SamplePrioritizer(n + 1, cfg).load_state_dict(state)


def test_config_messages_say_how_to_fix():
    with pytest.raises(ValueError, match="exponent must be a number in \\[0, 10\\]"):
        SamplePriorityConfig(exponent=-1.0)
    with pytest.raises(ValueError, match="uniform_mix must be a number in \\[0, 1\\]"):
        SamplePriorityConfig(uniform_mix=1.5)
    with pytest.raises(ValueError, match="unseen_score must be 'max' or 'mean'"):
        SamplePriorityConfig(unseen_score="min")
    with pytest.raises(ValueError, match="score must be 'loss' or 'loss_ema'"):
        SamplePriorityConfig(score="grad")
    with pytest.raises(ValueError, match="num_samples >= 1"):
        SamplePrioritizer(0)


def test_plans_for_an_interval_come_from_one_draw_with_per_step_beta():
    n = 1000
    scores = np.ones(n)
    scores[:10] = 50.0  # 10 hot samples hold about a third of the mass
    sp = _seeded(n, scores, uniform_mix=0.0, is_exponent_start=0.0, is_anneal_steps=10)
    plans = sp.plans(5, 5, [30, 10])
    assert [p.step for p in plans] == [5, 6, 7, 8, 9]
    for k, plan in enumerate(plans):
        assert [len(i) for i in plan.indices] == [30, 10]
        w = np.concatenate(plan.weights)
        assert w.max() == pytest.approx(1.0)
        hot = np.concatenate(plan.indices) < 10
        if hot.any() and (~hot).any():  # beta = (5 + k) / 10: hot samples weigh (1/50)^beta of the rest
            ratio = w[hot].max() / w[~hot].max()
            assert ratio == pytest.approx((1 / 50) ** ((5 + k) / 10), rel=1e-5)
    drawn = np.concatenate([np.concatenate(p.indices) for p in plans])
    assert 0.2 < np.mean(drawn < 10) < 0.5  # 500 / 1490 = 0.34 expected
    with pytest.raises(ValueError, match="num_steps"):
        sp.plans(0, 0, [4])


# ---------------------------------------------------------------- running sums, exponents, label-aware baseline


@pytest.mark.parametrize("exponent", [1.0, 2.0])
def test_running_sum_of_squares_equals_the_recomputation(exponent):
    """Through updates, staleness decay, a recalibration and a restore, the running sum of squared
    leaves that the continuity check reads equals one pass over the leaves."""
    n = 3000
    cfg = SamplePriorityConfig(exponent=exponent, staleness_decay=0.2, stale_after=5)
    cont = ContinuityConfig(check_interval=10, running_sums_from=0)  # running sums at any size
    sp = SamplePrioritizer(n, cfg, cont, seed=0)
    rng = np.random.default_rng(5)

    def exact():
        leaves = sp.tree.leaves
        return float(leaves @ leaves)

    for step in range(120):
        idx = np.concatenate(sp.plan(step, [64, 32]).indices)
        losses = rng.exponential(size=idx.size)
        if 60 <= step < 75:  # one sample takes over: a peaked collapse and a recalibration
            idx, losses = np.append(idx, 0), np.append(losses, 1e6 * (step - 59))
        sp.update(idx, losses, step)
        running = sp.squares.value  # None: too much churn since the last exact sum, recomputed on read
        assert running is None or running == pytest.approx(exact(), rel=1e-9), step
        assert sp.leaf_square_sum() == pytest.approx(exact(), rel=1e-9), step
    # one exact sum at the start, one per recalibration, one after the peak left (churn): not per update
    assert 1 <= sp.recalibrations and sp.squares.resets <= 2 + 2 * sp.recalibrations
    restored = SamplePrioritizer(n, cfg, cont, seed=1)
    restored.load_state_dict(sp.state_dict())
    assert restored.squares.value == pytest.approx(exact(), rel=1e-12)


def test_checks_from_running_sums_and_from_a_pass_agree():
    n = 4000
    runs = {}
    for name, threshold in (("running", 0), ("pass", 1 << 30)):
        sp = SamplePrioritizer(n, SamplePriorityConfig(), ContinuityConfig(check_interval=10, running_sums_from=threshold),
                               seed=3)
        rng = np.random.default_rng(3)
        verdicts = []
        for step in range(150):
            idx = np.concatenate(sp.plan(step, [128]).indices)
            losses = rng.exponential(size=idx.size)
            if step >= 100:
                losses[:2] *= 1e4  # a peak builds up
            v = sp.update(idx, losses, step)
            if v is not None:
                verdicts.append((v.step, v.collapse, v.measures.normalized_ess))
        runs[name] = (sp.squares is not None, verdicts)
    assert runs["running"][0] and not runs["pass"][0]
    a, b = runs["running"][1], runs["pass"][1]
    assert [v[:2] for v in a] == [v[:2] for v in b] and any(v[1] == "peaked" for v in a)
    np.testing.assert_allclose([v[2] for v in a], [v[2] for v in b], rtol=1e-9)


def test_importance_exponent_held_at_one_or_at_zero():
    n = 200
    scores = np.random.default_rng(2).exponential(size=n)
    # held at 1 from step 0: w = (N p)^-1 / max, fully unbiased from the first step
    sp = _seeded(n, scores, is_exponent_start=1.0, is_exponent_end=1.0)
    assert sp.beta(0) == 1.0 and sp.beta(500) == 1.0
    plan = sp.plan(1, [64])
    inv = 1.0 / (n * sp.probabilities(plan.indices[0], 1))
    np.testing.assert_allclose(plan.weights[0], inv / inv.max(), rtol=1e-5)
    assert sp.stats().beta == 1.0
    # no correction: beta 0 at every step, every weight 1 (the sampler's bias stays in the loss)
    sp = _seeded(n, scores, is_exponent_start=0.0, is_exponent_end=0.0)
    for step in (0, 500, 5000):
        assert sp.beta(step) == 0.0
        assert np.all(np.concatenate(sp.plan(step, [64]).weights) == 1.0)
    # annealing to an end below 1, and at once when is_anneal_steps is 0
    sp = SamplePrioritizer(10, SamplePriorityConfig(is_exponent_start=0.2, is_exponent_end=0.6, is_anneal_steps=100))
    assert sp.beta(50) == pytest.approx(0.4) and sp.beta(100) == 0.6 and sp.beta(10**6) == 0.6
    assert SamplePrioritizer(10, SamplePriorityConfig(is_anneal_steps=0, is_exponent_end=0.3)).beta(0) == 0.3
    with pytest.raises(ValueError, match="is_exponent_end must be a number in \\[0, 1\\] \\(1.0 = unbiased\\)"):
        SamplePriorityConfig(is_exponent_end=1.5)


def test_label_balanced_baseline_draws_each_class_equally_often_and_uniformly_within():
    from pdml_ray.bench.sampling_arm import class_balanced_draw

    labels = np.zeros(2000, dtype=int)
    labels[::200] = 1  # 10 minority samples among 2,000
    classes = [np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)]
    rng = np.random.default_rng(0)
    draws = np.concatenate([class_balanced_draw(rng, classes, 128) for _ in range(400)])  # 51,200 draws
    minority = labels[draws].mean()
    assert abs(minority - 0.5) < 4 * 0.5 / np.sqrt(draws.size)  # balanced (4 sigma); uniform would give 0.005
    counts = np.bincount(draws[labels[draws] == 1], minlength=2000)[classes[1]]
    expected = counts.sum() / classes[1].size
    assert ((counts - expected) ** 2 / expected).sum() < 27.88  # 99.9% quantile, 9 degrees of freedom
    majority = np.bincount(draws[labels[draws] == 0], minlength=2000)[classes[0]]
    assert majority.min() > 0 and abs(majority.mean() - (draws.size - counts.sum()) / classes[0].size) < 1e-9


def test_plans_for_a_step_beyond_int64_are_refused_not_overflowed():
    """Hypothesis found it: a first step of 10**300 raised OverflowError in the beta schedule."""
    from pdml_ray.errors import PlanError

    sp = SamplePrioritizer(64, SamplePriorityConfig(replacement=False), seed=0)
    sp.update(np.arange(10), np.linspace(0, 5, 10), step=0)
    with pytest.raises(PlanError, match="first_step must be an integer in"):
        sp.plans(10**300, 1, [0])
