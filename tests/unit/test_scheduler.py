"""The scheduler core without Ray: reports in, stamped decisions and bundles out, one per deriver."""

import dataclasses

import numpy as np
import pytest

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.decisions import Boundary, NodeDecision, SampleDecision, WorkerReport
from pdml_ray.errors import ReportError, StateError
from pdml_ray.priority.node import NodeStats
from pdml_ray.priority.registry import DERIVERS, enabled_derivers
from pdml_ray.priority.sample_stats import SampleStats
from pdml_ray.scheduler import Scheduler


def _config(sample: bool = False, **kw):
    return PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=100, warmup_steps=0, hysteresis=0.0, **kw),
                      sample_priority=SamplePriorityConfig() if sample else None)


def _reports(step, rates, batch=50):
    return [WorkerReport(worker_id=w, step=step, samples=batch, compute_s=batch / r, step_s=1.0, overhead_s=0.001)
            for w, r in enumerate(rates)]


def _b(first_step, sizes=(50, 50), k=5):
    return Boundary(first_step, k, tuple(sizes))


def test_the_config_enables_derivers_from_the_one_registry():
    assert enabled_derivers(_config()) == ["node"]
    assert enabled_derivers(_config(sample=True)) == ["node", "sample"]
    assert list(Scheduler(_config(sample=True), 2).derivers) == ["node", "sample"]
    # every registered deriver, in registry order, when every config field is set
    from pdml_ray.config import GradientPriorityConfig, P3Config, PDMLConfig, PipelineConfig

    full = PDMLConfig(**{**{f: getattr(_config(sample=True), f) for f in ("node_priority", "sample_priority")},
                         "gradient_priority": GradientPriorityConfig(), "pipeline": PipelineConfig(),
                         "p3": P3Config()})
    assert list(Scheduler(full, 2).derivers) == list(DERIVERS)


def test_reports_produce_a_newer_decision_and_bundles_carry_it_once():
    s = Scheduler(_config(), 2)
    assert not s.bundle(_b(0), {"node": 0})  # nothing newer than v0
    s.report(_reports(0, [300.0, 100.0]))
    d = s.bundle(_b(5), {"node": 0}).get("node")
    assert isinstance(d, NodeDecision)
    assert d.version == 1 and d.batch_sizes == (75, 25) and d.effective_step == 5
    assert not s.bundle(_b(10, (75, 25)), {"node": 1})
    assert s.stats().derivers["node"].rate_source == "measured" and s.reports_received == 2


def test_a_decision_that_reached_the_workers_late_is_reissued_for_the_next_boundary():
    s = Scheduler(_config(), 2)
    s.report(_reports(0, [300.0, 100.0]))
    late = s.bundle(_b(5), {"node": 0}).get("node")  # the workers passed step 5 before it arrived
    again = s.bundle(_b(10), {"node": 0}).get("node")
    assert again.version == late.version + 1 and again.effective_step == 10
    assert again.batch_sizes == late.batch_sizes
    # every version the scheduler published is in its history with the step it was stamped for
    assert [(d["version"], d["effective_step"]) for d in s.decision_history()] == [(0, 0), (1, 5), (2, 10)]


def test_registration_moves_the_prior_at_the_next_boundary():
    s = Scheduler(_config(), 2)
    s.register(0, "H100")
    s.register(1, "A100")
    d = s.bundle(_b(0), {"node": 0}).get("node")
    assert d.reason == "prior" and d.batch_sizes[0] > d.batch_sizes[1] and d.effective_step == 0
    with pytest.raises(ReportError, match="unknown worker"):
        s.register(5, "H100")


