"""Issue 15: one bad input never poisons or loses state.

The rule: a bad report is refused and counted, never half-applied; a bad value never enters a
structure that is saved (validate, then write). Every test here drives one defect the issue found.
"""

import math
import pickle

import numpy as np
import pytest

from pdml_ray.config import ContinuityConfig, NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.decisions import Boundary, NodeDecision, SampleDecision, WorkerReport
from pdml_ray.errors import PlanError, ReportError
from pdml_ray.priority.continuity import (ContinuityMonitor, Recalibration, normalized_ess,
                                          recalibrate_priorities)
from pdml_ray.priority.sample import SamplePrioritizer
from pdml_ray.priority.sumtree import SumTree
from pdml_ray.scheduler import Scheduler


def _config(sample: SamplePriorityConfig | None = None, **node) -> PDMLConfig:
    kw = dict(global_batch_size=100, warmup_steps=0, hysteresis=0.0)
    kw.update(node)
    return PDMLConfig(node_priority=NodePriorityConfig(**kw), sample_priority=sample)


def _report(w, step, samples=50, compute_s=0.5, **kw) -> WorkerReport:
    return WorkerReport(worker_id=w, step=step, samples=samples, compute_s=compute_s, **kw)


def _feedback(w, step, indices, losses) -> WorkerReport:
    return _report(w, step, samples=len(indices), sample_indices=np.asarray(indices, dtype=np.int64),
                   sample_losses=np.asarray(losses))


def _b(first_step, sizes=(50, 50), k=5):
    return Boundary(first_step, k, tuple(sizes))


# -- sample table ------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss, exponent", [(np.float32(3.4e38), 10.0), (1e308, 1.0), (1e200, 2.0)])
def test_an_extreme_loss_is_refused_and_the_table_and_checkpoint_stay_sound(loss, exponent):
    s = Scheduler(_config(SamplePriorityConfig(exponent=exponent)), 2)
    s.set_dataset_size(100)
    s.report([_feedback(0, 0, [1, 2, 3], [1.0, 2.0, 3.0])])
    before = s.state_dict()["derivers"]["sample"]["table"]
    s.report([_feedback(0, 1, [4, 5], [loss, 1.0]), _feedback(1, 1, [6, 7], [0.5, 0.5])])
    assert s.reports_rejected == 1 and "loss" in s.rejections[-1]
    after = s.state_dict()["derivers"]["sample"]["table"]
    assert not after["seen"][4] and not after["seen"][5] and after["seen"][6]  # refused whole, the rest applied
    assert np.all(np.isfinite(after["scores"])) and after["max_score"] == before["max_score"]
    # plans still come, clean reports on the same samples still count, and the state loads back
    assert isinstance(s.bundle(_b(5), {"node": 0}).get("sample"), SampleDecision)
    s.report([_feedback(0, 6, [4, 5], [1.0, 1.0])])
    assert s.reports_rejected == 1
    t = Scheduler(_config(SamplePriorityConfig(exponent=exponent)), 2)
    t.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    assert isinstance(t.bundle(_b(10), {"node": 0}).get("sample"), SampleDecision)


def test_the_table_itself_validates_before_it_writes():
    sp = SamplePrioritizer(10, SamplePriorityConfig(exponent=3.0), seed=0)
    sp.update(np.array([0, 1]), np.array([1.0, 2.0]), step=0)
    state = sp.state_dict()
    with pytest.raises(ReportError, match="loss"):
        sp.update(np.array([2, 3]), np.array([1.0, 1e200]), step=1)
    after = sp.state_dict()
    for key in ("scores", "seen", "last_step"):
        assert np.array_equal(after[key], state[key])
    assert sp.max_score == 2.0 and math.isfinite(sp.tree.total)


def test_an_index_out_of_range_refuses_only_its_report_and_is_counted():
    s = Scheduler(_config(SamplePriorityConfig()), 2)
    s.set_dataset_size(100)
    s.report([_feedback(0, 0, [1, 2], [1.0, 1.0]), _feedback(1, 0, [3, 100], [1.0, 1.0]),
              _feedback(1, 1, [4, 5], [2.0, 2.0])])
    assert s.reports_rejected == 1 and "[0, 100)" in s.rejections[-1]
    table = s.derivers["sample"].table
    assert table.seen[[1, 2, 4, 5]].all() and not table.seen[3]
    assert s.reports_received == 2


