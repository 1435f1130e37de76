"""The pay switch's measured A/B (pdml_ray.priority.sample_switch) on synthetic loss streams, alone and
inside the sample table (pure numpy, no Ray)."""

import math

import numpy as np
import pytest

from pdml_ray.config import SamplePriorityConfig
from pdml_ray.errors import ReportError
from pdml_ray.priority.sample import SamplePrioritizer
from pdml_ray.priority.sample_switch import (_VERDICT_PATIENCE, FIRST_PROBE, MAX_GAP, MIN_GAP, PROBE_LEN, PaySwitch,
                                             ab_gain, predicted_gain)

STEPS, STEP_S, BATCH = 5, 0.01, 64


def _stream(switch: PaySwitch, intervals: int, drop, start: int = 0, loss: float = 1e4,
            priority_selection_s: float = 0.0) -> list[bool]:
    """Drive ``switch`` for ``intervals`` intervals of a synthetic run whose mean loss falls by
    ``drop(i, priority)`` over interval i; a priority interval costs ``priority_selection_s`` extra."""
    trace = []
    for i in range(start, start + intervals):
        priority = switch.begin_interval(i * STEPS, STEPS)
        switch.note_step_seconds(STEP_S)
        switch.record_selection(priority_selection_s if priority else 0.0, STEPS)
        switch.record_losses(i * STEPS + STEPS - 1, np.full(BATCH, loss), np.ones(BATCH), 1.0)  # all `loss`: no noise
        loss -= drop(i, priority)
        trace.append(priority)
    return trace


def test_selection_that_pays_turns_on_at_the_first_verdict_and_stays_on_with_sparser_probes():
    switch = PaySwitch(1.0)
    trace = _stream(switch, 200, lambda i, p: 3.0 if p else 1.0)
    assert trace[:FIRST_PROBE] == [False] * FIRST_PROBE            # uniform until measured
    assert trace[FIRST_PROBE:FIRST_PROBE + PROBE_LEN] == [True] * PROBE_LEN  # the probe
    assert trace[FIRST_PROBE + 2 * PROBE_LEN:FIRST_PROBE + 2 * PROBE_LEN + 4] == [True] * 4  # on after its verdict
    assert switch.on and switch.switches_on == 1 and switch.switches_off == 0
    assert switch.gain == pytest.approx(3.0)
    # probes back off to one in MAX_GAP + PROBE_LEN intervals: the last 100 are mostly priority draws
    assert sum(trace[-100:]) >= 100 - 3 * PROBE_LEN


def test_selection_that_stops_paying_turns_off_within_a_probe_cycle():
    switch = PaySwitch(1.0)
    _stream(switch, 60, lambda i, p: 3.0 if p else 1.0)
    assert switch.on
    # from interval 60 on priority's loss falls as fast per interval as uniform's, but its intervals
    # take 20% longer (selection seconds): measured per second it loses
    trace = _stream(switch, MAX_GAP + 4 * PROBE_LEN, lambda i, p: 1.0, start=60, priority_selection_s=0.2 * STEPS * STEP_S)
    assert not switch.on and switch.switches_off == 1
    assert switch.gain == pytest.approx(1 / 1.2)
    assert trace[-1] is False


@pytest.mark.parametrize("start_on", [False, True])
def test_a_gain_inside_the_hysteresis_band_keeps_either_state(start_on):
    switch = PaySwitch(1.0)
    switch.on = start_on
    trace = _stream(switch, 150, lambda i, p: 1.05 if p else 1.0)  # gain 1.05: above 1.0, below 1.1
    assert switch.on is start_on and switch.switches_on == switch.switches_off == 0
    assert switch.probes >= 4 and switch.gain == pytest.approx(1.05)
    assert sum(trace) == (150 - PROBE_LEN * switch.probes if start_on else PROBE_LEN * switch.probes)
    above = PaySwitch(1.0)
    _stream(above, 20, lambda i, p: 1.2 if p else 1.0)
    assert above.on and above.switches_on == 1


def test_a_loss_that_falls_only_under_priority_or_under_neither():
    assert ab_gain(1.0, 0.0) == math.inf and ab_gain(1.0, -0.5) == math.inf
    assert ab_gain(0.0, 1.0) == 0.0 and ab_gain(-1.0, -1.0) == 0.0
    flat = PaySwitch(1.0)
    flat.on = True
    _stream(flat, 20, lambda i, p: 0.0)  # a flat loss without noise: no evidence either way, the state holds
    assert flat.on and flat.gain == 0.0 and flat.probes >= 2
    only = PaySwitch(1.0)
    _stream(only, 10, lambda i, p: 1.0 if p else 0.0)  # only priority draws lower the loss
    assert only.on and only.gain == math.inf


def test_a_rising_uniform_loss_alone_does_not_turn_priority_on():
    """Around a converged model the uniform pairs' loss may rise (noise): priority, whose own loss does not
    fall, beats that rate without paying anything, and must stay off."""
    switch = PaySwitch(1.0)
    _stream(switch, 20, lambda i, p: 0.0 if p else -1.0)
    assert not switch.on and switch.switches_on == 0 and switch.gain == 0.0 and switch.probes >= 2


