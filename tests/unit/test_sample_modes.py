"""Sample-priority modes, the pay switch and Selective-Backprop's choice (pure numpy, no Ray)."""

import math

import numpy as np
import pytest

from pdml_ray.config import SamplePriorityConfig
from pdml_ray.errors import ConfigError, ReportError
from pdml_ray.priority.sample import SamplePrioritizer
from pdml_ray.priority.sample_switch import FIRST_PROBE, PaySwitch, predicted_gain
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


def _to_the_probe_gate(sp: SamplePrioritizer) -> None:
    """Plans until the pay switch's first probe is due, which computes its gate (the predicted gain)."""
    for step in range(1, FIRST_PROBE + 2):
        sp.plan(step, [64])


def test_pay_switch_gate_divides_the_predicted_gain_by_the_measured_cost():
    switch = PaySwitch(1.0)
    switch.record_selection(0.5, steps=10)  # 50 ms of selection per step (no interval yet: counted as priority)
    switch.note_step_seconds(0.1)           # against a 100 ms step: cost factor 1.5
    assert switch.cost_factor() == pytest.approx(1.5)
    s = np.ones(100)
    s[:50] = 3.0  # gain (mean s^2) / (mean s)^2 = 5 / 4 = 1.25
    assert switch.gate(predicted_gain(s, s / s.mean())) == pytest.approx(1.25 / 1.5)
    assert switch.predicted == pytest.approx(1.25) and switch.cost == pytest.approx(1.5)
    assert math.isnan(PaySwitch(None).gain) and PaySwitch(None).begin_interval(0, 5) is True


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
    _to_the_probe_gate(sp)
    assert exact > 5 and sp.stats().predicted_gain == pytest.approx(exact, rel=0.05)
    assert sp.stats().probes == 1  # the gate let the probe of priority draws run


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
    _to_the_probe_gate(by_loss), _to_the_probe_gate(by_grad)
    assert by_loss.stats().predicted_gain == pytest.approx(62.5 / 56.25, rel=0.02)  # E[s^2] / E[s^2 / (N p)], N p = s / 7.5
    assert by_grad.stats().predicted_gain < 0.95 and by_grad.stats().probes == 0  # p ~ loss, gradients equal
    assert by_grad.switch.skipped_probes == 1
    with pytest.raises(ConfigError, match="gain_proxy"):
        SamplePriorityConfig(gain_proxy="norm")


def test_the_scheduler_takes_irreducible_losses_as_a_sample_observation_before_or_after_the_data_set():
    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.decisions import Boundary, WorkerReport
    from pdml_ray.replay import recorded, replay
    from pdml_ray.scheduler import Scheduler

    n = 200
    irreducible = np.zeros(n)
    irreducible[:20] = 3.0  # mislabelled: the irreducible-loss model gets them wrong as well

    def run(send_first: bool | None, mode: str = "rho-loss") -> Scheduler:
        config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64),
                            sample_priority=SamplePriorityConfig(mode=mode, uniform_mix=0.0), replay_log=1_000)
        s = Scheduler(config, 1)
        if send_first:
            assert s.observe("sample", 0, [("irreducible", irreducible)])
        s.set_dataset_size(n)
        if send_first is False:
            assert s.observe("sample", 0, [("irreducible", irreducible)])
        losses = np.full(n, 0.5)
        losses[:20] = 3.1  # the highest plain loss, almost all of it irreducible
        s.report([WorkerReport(worker_id=0, step=0, samples=n, compute_s=0.1, sample_indices=np.arange(n),
                               sample_losses=losses.astype(np.float32))])
        return s

    def noisy_share(s: Scheduler) -> float:
        plans = s.bundle(Boundary(1, 5, (64,)), {}).decisions["sample"].plans
        return float(np.mean(np.concatenate([p.indices[0] for p in plans]) < 20))

    for send_first in (True, False):
        s = run(send_first)
        np.testing.assert_array_equal(s.derivers["sample"].table.irreducible, irreducible)
        stats = s.derivers["sample"].stats()  # what pdml-ray status and the dashboard show
        assert "irreducible losses mean 0.3" in stats.summary_lines()[0]
        assert {g.name: g.value for g in stats.gauges()}["pdml_sample_irreducible_loss_mean"] == pytest.approx(0.3)
        assert noisy_share(s) < 0.05  # reducible 0.1 against 0.5: 20 * 0.1 / (20 * 0.1 + 180 * 0.5) = 2%
        replayed = replay(recorded(s))  # the observation is an input of the log like any other
        assert replayed
    plain = run(None)
    assert noisy_share(plain) > 0.3  # without them rho-loss ranks by the plain loss: 62 / 152 = 41%
    assert "none given" in plain.derivers["sample"].stats().summary_lines()[0]

    s = run(False)  # refused whole and counted: another size, a negative loss, another mode
    assert not s.observe("sample", 1, [("irreducible", np.zeros(n - 1))])
    assert not s.observe("sample", 1, [("irreducible", np.full(n, -1.0))])
    assert not s.observe("sample", 1, [np.zeros(n)])
    np.testing.assert_array_equal(s.derivers["sample"].table.irreducible, irreducible)
    assert s.stats().rejected_by_kind["axis"] == 3
    assert not run(None, mode="importance").observe("sample", 0, [("irreducible", irreducible)])


