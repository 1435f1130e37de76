"""Sample-priority modes, the pay switch and Selective-Backprop's choice (pure numpy, no Ray)."""

import math

import numpy as np
import pytest

from pdml_ray.config import SamplePriorityConfig
from pdml_ray.errors import ConfigError, ReportError
from pdml_ray.priority.sample import SamplePrioritizer
from pdml_ray.priority.sample_switch import PaySwitch, predicted_gain
from pdml_ray.priority.selective_backprop import BackpropSelector


def _table(n: int, scores: np.ndarray, **cfg) -> SamplePrioritizer:
    sp = SamplePrioritizer(n, SamplePriorityConfig(**cfg), seed=0)
    sp.update(np.arange(n), scores, step=0)
    return sp


def test_unknown_mode_is_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match="'importance', 'annealed', 'selective-backprop', 'rho-loss'"):
        SamplePriorityConfig(mode="focal")


def test_annealed_beta_rises_late_and_meets_the_linear_one_at_the_ends():
    cfg = dict(is_exponent_start=0.2, is_exponent_end=1.0, is_anneal_steps=1000)
    linear = SamplePrioritizer(10, SamplePriorityConfig(**cfg))
    late = SamplePrioritizer(10, SamplePriorityConfig(mode="annealed", **cfg))
    assert late.beta(0) == linear.beta(0) == 0.2
    assert late.beta(500) == pytest.approx(0.2 + 0.8 / 8) and linear.beta(500) == pytest.approx(0.6)
    assert late.beta(1000) == linear.beta(1000) == 1.0 and late.beta(5000) == 1.0


def test_rho_loss_scores_the_reducible_loss_and_draws_by_it():
    n = 100
    sp = SamplePrioritizer(n, SamplePriorityConfig(mode="rho-loss", uniform_mix=0.0), seed=0)
    irreducible = np.zeros(n)
    irreducible[:50] = 2.0  # noisy samples: high loss that the holdout model has too
    sp.set_irreducible_losses(np.arange(n), irreducible)
    losses = np.full(n, 2.1)
    losses[50:60] = 1.0      # learnable and not yet learnt
    losses[60:] = 0.05       # learnt
    sp.update(np.arange(n), losses, step=0)
    np.testing.assert_allclose(sp.scores[:50], 0.1)
    np.testing.assert_allclose(sp.scores[50:60], 1.0)
    drawn = np.concatenate(sp.plan(1, [4000]).indices)
    # p ~ reducible loss: the ten learnable samples carry 10 / (50 * 0.1 + 10 + 40 * 0.05) = 10 / 17
    assert np.mean((drawn >= 50) & (drawn < 60)) == pytest.approx(10 / 17, abs=0.03)
    with pytest.raises(ConfigError, match="rho-loss"):
        SamplePrioritizer(n).set_irreducible_losses(np.arange(3), np.ones(3))
    with pytest.raises(ReportError, match="finite"):
        sp.set_irreducible_losses(np.arange(2), np.array([1.0, -1.0]))
    restored = SamplePrioritizer(n, SamplePriorityConfig(mode="rho-loss", uniform_mix=0.0), seed=0)
    restored.load_state_dict(sp.state_dict())
    np.testing.assert_array_equal(restored.irreducible, irreducible)


def test_selective_backprop_draws_uniformly_with_unit_weights_but_keeps_scoring():
    n = 1000
    scores = np.full(n, 0.01)
    scores[:10] = 10.0
    sp = _table(n, scores, mode="selective-backprop")
    plan = sp.plan(1, [5000])
    drawn, w = np.concatenate(plan.indices), np.concatenate(plan.weights)
    assert np.mean(drawn < 10) == pytest.approx(0.01, abs=0.006)  # uniform, not ~90% as by priority
    assert np.all(w == 1.0)
    assert sp.stats().priority_on is False and sp.stats().mode == "selective-backprop"
    assert sp.seen.all()


def test_predicted_gain_is_one_for_uniform_and_the_second_moment_ratio_for_p_proportional_to_s():
    s = np.random.default_rng(0).exponential(size=10_000)
    assert predicted_gain(s, np.ones_like(s)) == pytest.approx(1.0)
    assert predicted_gain(s, s / s.mean()) == pytest.approx(np.mean(s * s) / s.mean() ** 2)  # ~2 for exponential


def test_pay_switch_turns_priority_off_on_flat_scores_and_back_on_with_hysteresis():
    n = 2000
    sp = _table(n, np.full(n, 0.7), pay_threshold=1.05, uniform_mix=0.0)
    plan = sp.plan(1, [2000])
    assert sp.stats().switches_off == 1 and not sp.stats().priority_on
    assert sp.stats().predicted_gain == pytest.approx(1.0)
    assert np.all(np.concatenate(plan.weights) == 1.0)
    peaked = np.full(n, 0.01)
    peaked[:100] = 5.0  # 5% of the samples hold most of the loss: gain ~ 19
    sp.update(np.arange(n), peaked, step=2)
    plan = sp.plan(3, [2000])
    stats = sp.stats()
    assert stats.switches_on == 1 and stats.priority_on and stats.predicted_gain > 10
    assert np.mean(np.concatenate(plan.indices) < 100) > 0.8
    assert stats.selection_seconds > 0