def test_a_verdict_waits_for_missing_losses_then_gives_up_and_probes_again():
    switch = PaySwitch(1.0)

    def run(intervals):
        for i in intervals:
            switch.begin_interval(i * STEPS, STEPS)
            switch.note_step_seconds(STEP_S)
            if i != FIRST_PROBE + 3:  # the probe's post pair loses its second interval's report
                switch.record_losses(i * STEPS, np.full(BATCH, 100.0 - i), np.ones(BATCH), 1.0)

    given_up = FIRST_PROBE + 2 * PROBE_LEN + _VERDICT_PATIENCE
    run(range(given_up))
    assert switch.probes == 1 and switch._pending == FIRST_PROBE  # still waiting
    run([given_up])
    assert switch._pending is None and math.isnan(switch.gain) and not switch.on
    run(range(given_up + 1, given_up + 1 + MIN_GAP))
    assert switch.probes == 2 and switch._pending == given_up + MIN_GAP


def test_no_threshold_never_switches_and_a_resumed_switch_keeps_its_verdict():
    free = PaySwitch(None)
    assert _stream(free, 30, lambda i, p: 0.0) == [True] * 30 and free.probes == 0
    switch = PaySwitch(1.0)
    _stream(switch, 40, lambda i, p: 3.0 if p else 1.0)
    resumed = PaySwitch(1.0)
    resumed.load_state_dict(switch.state_dict())
    assert resumed.on and resumed.switches_on == 1 and resumed.probes == switch.probes
    assert resumed.begin_interval(0, STEPS) is True  # priority from the first interval after the resume


def _run_table(sp: SamplePrioritizer, losses: np.ndarray, intervals: int, learn) -> list[bool]:
    """Bench-like driver: plans per interval, per step the drawn samples' losses (taken before the step)
    and ``learn(losses, drawn)``; one update per interval."""
    trace = []
    for i in range(intervals):
        plans = sp.plans(i * STEPS, STEPS, [256])
        trace.append(bool(sp.switch.current_priority(i * STEPS)))
        idx, reported = [], []
        for plan in plans:
            drawn = plan.indices[0]
            idx.append(drawn)
            reported.append(losses[drawn].copy())
            learn(losses, drawn)
            sp.note_step_seconds(0.05)
        sp.update(np.concatenate(idx), np.concatenate(reported), i * STEPS + STEPS - 1)
    return trace


def test_the_table_turns_priority_on_where_training_on_the_hard_samples_is_what_lowers_the_loss():
    n = 2000
    losses = np.full(n, 0.01)
    losses[:20] = 5.0  # 1% hard samples hold 83% of the loss, and only training on them lowers it

    def learn(l, drawn):
        l[np.unique(drawn)] *= 0.9

    sp = SamplePrioritizer(n, SamplePriorityConfig(pay_threshold=1.0, unseen_score="mean"), seed=0)
    _run_table(sp, losses, FIRST_PROBE + 2 * PROBE_LEN + 1, learn)
    stats = sp.stats()
    assert stats.probes == 1 and stats.switches_on == 1 and stats.priority_on
    assert stats.measured_gain > 2 and stats.predicted_gain > 2


def test_the_table_stays_uniform_where_the_loss_falls_alike_whatever_is_drawn():
    n = 5000
    losses = np.random.default_rng(1).exponential(size=n)  # spread scores: the gate lets a probe run

    def learn(l, drawn):
        l *= 0.8  # every sample learns from every step alike (a balanced, easy task)

    sp = SamplePrioritizer(n, SamplePriorityConfig(pay_threshold=1.0, unseen_score="mean"), seed=0)
    _run_table(sp, losses, 40, learn)
    stats = sp.stats()
    assert stats.probes >= 2 and stats.switches_on == 0 and not stats.priority_on
    assert stats.measured_gain == pytest.approx(1.0, abs=0.25)  # noise: the verdicts find no significant gain


def test_flat_scores_skip_the_probe_at_its_gate():
    n = 2000
    sp = SamplePrioritizer(n, SamplePriorityConfig(pay_threshold=1.05, uniform_mix=0.0), seed=0)
    sp.update(np.arange(n), np.full(n, 0.7), step=0)
    for i in range(FIRST_PROBE + 1):
        plan = sp.plans(1 + i * STEPS, STEPS, [200])
    assert sp.switch.skipped_probes == 1 and sp.stats().probes == 0 and not sp.stats().priority_on
    assert sp.stats().predicted_gain == pytest.approx(1.0)
    assert np.all(np.concatenate([np.concatenate(p.weights) for p in plan]) == 1.0)


def test_the_predicted_gain_counts_the_unseen_group_at_its_score():
    s = np.random.default_rng(0).exponential(size=10_000)
    alone = predicted_gain(s, s / s.mean())
    assert alone == pytest.approx(np.mean(s * s) / s.mean() ** 2)
    # 90% of the data set unseen, drawn at N p = 1 with the mean score: the draws are nearly uniform
    diluted = predicted_gain(s, s / s.mean(), group=(0.9, s.mean(), 1.0))
    expected = (0.1 * np.mean(s * s) + 0.9 * s.mean() ** 2) / (0.1 * s.mean() ** 2 + 0.9 * s.mean() ** 2)
    assert diluted == pytest.approx(expected) and 1.0 < diluted < 1.15 < alone


