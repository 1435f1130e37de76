"""The scheduler core without Ray: reports in, versioned decisions and bundles out."""

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.scheduler import Scheduler
from pdml_ray.telemetry import WorkerReport


def _config(**kw):
    return PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=100, warmup_steps=0, hysteresis=0.0, **kw))


def _reports(step, rates, batch=50):
    return [WorkerReport(worker_id=w, step=step, samples=batch, compute_s=batch / r, step_s=1.0, overhead_s=0.001)
            for w, r in enumerate(rates)]


def test_reports_produce_a_newer_decision_and_bundles_carry_it_once():
    s = Scheduler(_config(), 2)
    assert s.bundle(0, 0, 5, (50, 50)).decision is None  # nothing newer than v0
    s.report(_reports(0, [300.0, 100.0]))
    b = s.bundle(0, 5, 5, (50, 50))
    assert b.decision.version == 1 and b.decision.batch_sizes == (75, 25) and b.decision.effective_step == 5
    assert s.bundle(1, 10, 5, (75, 25)).decision is None
    assert s.stats()["rate_source"] == "measured" and s.reports_received == 2


def test_registration_moves_the_prior_and_bad_reports_are_counted():
    s = Scheduler(_config(), 2)
    s.register(0, "H100")
    s.register(1, "A100")
    assert s.decision().reason == "prior" and s.decision().batch_sizes[0] > s.decision().batch_sizes[1]
    s.report([WorkerReport(worker_id=5, step=0, samples=1, compute_s=1.0)])
    assert s.stats()["reports_rejected"] == 1 and s.reports_received == 0


def test_a_restarted_scheduler_continues_the_workers_version_numbering():
    s = Scheduler(_config(), 2)  # fresh after a restart: its own decision is v0
    assert s.bundle(7, 40, 5, (70, 30)).decision is None  # workers run v7: nothing newer to send
    s.report(_reports(40, [100.0, 300.0]))
    d = s.bundle(7, 45, 5, (70, 30)).decision
    assert d is not None and d.version == 8 and d.batch_sizes == (25, 75)


def test_state_round_trip_and_telemetry_columns():
    s = Scheduler(_config(), 2)
    for step in range(3):
        s.report(_reports(step, [300.0, 100.0]))
    s.record_measurement("comm_s", 0.01)
    t = Scheduler(_config(), 2)
    t.load_state_dict(s.state_dict())
    assert t.decision() == s.decision() and len(t.decisions) == len(s.decisions)
    cols = s.telemetry()
    assert cols["step"].tolist() == [0, 0, 1, 1, 2, 2] and cols["samples"].sum() == 300
    assert s.stats()["measurements"] == {"comm_s": 0.01}