@pytest.mark.parametrize("bad, why", [
    (dict(compute_s=float("nan")), "compute_s"),
    (dict(compute_s=-1.0), "compute_s"),
    (dict(compute_s=0.0), "compute_s"),
    (dict(samples=-1), "samples"),  # 0 is an idle step (min_batch = 0), logged but not an error
    (dict(worker_id=7), "unknown worker"),
    (dict(wait_s=float("inf")), "wait_s"),
])
def test_bad_reports_are_rejected_counted_and_move_nothing(bad, why):
    s = Scheduler(_config(), 2)
    s.report(_reports(0, [100.0, 100.0]))
    before = s.derivers["node"].fit.values.copy()
    fields = dict(worker_id=0, step=5, samples=50, compute_s=0.5)
    fields.update(bad)
    s.report([WorkerReport(**fields), *_reports(6, [100.0, 100.0])])  # the good ones still count
    assert s.reports_rejected == 1 and why in s.rejections[-1] and s.reports_received == 4
    assert np.array_equal(s.derivers["node"].fit.values, before)
    assert s.last_step == 6


def test_a_restarted_scheduler_continues_the_workers_version_numbering():
    s = Scheduler(_config(), 2)  # fresh after a restart: its own decision is v0
    assert not s.bundle(_b(40, (70, 30)), {"node": 7})  # workers run v7: nothing newer to send
    s.report(_reports(40, [100.0, 300.0]))
    d = s.bundle(_b(45, (70, 30)), {"node": 7}).get("node")
    assert d is not None and d.version == 8 and d.batch_sizes == (25, 75)


def test_sample_plans_are_sized_by_the_node_decision_of_the_same_bundle():
    s = Scheduler(_config(sample=True), 2)
    assert s.bundle(_b(0), {}).get("sample") is None  # no data set size yet
    s.set_dataset_size(1000)
    s.report(_reports(0, [300.0, 100.0]))
    bundle = s.bundle(_b(5), {"node": 0})
    node, sample = bundle.get("node"), bundle.get("sample")
    assert isinstance(sample, SampleDecision) and sample.effective_step == 5 and len(sample.plans) == 5
    assert all(tuple(len(i) for i in p.indices) == node.batch_sizes == (75, 25) for p in sample.plans)
    assert [p.step for p in sample.plans] == [5, 6, 7, 8, 9]
    assert not s.history["sample"]  # plans are large: the scheduler keeps no history of them
    # per-sample losses flow into the table through the deriver
    fb = WorkerReport(worker_id=0, step=5, samples=2, compute_s=0.1, sample_indices=np.array([3, 4]),
                      sample_losses=np.array([1.0, 2.0], dtype=np.float32))
    s.report([fb])
    stats = s.stats()
    assert isinstance(stats.derivers["sample"], SampleStats) and stats.derivers["sample"].seen_fraction == pytest.approx(0.002)


def test_state_round_trip_typed_stats_and_telemetry_columns():
    s = Scheduler(_config(sample=True), 2)
    s.set_dataset_size(50)
    for step in range(3):
        s.report(_reports(step, [300.0, 100.0]))
        s.bundle(_b(step), {"node": 0})
    s.record_measurement("comm_s", 0.01)
    t = Scheduler(_config(sample=True), 2)
    t.load_state_dict(s.state_dict())
    assert t.decision() == s.decision() and t.decision_history() == s.decision_history()
    assert t.versions == s.versions and t.stats().derivers["node"] == s.stats().derivers["node"]
    assert t.stats().derivers["sample"].epoch == s.stats().derivers["sample"].epoch == 30.0
    with pytest.raises(StateError, match="sample_priority"):
        Scheduler(_config(), 2).load_state_dict(s.state_dict())
    cols = s.telemetry()
    assert cols["step"].tolist() == [0, 0, 1, 1, 2, 2] and cols["samples"].sum() == 300
    stats = s.stats()
    assert stats.measurements == {"comm_s": 0.01} and isinstance(stats.derivers["node"], NodeStats)
    names = {g.name for g in stats.gauges()}
    assert {"pdml_batch_size_samples", "pdml_decision_version", "pdml_reports_received_total"} <= names
    text = "\n".join(stats.summary_lines())
    assert "node v3" in text  # re-issued twice: every bundle said the workers still ran v0 and "75" in text and "sample priorities" in text