@pytest.mark.parametrize("bad", [
    dict(worker_id=0.0), dict(worker_id=True), dict(step=None), dict(step=-1), dict(step=1.5),
    dict(samples=2.5), dict(samples="50"), dict(compute_s="0.5"), dict(compute_s=None),
    dict(accelerator_type=["A100"]), dict(loss=float("inf")), dict(grad_norm=float("-inf")),
    dict(wait_s=None), dict(step_s="x"), dict(overhead_s=-1.0),
])
def test_a_report_of_the_wrong_type_is_refused_and_the_rest_of_its_batch_applied(bad):
    s = Scheduler(_config(), 2)
    fields = dict(worker_id=0, step=1, samples=50, compute_s=0.5)
    fields.update(bad)
    s.report([_report(0, 0), WorkerReport(**fields), _report(1, 0), _report(0, 1)])
    assert s.reports_rejected == 1 and s.reports_received == 3 and s.last_step == 1
    assert s.derivers["node"].fit.all_measured
    assert sum(s.stats().rejected_by_kind.values()) == 1


def test_not_a_report_at_all_is_refused_and_counted():
    s = Scheduler(_config(), 2)
    s.report([{"worker_id": 0}, None, _report(0, 0)])  # type: ignore[list-item]
    assert s.reports_rejected == 2 and s.reports_received == 1


def test_a_worker_whose_sample_losses_are_not_finite_is_refused_and_counted():
    s = Scheduler(_config(SamplePriorityConfig()), 2)
    s.set_dataset_size(100)
    s.report([_feedback(0, 0, [1, 2], [np.nan, 1.0]), _feedback(1, 0, [3, 4], [np.inf, 1.0]),
              _feedback(1, 1, [5], [1.0])])
    assert s.reports_rejected == 2 and s.reports_received == 1
    assert not s.derivers["sample"].table.seen[[1, 2, 3, 4]].any()


def test_sample_feedback_of_the_wrong_shape_or_dtype_is_refused():
    s = Scheduler(_config(SamplePriorityConfig()), 2)
    s.set_dataset_size(100)
    bad = [
        _report(0, 0, sample_indices=np.array([[1, 2]]), sample_losses=np.array([[1.0, 1.0]])),
        _report(0, 0, sample_indices=np.array([1.5, 2.0]), sample_losses=np.array([1.0, 1.0])),
        _report(0, 0, sample_indices=[1, 2], sample_losses=[1.0, 1.0]),  # type: ignore[arg-type]
        _report(0, 0, sample_indices=np.array(["a", "b"]), sample_losses=np.array([1.0, 1.0])),
    ]
    s.report(bad + [_feedback(1, 0, [3], [1.0])])
    assert s.reports_rejected == len(bad) and s.reports_received == 1


# -- rates -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compute_s", [1e-307, 5e-324, 1e-300, 1e-7, 1e9])
def test_a_physically_impossible_compute_time_is_refused_not_folded_in(compute_s):
    s = Scheduler(_config(), 2)
    s.report([_report(0, 0, compute_s=compute_s), _report(1, 0, compute_s=compute_s)])
    assert s.reports_rejected == 2 and "compute_s" in s.rejections[-1]
    for step in range(1, 6):
        s.report([_report(0, step, compute_s=0.5), _report(1, step, compute_s=0.25)])
    d = s.bundle(_b(10), {"node": 0}).get("node")
    assert d is not None and d.batch_sizes == (33, 67)


def test_an_implied_rate_above_a_billion_samples_per_second_is_refused():
    s = Scheduler(_config(), 2)
    s.report([_report(0, 0, samples=10**7, compute_s=1e-3)])
    assert s.reports_rejected == 1 and "samples/s" in s.rejections[-1]