def test_a_worker_sends_irreducible_losses_through_its_context_and_wrong_ones_fail_on_the_worker():
    import torch

    from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.scheduler import Scheduler
    from pdml_ray.train.context import PDMLContext

    n = 256

    def context(mode: str | None) -> tuple[PDMLContext, Scheduler]:
        config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=32),
                            sample_priority=SamplePriorityConfig(mode=mode) if mode else None)
        scheduler = Scheduler(config, 1)
        return PDMLContext(config, 0, 1, torch.device("cpu"), "CPU",
                           SchedulerClient(LocalSchedulerTransport(scheduler))), scheduler

    ctx, scheduler = context("rho-loss")
    il = torch.linspace(0.0, 1.0, n)  # a tensor is taken as the model's losses are
    ctx.set_irreducible_losses(il)    # before the first epoch: the table takes them when it is made
    next(iter(ctx.epoch(0, n)))
    np.testing.assert_allclose(scheduler.derivers["sample"].table.irreducible, il.double().numpy())
    with pytest.raises(ConfigError, match="256 expected, got 255"):
        ctx.set_irreducible_losses(np.ones(n - 1))
    with pytest.raises(ConfigError, match="finite"):
        ctx.set_irreducible_losses(np.full(n, np.nan))

    ctx, _ = context("rho-loss")
    ctx.set_irreducible_losses(np.ones(n))
    with pytest.raises(ConfigError, match="256 irreducible losses were set .* data set of 300"):
        next(iter(ctx.epoch(0, 300)))
    for mode in ("importance", None):
        with pytest.raises(ConfigError, match="mode='rho-loss'"):
            context(mode)[0].set_irreducible_losses(np.ones(n))


def test_rho_loss_trains_its_draws_unweighted_by_default_and_the_exponents_set_win():
    from pdml_ray.priority.sample_modes import exponents

    n = 100
    losses = np.linspace(0.01, 2.0, n)

    def weights(**cfg) -> np.ndarray:
        sp = SamplePrioritizer(n, SamplePriorityConfig(uniform_mix=0.0, **cfg), seed=0)
        if sp.irreducible is not None:
            sp.set_irreducible_losses(np.arange(n), np.zeros(n))
        sp.update(np.arange(n), losses, step=0)
        return np.concatenate(sp.plan(1, [2000]).weights)

    assert exponents(SamplePriorityConfig(mode="rho-loss")) == (0.0, 0.0)
    assert exponents(SamplePriorityConfig()) == exponents(SamplePriorityConfig(mode="annealed")) == (0.4, 1.0)
    assert exponents(SamplePriorityConfig(mode="rho-loss", is_exponent_end=1.0)) == (0.0, 1.0)
    np.testing.assert_array_equal(weights(mode="rho-loss"), 1.0)  # prioritised draws, every weight 1
    spread = lambda w: w.std() / w.mean()  # noqa: E731 - weights are normalised: their relative spread
    assert spread(weights(mode="rho-loss", is_exponent_start=1.0, is_exponent_end=1.0)) > 0.3  # corrected where set
    assert spread(weights()) > 0.15  # importance keeps its correction (beta 0.4 at the start: 0.28)
    with pytest.raises(ConfigError, match="is_exponent_start"):
        SamplePriorityConfig(is_exponent_start=1.5)