def test_the_client_over_an_in_process_transport_polls_bundles_and_reports():
    s = Scheduler(_config(), 2)
    client = SchedulerClient(LocalSchedulerTransport(s))
    client.report(_reports(0, [300.0, 100.0]))
    client.request(_b(5), {"node": 0})
    client.request(_b(10), {"node": 0})  # one request in flight at a time: this one is not sent
    bundle = client.poll()
    assert bundle.get("node").effective_step == 5 and client.poll() is None
    assert client.call("stats").reports_received == 2


def test_stats_say_what_the_run_emulates_in_the_summary_and_every_gauges_help_text():
    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.scheduler import Scheduler

    emulated = Scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8, emulated_speeds=[1.0, 0.5])), 2)
    stats = emulated.stats()
    assert stats.summary_lines()[0] == "EMULATED speeds 1,0.5 (measured compute scaled by 1/speed)"
    assert all(g.description.endswith("[EMULATED speeds 1,0.5 (measured compute scaled by 1/speed)]")
               for g in stats.gauges())
    real = Scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8)), 2).stats()
    assert real.emulation is None and not any("EMULATED" in g.description for g in real.gauges())


def test_the_report_log_keeps_the_newest_rows_in_a_fixed_buffer():
    from pdml_ray.scheduler_stats import ReportLog

    log = ReportLog(3)
    assert log.rows().shape == (0, 8) and len(log) == 0
    for k in range(5):
        log.append((k,) * 8)
    assert len(log) == 3 and log.rows()[:, 0].tolist() == [2.0, 3.0, 4.0]  # oldest first
    log2 = ReportLog(4)
    log2.append((7,) * 8)
    assert log2.rows()[:, 1].tolist() == [7.0]


def test_packed_reports_are_ingested_as_the_reports_themselves_and_checked_the_same():
    import pickle

    from pdml_ray.client import PackedReports

    reports = [*_reports(0, [300.0, 100.0]), *_reports(1, [300.0, 100.0]),
               WorkerReport(worker_id=0, step=2, samples=0, compute_s=0.0),  # idle: logged, not measured
               WorkerReport(worker_id=1, step=2, samples=50, compute_s=float("nan")),  # refused
               WorkerReport(worker_id=np.int64(1), step=np.int64(3), samples=np.int32(50), compute_s=np.float32(0.5))]
    plain, packed = Scheduler(_config(), 2), Scheduler(_config(), 2)
    plain.report(reports)
    packed.report(pickle.loads(pickle.dumps(PackedReports.pack(reports))))  # as it travels
    for s in (plain, packed):
        assert (s.reports_received, s.reports_rejected, s.last_step) == (6, 1, 3)
        assert s.rejected_by_kind == {"compute_s": 1}
    assert np.array_equal(plain.telemetry()["compute_s"], packed.telemetry()["compute_s"])
    assert plain.state_dict()["derivers"] == packed.state_dict()["derivers"]


def test_a_packed_row_that_is_not_a_report_is_refused_and_the_rest_applied():
    from pdml_ray.client import PackedReports

    s = Scheduler(_config(), 2)
    good = PackedReports.pack(_reports(0, [100.0, 100.0])).rows
    s.report(PackedReports([good[0], ("not", "a", "report"), None, good[1]]))
    assert s.reports_received == 2 and s.reports_rejected == 2 and s.rejected_by_kind == {"type": 2}
    assert "tuple of the 12 WorkerReport fields" in s.rejections[-1]


@pytest.mark.parametrize("bad", [
    dict(worker_id=True), dict(step=-1), dict(samples=2.0), dict(compute_s=1e7), dict(compute_s=1e-7),
    dict(samples=10 ** 10, compute_s=1.0), dict(wait_s=-0.1), dict(overhead_s=float("nan")), dict(step_s=-1.0),
    dict(step_s=float("inf")), dict(loss=float("inf")), dict(loss=float("-inf")), dict(grad_norm=-1.0),
    dict(accelerator_type=3), dict(sample_indices=np.arange(3)),
])
def test_the_fast_validation_path_refuses_what_the_full_checks_refuse(bad):
    fields = dict(worker_id=0, step=5, samples=50, compute_s=0.5)
    fields.update(bad)
    assert WorkerReport(**fields).rejection(2, None) is not None
    fine = WorkerReport(worker_id=1, step=5, samples=50, compute_s=0.5, loss=-3.0, grad_norm=float("nan"))
    assert fine.rejection(2, None) is None