def test_one_slow_outlier_step_washes_out_within_a_few_clean_steps():
    s = Scheduler(_config(), 2)
    for step in range(40):
        s.report([_report(0, step, compute_s=0.5), _report(1, step, compute_s=0.25)])
    s.report([_report(0, 40, compute_s=1e5)])  # plausible in itself (a stall), but an outlier
    for step in range(41, 46):
        s.report([_report(0, step, compute_s=0.5), _report(1, step, compute_s=0.25)])
    rates = s.derivers["node"].fit.values
    assert rates[0] == pytest.approx(100.0, rel=0.1) and rates[1] == pytest.approx(200.0, rel=0.1)


@pytest.mark.parametrize("first, within", [(1e-5, 60), (1e-3, 40), (100.0, 60), (1e5, 130)])
def test_an_outlying_first_report_washes_out_in_bounded_clean_steps(first, within):
    """The first report has no line to be clipped against: the bound on how long it can mislead."""
    s = Scheduler(_config(), 2)
    s.report([_report(0, 0, compute_s=first), _report(1, 0, compute_s=0.25)])
    for step in range(1, within + 1):
        s.report([_report(0, step, compute_s=0.5), _report(1, step, compute_s=0.25)])
    assert s.derivers["node"].fit.values[0] == pytest.approx(100.0, rel=0.1)


# -- node decisions ----------------------------------------------------------------------------------
def test_with_min_batch_0_an_idle_worker_is_not_a_rejection_and_is_measured_again():
    s = Scheduler(_config(min_batch=0), 2)
    step = 0
    sizes = s.decision().batch_sizes
    speeds = [1000.0, 1.0]  # worker 1 is very slow: it is rounded to 0 samples
    for rnd in range(40):
        for _ in range(5):
            s.report([WorkerReport(worker_id=w, step=step, samples=b, compute_s=0.01 + b / speeds[w])
                      for w, b in enumerate(sizes)])
            step += 1
        d = s.bundle(_b(step, sizes), {"node": s.versions["node"]}).get("node")
        if d is not None:
            sizes = d.batch_sizes
        if rnd == 5:
            assert 0 in sizes
            speeds = [1000.0, 1000.0]  # worker 1 becomes fast
    assert s.reports_rejected == 0
    assert min(sizes) >= 30, sizes  # it was measured again and got its share back


def test_a_worker_that_stays_slow_is_probed_ever_more_rarely():
    s = Scheduler(_config(min_batch=0), 2)
    sizes, probes = s.decision().batch_sizes, 0
    for rnd in range(200):
        step = 5 * rnd
        s.report([WorkerReport(worker_id=w, step=step + k, samples=b, compute_s=0.01 + b / (1000.0, 1.0)[w])
                  for k in range(5) for w, b in enumerate(sizes)])
        d = s.bundle(_b(step + 5, sizes), {"node": s.versions["node"]}).get("node")
        if d is not None:
            sizes = d.batch_sizes
            probes += d.reason.startswith("probe")
    assert 2 <= probes <= 5 and sizes == (100, 0) and s.reports_rejected == 0


def test_replacement_false_with_fewer_samples_than_the_batch_still_delivers_plans_and_the_node_decision():
    s = Scheduler(_config(SamplePriorityConfig(replacement=False)), 2)
    s.set_dataset_size(30)  # < global batch 100
    for step in range(5):  # enough reports for the noise gate to let (33, 67) through
        s.report([_report(0, step, compute_s=0.5), _report(1, step, compute_s=0.25)])
    bundle = s.bundle(_b(5), {"node": 0})
    node, sample = bundle.get("node"), bundle.get("sample")
    assert isinstance(node, NodeDecision) and isinstance(sample, SampleDecision)
    for plan in sample.plans:
        plan.validate(node.batch_sizes, 30)
        idx = np.concatenate(plan.indices)
        assert len(np.unique(idx)) == 30  # every sample at least once, as distinct as possible


# -- sum-tree and continuity -------------------------------------------------------------------------
def test_a_total_of_a_few_subnormal_units_still_draws():
    tree = SumTree(40)
    tree.update(np.array([3, 17]), np.array([5e-324, 1e-323]))
    draws = tree.draw(3000, np.random.default_rng(0))
    assert set(np.unique(draws)) == {3, 17}
    assert 0.2 < np.mean(draws == 3) < 0.47  # 1 : 2


