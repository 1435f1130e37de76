"""Gradient priorities: normalisers, the combined priority, collapse resets, K, top-K with no starvation,
staleness, user priority functions, and the deriver through the real in-process Scheduler."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.config import GradientPriorityConfig, NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.config.gradient import load_priority_fn
from pdml_ray.config.training import check_ray_train
from pdml_ray.decisions import Boundary, GradientDecision, WorkerReport
from pdml_ray.errors import ConfigError, PlanError, ReportError, StateError
from pdml_ray.priority.gradient import (GradientStats, RunningMean, k_from_progress, mark_applied, relative_to_best,
                                        relative_to_mean, select_topk, staleness_weight)
from pdml_ray.priority.registry import enabled_derivers
from pdml_ray.scheduler import Scheduler

N = 4


def _config(sample: bool = False, **gradient) -> PDMLConfig:
    return PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=100, warmup_steps=0),
                      sample_priority=SamplePriorityConfig() if sample else None,
                      gradient_priority=GradientPriorityConfig(**gradient))


def _reports(step, grad_norms, losses, compute_s=(0.1,) * N, samples=25):
    return [WorkerReport(worker_id=w, step=step, samples=samples, compute_s=c, loss=l, grad_norm=g)
            for w, (g, l, c) in enumerate(zip(grad_norms, losses, compute_s))]


class Run:
    """A Scheduler fed step by step; ``boundary()`` asks for decisions as rank 0 would every 5 steps."""

    def __init__(self, config: PDMLConfig, num_workers: int = N) -> None:
        self.s = Scheduler(config, num_workers)
        self.step = 0
        self.since: dict[str, int] = {}
        self.n = num_workers

    def steps(self, count, grad_norms, losses, compute_s=(0.1,) * N):
        for _ in range(count):
            g = grad_norms(self.step) if callable(grad_norms) else grad_norms
            loss = losses(self.step) if callable(losses) else losses
            self.s.report(_reports(self.step, g, loss, compute_s))
            self.step += 1

    def boundary(self) -> GradientDecision:
        bundle = self.s.bundle(Boundary(self.step, 5, (100 // self.n,) * self.n), self.since)
        self.since.update({name: d.version for name, d in bundle.decisions.items()})
        d = self.s.decision("gradient")
        assert isinstance(d, GradientDecision)
        return d

    @property
    def deriver(self):
        return self.s.derivers["gradient"]

    @property
    def stats(self) -> GradientStats:
        return self.s.stats().derivers["gradient"]


# -- normalisers --------------------------------------------------------------------------------------
def test_running_mean_is_bias_corrected_and_exponential():
    m = RunningMean(0.5)
    assert math.isnan(m.value)
    m.update(2.0)
    assert m.value == 2.0  # the first value is the mean at once, not alpha times it
    m.update(4.0)
    assert m.value == pytest.approx((0.25 * 2 + 0.5 * 4) / 0.75)
    for _ in range(60):
        m.update(10.0)
    assert m.value == pytest.approx(10.0)


def test_relative_to_mean_and_to_best():
    np.testing.assert_allclose(relative_to_mean(np.array([1.0, 2.0, np.nan]), 2.0), [0.5, 1.0, 1.0])
    np.testing.assert_allclose(relative_to_mean(np.array([1.0, 2.0]), math.nan), [1.0, 1.0])
    np.testing.assert_allclose(relative_to_best(np.array([100.0, 50.0, 25.0])), [1.0, 0.5, 0.25])
    np.testing.assert_allclose(relative_to_best(np.array([np.nan, 50.0])), [1.0, 1.0])


@pytest.mark.parametrize("term, scale_field", [(0, "grad"), (1, "loss")])
def test_the_grad_and_loss_terms_are_unit_free_and_oriented(term, scale_field):
    """Multiplying every gradient norm (or loss) by 1000 leaves its term unchanged; the worker with the
    largest norm (loss) has the largest term."""
    terms = []
    for scale in (1.0, 1000.0):
        run = Run(_config())
        g = [1.0, 2.0, 3.0, 4.0] if scale_field == "grad" else [1.0] * N
        loss = [0.5, 1.0, 1.5, 2.0] if scale_field == "loss" else [1.0] * N
        g = [x * scale for x in g] if scale_field == "grad" else g
        loss = [x * scale for x in loss] if scale_field == "loss" else loss
        run.steps(10, g, loss)
        run.boundary()
        terms.append(np.array(run.stats.grad_terms if term == 0 else run.stats.data_terms))
    np.testing.assert_allclose(terms[0], terms[1], rtol=1e-9)
    assert list(np.argsort(terms[0])) == [0, 1, 2, 3]
    assert terms[0].mean() == pytest.approx(1.0, rel=0.02)  # steady signals: ratios to their own (recency-weighted) mean


def test_the_node_term_is_throughput_relative_to_the_best_worker_from_the_node_deriver():
    run = Run(_config())
    run.steps(10, [1.0] * N, [1.0] * N, compute_s=(0.1, 0.2, 0.4, 0.1))
    run.boundary()
    assert run.stats.node_source == "measured"
    np.testing.assert_allclose(run.stats.node_terms, [1.0, 0.5, 0.25, 1.0], rtol=1e-6)


def test_with_sample_priorities_the_data_term_reads_the_sample_table():
    """Worker 0 trains on samples whose table scores are 4x the rest while its reported loss says the
    opposite: the data term follows the table."""
    run = Run(_config(sample=True))
    run.s.set_dataset_size(400)
    for step in range(6):
        reports = []
        for w in range(N):
            idx = np.arange(w * 100, w * 100 + 25, dtype=np.int64) + (step % 4) * 25
            losses = np.full(25, 4.0 if w == 0 else 1.0, dtype=np.float32)
            reports.append(WorkerReport(worker_id=w, step=step, samples=25, compute_s=0.1,
                                        loss=0.1 if w == 0 else 1.0, grad_norm=1.0 + w, sample_indices=idx,
                                        sample_losses=losses))
        run.s.report(reports)
        run.step += 1
    run.boundary()
    stats = run.stats
    assert stats.data_source == "sample table"
    np.testing.assert_allclose(stats.data_terms, np.array([4.0, 1.0, 1.0, 1.0]) / 1.75, rtol=1e-5)
    assert run.deriver.data_source == "sample table"
    run_off = Run(_config())  # without the table: the reported loss, so worker 0 is the easiest
    run_off.steps(6, [1.0, 2.0, 3.0, 4.0], [0.1, 1.0, 1.0, 1.0])
    run_off.boundary()
    assert run_off.stats.data_source == "reported loss" and int(np.argmin(run_off.stats.data_terms)) == 0


# -- collapse resets ------------------------------------------------------------------------------------
def _run_until_collapse(run, grad_norms, losses, limit=12):
    """Boundaries until the continuity check resets the weights; the decision of that boundary."""
    for _ in range(limit):
        run.steps(5, grad_norms, losses)
        before = run.deriver.collapse_resets
        d = run.boundary()
        if run.deriver.collapse_resets > before:
            return d
    raise AssertionError("no collapse")


@pytest.mark.parametrize("kind, grad_norms", [
    ("flat", lambda s: [1.0, 2.0, 3.0, 4.0]),       # arm (0, 0, 1): equal nodes give equal priorities
    ("peaked", lambda s: [1000.0, 1.0, 1.0, 1.0]),  # arm (1, 0, 0): one worker holds the mass
])
def test_collapsed_priorities_send_the_weights_back_to_the_prior_and_are_counted(kind, grad_norms):
    run = Run(_config(simplex_resolution=1, collapse_hold=2))  # arms: prior, (1,0,0), (0,1,0), (0,0,1)
    losses = lambda s: [2.0 / (1 + 0.1 * s) * (1 + 0.1 * w) for w in range(N)]  # noqa: E731
    d = _run_until_collapse(run, grad_norms, losses)
    stats = run.stats
    assert d.weights == (0.5, 0.3, 0.2) and d.reason.startswith(f"collapse reset ({kind})")
    assert stats.collapse_resets == 1 and getattr(stats, f"collapsed_{kind}") == 1
    assert run.deriver.bandit.resets == 1 and run.deriver.bandit.counts.sum() == 0
    # the prior's own priorities are healthy: recomputed with it, they are not collapsed
    assert run.deriver.monitor.last.collapse == kind
    for _ in range(2):  # held for collapse_hold boundaries
        run.steps(5, grad_norms, losses)
        assert run.boundary().weights == (0.5, 0.3, 0.2)
    assert run.stats.collapse_resets == 1


def test_healthy_priorities_are_not_reset():
    run = Run(_config(simplex_resolution=1))
    for _ in range(8):  # visits every arm; spread norms, losses and speeds keep each arm healthy
        run.steps(5, lambda s: [1.0, 2.0, 3.0, 4.0], lambda s: [1.0 / (1 + s), 2.0 / (1 + s), 1.5 / (1 + s), 1 / (1 + s)],
                  compute_s=(0.1, 0.2, 0.15, 0.12))
        run.boundary()
    assert run.stats.collapse_resets == 0 and run.deriver.monitor.checks == 8


# -- K ------------------------------------------------------------------------------------------------
def test_k_follows_the_convergence_rate_between_its_bounds():
    assert k_from_progress(math.nan, math.nan, 0.5, 1.0) == 1.0
    assert k_from_progress(0.1, 0.1, 0.5, 1.0) == 0.5
    assert k_from_progress(0.05, 0.1, 0.5, 1.0) == pytest.approx(0.75)
    assert k_from_progress(-0.01, 0.1, 0.5, 1.0) == 1.0  # loss going up: apply everything
    run = Run(_config(k_min=0.25, k_max=0.75, progress_ema=0.5))
    assert run.boundary().k_fraction == 0.75  # nothing measured yet
    fast = lambda s: [2.0 * 0.8 ** s] * N  # noqa: E731
    ks = []
    for _ in range(4):
        run.steps(5, [1.0, 2.0, 3.0, 4.0], fast)
        ks.append(run.boundary().k_fraction)
    assert ks[-1] == pytest.approx(0.25)  # constant fast relative progress: the smallest K
    plateau = 2.0 * 0.8 ** run.step
    for _ in range(6):
        run.steps(5, [1.0, 2.0, 3.0, 4.0], [plateau] * N)
        ks.append(run.boundary().k_fraction)
    assert ks[-1] > 0.7 and all(0.25 <= k <= 0.75 for k in ks)  # stalled: towards k_max


# -- selection and staleness --------------------------------------------------------------------------
def test_select_topk_takes_the_highest_priorities_and_due_workers():
    last = [5, 5, 5, 5]
    assert select_topk([0.1, 0.9, 0.5, 0.7], [0, 1, 2, 3], 0.5, last, 6, 4) == (1, 3)
    assert select_topk([0.1, 0.9, 0.5, 0.7], [0, 2], 0.5, last, 6, 4) == (2,)  # only arrived ones
    assert select_topk([0.1, 0.9, 0.5, 0.7], [0, 1, 2, 3], 0.25, [1, 5, 5, 5], 6, 4) == (0,)  # 0 is due
    assert select_topk([0.1, 0.9, 0.5, 0.7], [], 0.5, last, 6, 4) == ()
    np.testing.assert_array_equal(mark_applied(last, (1, 3), 6), [5, 6, 5, 6])
    with pytest.raises(PlanError, match="k_fraction"):
        select_topk([1.0], [0], 0.0, [0], 1, 1)
    with pytest.raises(PlanError, match="outside"):
        select_topk([1.0], [3], 0.5, [0], 1, 1)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 8), max_wait=st.integers(1, 6), k=st.floats(0.01, 1.0), seed=st.integers(0, 2 ** 16),
       steps=st.integers(1, 40))
def test_no_worker_waits_more_than_max_wait_steps(n, max_wait, k, seed, steps):
    """Whatever the priorities (fixed zeros for worker 0 included) and K, with every gradient arriving
    each step, every worker is applied at least once in any max_wait consecutive steps."""
    rng = np.random.default_rng(seed)
    last = np.full(n, -1, dtype=np.int64)
    for step in range(steps):
        pri = rng.random(n)
        pri[0] = 0.0
        chosen = select_topk(pri, range(n), k, last, step, max_wait)
        assert len(chosen) >= max(1, math.ceil(k * n - 1e-9))
        last = mark_applied(last, chosen, step)
        assert (step - last < max_wait).all()


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 8), max_wait=st.integers(1, 6), k=st.floats(0.01, 1.0), seed=st.integers(0, 2 ** 16))
def test_with_random_arrivals_every_due_arrival_is_applied_and_nothing_else_beyond_k(n, max_wait, k, seed):
    rng = np.random.default_rng(seed)
    last = np.full(n, -1, dtype=np.int64)
    for step in range(30):
        arrived = [i for i in range(n) if rng.random() < 0.6]
        pri = rng.random(n)
        chosen = select_topk(pri, arrived, k, last, step, max_wait)
        assert set(chosen) <= set(arrived)
        due = {i for i in arrived if step - last[i] >= max_wait}
        assert due <= set(chosen)
        if arrived:
            kk = max(1, math.ceil(k * len(arrived) - 1e-9))
            assert len(chosen) == max(kk, len(due))
            others = [i for i in chosen if i not in due]
            skipped = [i for i in arrived if i not in chosen]
            if others and skipped:  # the non-due choices are the top priorities
                assert min(pri[others]) >= max(pri[skipped])
        last = mark_applied(last, chosen, step)


def test_staleness_weight_is_one_over_one_plus_s_up_to_the_bound_then_refused():
    assert [staleness_weight(s, 3) for s in range(5)] == [1.0, 0.5, 1 / 3, 0.25, 0.0]
    assert staleness_weight(0, 0) == 1.0 and staleness_weight(1, 0) == 0.0
    with pytest.raises(PlanError, match="staleness"):
        staleness_weight(-1, 3)
    with pytest.raises(PlanError, match="staleness"):
        staleness_weight(1.5, 3)  # type: ignore[arg-type]


# -- user priority functions --------------------------------------------------------------------------
def test_a_module_function_priority_is_imported_and_used_as_the_gradient_signal():
    assert load_priority_fn("priority_fns:grad_norm_squared")(_reports(0, [3.0] * N, [1.0] * N)[0]) == 9.0
    assert load_priority_fn("priority_fns:with_default") is not None
    run = Run(_config(priority_fn="priority_fns:grad_norm_squared"))
    run.steps(10, [1.0, 2.0, 3.0, 4.0], [1.0] * N)
    run.boundary()
    terms = np.array(run.stats.grad_terms)  # the squares, over their own running mean
    np.testing.assert_allclose(terms / terms[0], [1.0, 4.0, 9.0, 16.0], rtol=1e-9)
    assert terms.mean() == pytest.approx(1.0, rel=0.03)
    bad = Run(_config(priority_fn="priority_fns:negative"))
    bad.steps(1, [1.0] * N, [1.0] * N)  # refused and counted by the scheduler (see below), never raised
    assert bad.s.rejected_by_kind == {"priority_fn": N}
    with pytest.raises(ReportError, match="priority_fns:negative.*returned -1.0"):  # a direct caller still hears it
        bad.deriver.ingest(_reports(1, [1.0] * N, [1.0] * N, (0.1,) * N))


@pytest.mark.parametrize("name, message", [
    ("no_such_module_xyz:fn", "no module named 'no_such_module_xyz'"),
    ("priority_fns:missing", "has no function 'missing'"),
    ("priority_fns:NOT_A_FUNCTION", "not a function"),
    ("priority_fns:two_reports", "exactly one positional argument"),
    ("priority_fns:no_arguments", "exactly one positional argument"),
    ("priority_fns.grad_norm_squared", "'module:function'"),
    ("priority_fns:grad norm", "'module:function'"),
    ("eval('1'):x", "'module:function'"),
])
def test_bad_priority_functions_are_refused_before_a_run_starts(name, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_priority_fn(name)
    with pytest.raises(ConfigError, match="gradient_priority.priority_fn"):  # what PDMLTrainer checks
        check_ray_train(PDMLConfig.from_dict({"node_priority": {"global_batch_size": 8},
                                              "gradient_priority": {"priority_fn": name}}))


@pytest.mark.parametrize("kwargs, message", [
    (dict(prior_weights=(0.5, 0.5, 0.5)), "prior_weights"),
    (dict(prior_weights=(1.2, -0.2, 0.0)), "prior_weights"),
    (dict(k_min=0.9, k_max=0.5), "k_min and k_max"),
    (dict(max_wait=0), "max_wait"),
    (dict(max_staleness=-1), "max_staleness"),
    (dict(bandit_discount=0.0), "bandit_discount"),
])
def test_the_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        GradientPriorityConfig(**kwargs)


# -- through the scheduler ----------------------------------------------------------------------------
def test_the_deriver_publishes_priorities_at_boundaries_through_the_scheduler():
    assert enabled_derivers(_config()) == ["node", "gradient"]
    assert "gradient" not in enabled_derivers(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8)))
    run = Run(_config())
    d0 = run.s.decision("gradient")
    assert d0.version == 0 and d0.priorities == (1.0,) * N and d0.k_fraction == 1.0
    norms = lambda s: [1.0, 2.0, 4.0, 8.0]  # noqa: E731
    losses = lambda s: [(1.0 + 0.2 * w) * 3.0 / (1 + 0.05 * s) for w in range(N)]  # noqa: E731
    decisions = []
    for _ in range(6):
        run.steps(5, norms, losses, compute_s=(0.1, 0.1, 0.12, 0.1))
        decisions.append(run.boundary())
    for i, d in enumerate(decisions):
        d.validate(N)
        assert d.effective_step == 5 * (i + 1) and d.version == i + 1
        assert d.max_wait == 4 and d.max_staleness == 4
    first = decisions[0]  # prior weights: the largest norm and loss first
    assert first.weights == (0.5, 0.3, 0.2) and list(np.argsort(first.priorities)) == [0, 1, 2, 3]
    history = run.s.decision_history("gradient")
    assert [GradientDecision.from_dict(h) for h in history] == [d0] + decisions
    stats = run.stats
    assert stats.high_low_grad_norm_ratio > 1.5  # the guide's validation figure
    lines = "\n".join(run.s.stats().summary_lines())
    assert "gradient priorities: weights" in lines and "high/low grad-norm ratio" in lines
    gauges = {(g.name, g.tags) for g in stats.gauges()}
    assert ("pdml_gradient_k_ratio", ()) in gauges and ("pdml_gradient_priority", (("worker", "3"),)) in gauges
    assert ("pdml_gradient_term_weight", (("term", "node"),)) in gauges
    assert sum(stats.arm_pulls) == 5  # one reward per interval after the first


def test_state_round_trip_gives_the_same_stats_and_the_same_next_decision():
    norms = lambda s: [1.0 + 0.1 * s, 2.0, 3.0, 4.0]  # noqa: E731
    losses = lambda s: [2.0 / (1 + 0.1 * s) + 0.1 * w for w in range(N)]  # noqa: E731
    a = Run(_config())
    for _ in range(5):
        a.steps(5, norms, losses)
        a.boundary()
    a.steps(2, norms, losses)  # part of an interval: its losses and step times travel too
    b = Run(_config())
    b.s.load_state_dict(a.s.state_dict())
    b.step, b.since = a.step, dict(a.since)
    assert b.stats == a.stats
    for run in (a, b):
        run.steps(3, norms, losses)
    assert b.boundary() == a.boundary()
    with pytest.raises(StateError, match="workers"):
        Run(_config(), num_workers=3).deriver.load_state_dict(a.deriver.state_dict())


def test_a_decision_refuses_bad_values():
    good = GradientDecision(version=1, effective_step=5, priorities=(1.0, 2.0), k_fraction=0.5,
                            weights=(0.5, 0.3, 0.2), max_wait=4, max_staleness=2)
    good.validate(2)
    assert GradientDecision.from_dict(good.to_dict()) == good and "K 0.50" in str(good)
    for bad in (dict(priorities=(1.0, -1.0)), dict(k_fraction=0.0), dict(weights=(0.5, 0.5, 0.5)), dict(max_wait=0)):
        with pytest.raises(PlanError):
            GradientDecision(**{**good.to_dict(), **bad}).validate(2)
    with pytest.raises(PlanError, match="expected 3"):
        good.validate(3)


def test_through_the_scheduler_a_report_the_priority_fn_cannot_score_is_refused_and_counted_not_half_applied():
    from pdml_ray.config import GradientPriorityConfig, NodePriorityConfig, PDMLConfig
    from pdml_ray.decisions import WorkerReport
    from pdml_ray.scheduler import Scheduler

    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64),
                        gradient_priority=GradientPriorityConfig(priority_fn="priority_fns:negative"))
    scheduler = Scheduler(config, 2)
    before = scheduler.derivers["node"].state_dict()
    scheduler.report([WorkerReport(worker_id=w, step=5, samples=32, compute_s=0.1, grad_norm=1.0) for w in range(2)])
    assert scheduler.reports_rejected == 2 and scheduler.rejected_by_kind == {"priority_fn": 2}
    assert scheduler.derivers["node"].state_dict() == before  # the node deriver never saw them
    assert "returned -1.0" in scheduler.rejections[-1]


# -- issue 22: bounded state, all of a batch or none of it ---------------------------------------------
def test_300000_reports_with_distinct_steps_and_no_boundary_keep_the_state_bounded():
    """interval_step_s kept one entry per distinct step until a boundary: 300,000 reports grew memory by
    21 MB and the saved state from 2.0 to 6.5 MB. The interval still counts every step and second."""
    from pdml_ray.priority.gradient import INTERVAL_STEPS

    run = Run(_config())
    deriver = run.deriver
    for first in range(0, 300_000, 1000):
        run.s.report([WorkerReport(worker_id=step % N, step=step, samples=25, compute_s=0.1, loss=1.0, grad_norm=1.0)
                      for step in range(first, first + 1000)])
        assert len(deriver.interval_step_s) <= INTERVAL_STEPS
    state = deriver.state_dict()
    assert len(state["interval_step_s"]) <= INTERVAL_STEPS and run.s.reports_received == 300_000
    restored = Run(_config()).deriver
    restored.load_state_dict(state)
    deriver._close_interval()
    assert deriver.previous == (1.0, 300_000, pytest.approx(300_000 * 0.1))  # (mean loss, steps, seconds)
    restored._close_interval()
    assert restored.previous == deriver.previous


def test_a_priority_fn_that_refuses_part_of_a_batch_in_ingest_leaves_the_deriver_untouched():
    """The scheduler asked priority_fn first (report_rejection); a function that answers differently the
    second time must not leave the batch half-taken."""
    run = Run(_config())
    deriver = run.deriver
    calls = []

    def fickle(report):
        calls.append(report.worker_id)
        return -1.0 if len(calls) == 3 else 2.0

    deriver.priority_fn = fickle
    before = deriver.state_dict()
    with pytest.raises(ReportError, match="returned -1.0"):
        deriver.ingest(_reports(0, [1.0] * N, [1.0] * N))
    assert repr(deriver.state_dict()) == repr(before)  # repr: NaN fields compare equal