def test_the_report_log_extends_in_blocks_and_wraps_as_row_by_row():
    from pdml_ray.scheduler_stats import ReportLog

    one, block = ReportLog(5), ReportLog(5)
    rows = [(k,) * 8 for k in range(13)]
    for r in rows:
        one.append(r)
    block.extend(rows[:3])
    block.extend(rows[3:4])
    block.extend(rows[4:13])
    assert np.array_equal(one.rows(), block.rows()) and len(block) == 5
    small = ReportLog(4)
    small.extend(rows[:2])
    small.extend(rows[2:5])  # wraps around the end of the buffer
    assert small.rows()[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]


# -- issue 22: all-or-nothing loads, restored decisions checked, deriver errors contained --------------
def _trained(sample=True, steps=6, rates=(100.0, 200.0)):
    s = Scheduler(_config(sample=sample), 2)
    if sample:
        s.set_dataset_size(100)
    for step in range(steps):
        s.report(_reports(step, rates))
    s.bundle(_b(steps), {})
    return s


def test_a_state_that_fails_part_way_changes_nothing():
    """The node state and the data-set size loaded before the sample table failed: half a state."""
    state = _trained().state_dict()
    state["derivers"]["sample"]["table"]["scores"] = np.zeros(3)  # the last deriver's part is broken
    target = Scheduler(_config(sample=True), 2)
    for step in range(3):
        target.report(_reports(step, (300.0, 100.0)))
    before = (target.derivers["node"].state_dict(), target.reports_received, dict(target.versions))
    with pytest.raises(StateError, match="shapes"):
        target.load_state_dict(state)
    assert target.num_samples is None and target.derivers["sample"].table is None
    assert (target.derivers["node"].state_dict(), target.reports_received, dict(target.versions)) == before


def _tampered(decision, sizes):
    total = sum(sizes)
    return dataclasses.replace(decision, batch_sizes=tuple(sizes), grad_weights=tuple(b / total for b in sizes),
                               shares=tuple(b / total for b in sizes))


@pytest.mark.parametrize("where", ["current", "history"])
@pytest.mark.parametrize("sizes", [(1000, -900), (40, 30, 30), (60, 50)])
def test_a_restored_decision_is_checked_like_a_new_one(where, sizes):
    """The issue's tampered decision [1000, -936] was adopted unchecked; so would one for 3 workers or
    one summing to another global batch."""
    s = _trained(sample=False)
    state = s.state_dict()
    good = state["current"]["node"]
    if where == "current":
        state["current"]["node"] = _tampered(good, sizes)
    else:
        state["history"]["node"][0] = _tampered(good, sizes)
    target = Scheduler(_config(), 2)
    before = (target.decision(), target.derivers["node"].state_dict(), dict(target.versions))
    with pytest.raises(StateError, match="node decision is not one this run could publish"):
        target.load_state_dict(state)
    assert (target.decision(), target.derivers["node"].state_dict(), dict(target.versions)) == before
    target.load_state_dict(s.state_dict())  # the untampered state loads
    assert target.decision() == s.decision()