def test_while_off_the_table_takes_only_the_losses_a_probe_measures():
    n = 2000
    sp = SamplePrioritizer(n, SamplePriorityConfig(pay_threshold=1.0, unseen_score="mean"), seed=0)
    losses = np.random.default_rng(1).exponential(size=n)  # spread scores: the gate lets the probe run
    taken, asked = [], []
    for i in range(FIRST_PROBE + 2 * PROBE_LEN + 2):
        plans = sp.plans(i * STEPS, STEPS, [64])
        asked.append({p.feedback for p in plans})
        idx = np.concatenate([p.indices[0] for p in plans])
        before = sp.unseen_count
        sp.update(idx, losses[idx], i * STEPS + STEPS - 1)  # sent even where not asked for: skipped
        taken.append(sp.unseen_count < before)
    # the pair before the first probe (intervals 2, 3), the probe's (4, 5) and the pair after (6, 7)
    expected = [False, False] + [True] * 2 * (PROBE_LEN + 1) + [False, False]
    assert taken == expected and asked == [{e} for e in expected]
    assert sp.stats().skipped_losses == 4 * STEPS * 64 and sp.stats().switches_on == 0
    with pytest.raises(ReportError, match="indices"):  # a skipped update still refuses bad input
        sp.update(np.array([n]), np.array([1.0]), 9 * STEPS)


def test_a_worker_sends_no_losses_for_a_step_whose_plan_does_not_ask_for_them():
    import dataclasses

    import torch

    from pdml_ray import NodePriorityConfig, PDMLConfig
    from pdml_ray.train.context import PDMLContext

    n = 2000
    sp = SamplePrioritizer(n, SamplePriorityConfig(pay_threshold=1.0), seed=0)
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8),
                        sample_priority=SamplePriorityConfig(pay_threshold=1.0))
    ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", None)
    model = ctx.prepare_model(torch.nn.Linear(4, 1))
    x = torch.randn(n, 4)
    plans = sp.plans(0, 3, [8])  # interval 0: off, and no probe measures it
    assert [p.feedback for p in plans] == [False] * 3 and sp.stats().skipped_losses == 24
    plans[2] = dataclasses.replace(plans[2], feedback=True)  # as a plan of a measured interval
    ctx._plans.update({p.step: p for p in plans})
    sent = []
    for batch in ctx.epoch(0, 3 * 8):
        with ctx.step(batch) as step:
            step.loss(model(x[batch.indices]).squeeze(1) ** 2).backward()
        report = ctx._last_report
        assert report.step == batch.step and report.samples == 8
        sent.append(report.sample_losses is not None)
    assert sent == [False, False, True]


def test_plans_drawn_uniformly_say_so_and_a_step_takes_their_plain_mean():
    import dataclasses

    import torch

    from pdml_ray import NodePriorityConfig, PDMLConfig
    from pdml_ray.decisions import SamplePlan
    from pdml_ray.errors import PlanError
    from pdml_ray.train.context import PDMLContext

    n = 2000
    sp = SamplePrioritizer(n, SamplePriorityConfig(pay_threshold=1.0, unseen_score="mean"), seed=0)
    losses = np.random.default_rng(1).exponential(size=n)
    marks = []
    for i in range(FIRST_PROBE + 2 * PROBE_LEN + 2):
        plans = sp.plans(i * STEPS, STEPS, [64])
        marks += [(p.uniform, bool(np.all(p.weights[0] == 1.0))) for p in plans]
        sp.update(np.concatenate([p.indices[0] for p in plans]), losses[np.concatenate([p.indices[0] for p in plans])],
                  i * STEPS + STEPS - 1)
    assert all(u == ones for u, ones in marks)  # uniform exactly where every weight is 1
    assert 0 < sum(not u for u, _ in marks) < len(marks)  # the probe drew by priority, the rest uniformly
    plan = sp.plans(10_000, 1, [8])[0]
    assert plan.uniform and SamplePlan.from_dict(plan.to_dict()).uniform
    with pytest.raises(PlanError, match="marked uniform"):
        dataclasses.replace(plan, weights=(np.full(8, 0.5, dtype=np.float32),)).validate()
    # a worker's step: the plain float32 sum of a uniform plan's losses, the same loss and gradient as the
    # product with its ones
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8),
                        sample_priority=SamplePriorityConfig(pay_threshold=1.0))
    grads = []
    for uniform in (True, False):
        torch.manual_seed(0)
        ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", None)
        model = ctx.prepare_model(torch.nn.Linear(4, 1))
        x = torch.randn(n, 4)
        ctx._plans.update({0: dataclasses.replace(plan, step=0, uniform=uniform)})
        batch = next(iter(ctx.epoch(0, 8)))
        assert batch.uniform_weights is uniform
        with ctx.step(batch) as step:
            step.loss(model(x[batch.indices]).squeeze(1) ** 2).backward()
            grads.append(model.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