def test_a_total_that_would_overflow_is_refused_before_anything_is_written():
    tree = SumTree(40)
    tree.update(np.array([1]), np.array([1e308]))
    with pytest.raises(ReportError, match="overflow"):
        tree.update(np.array([2]), np.array([1e308]))
    assert tree.total == 1e308 and tree.values(np.array([2]))[0] == 0.0
    with pytest.raises(ReportError, match="overflow"):
        tree.set_all(np.full(40, 1e307))
    assert tree.total == 1e308
    # replacing a huge leaf by another is fine (the total stays finite)
    tree.update(np.array([1, 1]), np.array([5.0, 1e308]))
    assert tree.total == 1e308


@pytest.mark.parametrize("total", [float("nan"), float("inf"), -1.0])
def test_the_continuity_check_refuses_a_nan_inf_or_negative_total(total):
    mon = ContinuityMonitor(ContinuityConfig())
    with pytest.raises(ReportError):
        mon.check_sums(100, total, 1.0, 0, lambda: np.ones(100))
    with pytest.raises(ReportError):
        mon.check_sums(100, 1.0, total, 0, lambda: np.ones(100))
    assert mon.collapsed_flat == 0
    with pytest.raises(ReportError):
        normalized_ess(100, total, 1.0)


@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
def test_recalibration_refuses_nan_negative_and_inf(bad):
    recal = Recalibration(kind="flat", noise=0.1, reset_fraction=0.5, uniform_mix=0.5, until_step=10)
    with pytest.raises(ReportError):
        recalibrate_priorities(np.array([1.0, 2.0, bad]), recal, np.random.default_rng(0))
    with pytest.raises(ReportError):
        recalibrate_priorities(np.array([1.0, 2.0]), recal, np.random.default_rng(0), prior=bad)


# -- counters, bounds, restore -----------------------------------------------------------------------
def test_counters_survive_a_restore():
    s = Scheduler(_config(), 2)
    for step in range(7):
        s.report([_report(0, step), _report(1, step), _report(5, step)])
    t = Scheduler(_config(), 2)
    t.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    assert (t.reports_received, t.reports_rejected, t.last_step) == (14, 7, 6)
    assert t.stats().rejected_by_kind == s.stats().rejected_by_kind == {"worker_id": 7}
    assert list(t.rejections) == list(s.rejections)


def test_rejections_keep_counts_by_kind_and_only_the_latest_reasons():
    s = Scheduler(_config(), 2)
    for step in range(5000):
        s.report([_report(9, step), _report(0, step, compute_s=float("nan"))])
    assert s.reports_rejected == 10_000 and len(s.rejections) <= 100
    assert s.stats().rejected_by_kind == {"worker_id": 5000, "compute_s": 5000}


def test_decision_history_is_bounded_in_memory_and_in_the_saved_state():
    s = Scheduler(_config(global_batch_size=1024), 256)
    # every boundary publishes (the late-bundle re-issue): the worst case for the history
    for k in range(3000):
        s.bundle(Boundary(5 * (k + 1), 5, s.decision().batch_sizes), {"node": -1})
    numbers = sum(len(d.batch_sizes) * 3 for d in s.history["node"])
    assert numbers <= 1_100_000
    saved = pickle.dumps(s.state_dict())
    assert len(saved) < 2_000_000, len(saved)
    assert s.versions["node"] == 3000


def test_a_state_from_a_saved_dict_with_a_bad_counter_is_refused():
    from pdml_ray.errors import StateError

    s = Scheduler(_config(), 2)
    state = s.state_dict()
    state["counters"] = {"reports_received": "many"}
    with pytest.raises(StateError):
        Scheduler(_config(), 2).load_state_dict(state)


def test_a_failing_deriver_does_not_withhold_the_others_decisions():
    s = Scheduler(_config(SamplePriorityConfig()), 2)
    s.set_dataset_size(100)
    for step in range(5):  # enough reports for the noise gate to let (33, 67) through
        s.report([_report(0, step, compute_s=0.5), _report(1, step, compute_s=0.25)])

    def broken(boundary, earlier):
        raise PlanError("broken on purpose")

    s.derivers["sample"].decide = broken  # type: ignore[method-assign]
    bundle = s.bundle(_b(5), {"node": 0})
    assert isinstance(bundle.get("node"), NodeDecision) and bundle.get("sample") is None
    assert s.stats().decide_errors == 1