def test_a_deriver_that_raises_anything_keeps_its_decision_and_is_counted_logged_and_shown(caplog):
    from pdml_ray.cli.status import render

    s = _trained()
    node_decision = s.decision()

    def broken_decide(boundary, earlier):
        raise ZeroDivisionError("float division by zero")  # not a PDMLError: the bug the issue found

    def broken_ingest(reports):
        raise IndexError("list index out of range")

    s.derivers["node"].decide = broken_decide  # type: ignore[method-assign]
    s.derivers["sample"].ingest = broken_ingest  # type: ignore[method-assign]
    for k in range(3):
        bundle = s.bundle(_b(10 + 5 * k), {"node": node_decision.version})
        assert bundle.get("node") is None and isinstance(bundle.get("sample"), SampleDecision)
    received = s.reports_received
    s.report(_reports(30, (100.0, 200.0)))
    assert s.reports_received == received + 2 and s.derivers["node"].fit.stats["w"][0] > 0
    assert s.decision() is node_decision and s.deriver_errors == {"node": 3, "sample": 1}
    assert s.decide_errors == 3
    assert sum("ZeroDivisionError" in r.message for r in caplog.records) == 1  # the first of its axis only
    stats = s.stats()
    gauges = {(g.name, g.tags): g.value for g in stats.gauges()}
    assert gauges[("pdml_scheduler_deriver_errors_total", (("axis", "node"),))] == 3
    text = render({"pdml-run": stats}, as_json=False)
    assert "deriver errors (each axis kept its decision): node 3, sample 1; latest: sample ingest: IndexError" in text
    restored = Scheduler(_config(sample=True), 2)
    restored.load_state_dict(s.state_dict())
    assert restored.deriver_errors == {"node": 3, "sample": 1}


def test_a_decision_that_fails_its_axis_check_is_not_published():
    s = _trained(sample=False)
    current = s.decision()
    s.derivers["node"].decide = lambda boundary, earlier: _tampered(current, (150, -50))  # type: ignore[method-assign]
    assert s.bundle(_b(20), {"node": current.version}).get("node") is None
    assert s.decision() is current and s.deriver_errors == {"node": 1}
    assert "node decide at step 20: PlanError" in s.deriver_error_reasons[-1]


def test_a_deriver_whose_stats_raise_does_not_hide_the_others():
    s = _trained()
    s.derivers["sample"].stats = lambda: 1 / 0  # type: ignore[method-assign]
    stats = s.stats()
    assert list(stats.derivers) == ["node"] and stats.deriver_errors == {"sample": 1}


@pytest.mark.parametrize("boundary, since", [
    (Boundary("5", 5, (50, 50)), {}), (Boundary(5, 0, (50, 50)), {}), (Boundary(5, 5, (50, 50, 50)), {}),
    (Boundary(5, 5, (50, -1)), {}),
    (Boundary(5, 5, None), {}), (Boundary(10**400, 5, (50, 50)), {}), (None, {}),  # type: ignore[arg-type]
    (Boundary(5, 5, (50, 50)), None), (Boundary(5, 5, (50, 50)), {"node": "3"}), (Boundary(5, 5, (50, 50)), {"node": 2**70}),
])
def test_a_malformed_bundle_request_is_refused_with_a_report_error(boundary, since):
    s = _trained(sample=False)
    before = dict(s.versions)
    with pytest.raises(ReportError, match="bundle: "):
        s.bundle(boundary, since)
    assert s.versions == before and s.deriver_errors == {}


def test_measurement_names_are_bounded():
    s = Scheduler(_config(), 2)
    for k in range(1000):
        s.record_measurement(f"m{k}", 1.0)
    s.record_measurement("m0", 2.0)  # an existing name is updated
    with pytest.raises(ReportError, match="1000 measurement names"):
        s.record_measurement("one_more", 1.0)
    assert len(s.measurements) == 1000 and s.measurements["m0"] == 2.0


def test_an_axis_whose_observe_raises_is_counted_and_the_run_goes_on():
    from pdml_ray.config import PipelineConfig

    s = Scheduler(PDMLConfig(pipeline=PipelineConfig(schedule="1f1b")), 4)
    s.set_shape("pipeline", {"stages": 2, "replicas": 2, "microbatches": 4})

    def broken(step, rows):
        raise KeyError("stage")

    s.derivers["pipeline"].observe = broken  # type: ignore[method-assign]
    assert s.observe("pipeline", 0, [(0, 0, "F", 0, 0.01)]) is True
    assert s.deriver_errors == {"pipeline": 1} and "pipeline observe: KeyError" in s.deriver_error_reasons[-1]
    assert s.bundle(Boundary(1, 1, ()), {}).get("pipeline") is not None