def test_pay_switch_counts_the_measured_cost():
    switch = PaySwitch(1.0)
    switch.record_selection(0.5, steps=10)  # 50 ms of selection per step
    switch.note_step_seconds(0.1)           # against a 100 ms step: cost factor 1.5
    assert switch.cost_factor() == pytest.approx(1.5)
    s = np.ones(100)
    s[:50] = 3.0  # gain (mean s^2) / (mean s)^2 = 5 / 4 = 1.25 < 1.5
    assert switch.decide(s, s / s.mean()) is False and switch.switches_off == 1
    assert switch.gain == pytest.approx(1.25) and switch.cost == pytest.approx(1.5)
    assert PaySwitch(None).decide(s, s / s.mean()) is True  # no threshold: never switches
    assert math.isnan(PaySwitch(None).gain)


def test_backprop_selector_takes_the_share_above_the_window_percentile():
    sel = BackpropSelector(share=0.25, window=8)
    mask = sel.select(np.array([0.1, 0.2, 5.0, 0.3, 0.4, 4.0, 0.5, 0.6]))
    np.testing.assert_array_equal(np.flatnonzero(mask), [2, 5])
    # the next batch is judged against the history: all low now, so only its highest one is trained
    mask = sel.select(np.array([0.01, 0.02, np.nan]))
    np.testing.assert_array_equal(mask, [False, True, False])
    assert sel.trained == 3 and sel.forward_only == 8
    with pytest.raises(ConfigError, match="backprop_share"):
        BackpropSelector(0.0, 8)


def test_the_gain_estimate_finds_the_few_heavy_samples_a_uniform_subsample_would_miss():
    n = 20_000
    scores = np.full(n, 0.001)
    scores[:19] = 5.0  # 19 positives in 20,000: a uniform subsample of 1,024 holds about one
    sp = _table(n, scores, pay_threshold=1.0)
    relative_p = n * sp.probabilities(np.arange(n), 1)
    exact = np.mean(scores**2) / np.mean(scores**2 / relative_p)
    sp.plan(1, [128])
    assert exact > 5 and sp.stats().predicted_gain == pytest.approx(exact, rel=0.05)
    assert sp.stats().priority_on


def test_the_deriver_feeds_the_reported_step_time_and_the_switch_shows_in_stats_and_gauges():
    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.decisions import WorkerReport
    from pdml_ray.priority.sample_deriver import SamplePriorityDeriver

    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8),
                        sample_priority=SamplePriorityConfig(pay_threshold=1.0))
    deriver = SamplePriorityDeriver(config, 2)
    deriver.on_dataset(100)
    reports = [WorkerReport(worker_id=w, step=0, samples=4, compute_s=0.1, step_s=s,
                            sample_indices=np.arange(4 * w, 4 * w + 4), sample_losses=np.ones(4, dtype=np.float32))
               for w, s in ((0, 0.2), (1, 0.4))]
    deriver.ingest(reports)
    assert deriver.table.switch.step_s == pytest.approx(0.3)  # the mean of the workers' step times
    stats = deriver.stats()
    assert "pay switch off 0x / on 0x" in stats.summary_lines()[0]
    names = {g.name for g in stats.gauges()}
    assert {"pdml_sample_switches_off_total", "pdml_sample_switches_on_total", "pdml_sample_priority_on_ratio",
            "pdml_sample_selection_seconds_total"} <= names


def test_the_logit_gradient_proxy_sees_no_gain_where_losses_differ_but_gradients_saturate():
    n = 4000
    losses = np.where(np.arange(n) % 2 == 0, 5.0, 10.0)  # both misclassified: |sigmoid(z) - y| ~ 1 for each
    by_loss = _table(n, losses, pay_threshold=1.0, uniform_mix=0.0)
    by_grad = _table(n, losses, pay_threshold=1.0, uniform_mix=0.0, gain_proxy="logit-gradient")
    by_loss.plan(1, [64]), by_grad.plan(1, [64])
    assert by_loss.stats().predicted_gain == pytest.approx(62.5 / 56.25, rel=0.02)  # E[s^2] / E[s^2 / (N p)], N p = s / 7.5
    assert by_grad.stats().predicted_gain < 0.95 and not by_grad.stats().priority_on  # p ~ loss, gradients equal
    with pytest.raises(ConfigError, match="gain_proxy"):
        SamplePriorityConfig(gain_proxy="norm")