# -- issue 22: one diverged loss, sums that cannot drift ---------------------------------------------
def test_one_huge_loss_with_staleness_decay_on_does_not_poison_the_table():
    """The issue's reproduction: a finite 1e18 loss among losses near 1e-3, staleness decay on, then
    many normal reports. The table's running sum lost all precision and went negative, the decay
    pulled scores below 0, and every later report raised inside ingest after the node deriver had
    taken it; the state no longer loaded."""
    cfg = _config(SamplePriorityConfig(staleness_decay=0.1, stale_after=2), global_batch_size=64)
    s = Scheduler(cfg, 2)
    s.set_dataset_size(200)
    rng = np.random.default_rng(0)
    s.report([_feedback(0, 0, range(100), rng.uniform(1e-3, 2e-3, 100)),
              _feedback(1, 0, range(100, 200), rng.uniform(1e-3, 2e-3, 100))])
    s.report([_feedback(0, 1, [5], [1e18])])
    others = np.r_[0:5, 6:200]  # sample 5 is never reported again: it only decays
    for step in range(2, 1500):
        s.report([_feedback(w, step, rng.choice(others, 32), rng.uniform(1e-3, 2e-3, 32)) for w in range(2)])
    table = s.derivers["sample"].table
    assert s.reports_rejected == 0 and s.reports_received == 1 + 2 + 2 * 1498
    scores = table.scores[table.seen]
    assert np.all(np.isfinite(scores)) and scores.min() >= 0.0 and scores.max() <= 1e6 * 2e-3
    assert table.seen_sum == pytest.approx(math.fsum(scores), rel=1e-9)
    assert table.stats().clipped_losses == 1
    t = Scheduler(cfg, 2)
    t.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    assert isinstance(t.bundle(_b(1500, (32, 32)), {"node": 0}).get("sample"), SampleDecision)


def test_the_table_sums_equal_the_sums_of_its_leaves_after_1e5_random_updates():
    rng = np.random.default_rng(22)
    n = 2000
    sp = SamplePrioritizer(n, SamplePriorityConfig(staleness_decay=0.05, stale_after=3, exponent=1.0), seed=0)
    for step in range(2000):  # 2,000 updates of 50 scores each: 10^5 score writes
        idx = rng.integers(0, n, 50)
        # magnitudes across 24 decades, a few zeros and negative losses (they count as 0)
        losses = 10.0 ** rng.uniform(-6, 18, 50) * rng.choice([1.0, 1.0, 1.0, 0.0, -1.0], 50)
        sp.update(idx, losses, step)
        if step % 500 == 499:  # the huge scores leave again: what is left is small against what came and went
            sp.update(np.arange(n), rng.uniform(0.5, 1.0, n), step)
            assert sp.seen_sum == pytest.approx(math.fsum(sp.scores), rel=1e-9)
    leaves = sp.tree.values()
    assert sp.tree.total == pytest.approx(math.fsum(leaves), rel=1e-12)
    assert sp.seen_sum == pytest.approx(math.fsum(sp.scores[sp.seen]), rel=1e-9)
    assert sp.scores.min() >= 0.0 and np.all(np.isfinite(sp.scores))


@pytest.mark.parametrize("field", ["worker_id", "step", "samples", "compute_s", "loss"])
def test_an_integer_too_long_to_print_is_refused_not_raised(field):
    """Python refuses to print an int of more than 4,300 digits: the refusal's own message raised ValueError."""
    from pdml_ray.client import PackedReports

    s = Scheduler(_config(), 2)
    fields = dict(worker_id=0, step=1, samples=50, compute_s=0.5)
    fields[field] = 10**5000
    s.report([WorkerReport(**fields), _report(1, 1)])
    s.report(PackedReports([(10**5000,) * 3, (0, 2, 50, 0.5, 0.0, 1.0, 0.0, 1.0, 1.0, "CPU", None, None)]))
    assert s.reports_rejected == 2 and s.reports_received == 1
    with pytest.raises(ReportError, match="boundary"):
        s.bundle(Boundary(10**5000, 5, (50, 50)), {})
