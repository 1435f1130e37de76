"""Selective-backprop's forward-only samples in the reports: checked where reports enter, carried through
every place reports are packed, sent, logged and replayed (no Ray)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pdml_ray.client import PackedReports
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, WorkerReport
from pdml_ray.errors import StateError
from pdml_ray.priority.node import NodePriorityDeriver
from pdml_ray.replay import load, recorded, replay, save
from pdml_ray.scheduler import Scheduler


def _scheduler(n: int = 2, **node) -> Scheduler:
    cfg = dict(global_batch_size=200, warmup_steps=0, hysteresis=0.0, **node)
    return Scheduler(PDMLConfig(node_priority=NodePriorityConfig(**cfg), replay_log=10_000), n)


@pytest.mark.parametrize("forward_only, why", [(51, "from 0 to samples=50"), (-1, "from 0 to samples=50"),
                                               (2.0, "must be an integer"), (True, "must be an integer")])
def test_a_report_with_more_forward_only_samples_than_samples_is_refused_with_the_fix(forward_only, why):
    s = _scheduler()
    s.report([WorkerReport(worker_id=0, step=1, samples=50, compute_s=0.5, forward_only=forward_only),
              WorkerReport(worker_id=1, step=1, samples=50, compute_s=0.5, forward_only=50)])
    assert (s.reports_received, s.reports_rejected) == (1, 1)
    assert s.rejected_by_kind == {"forward_only": 1}
    assert why in s.rejections[-1] and "no backward" in s.rejections[-1]


def test_forward_only_defaults_to_0_and_an_idle_report_has_none():
    assert WorkerReport(worker_id=0, step=0, samples=8, compute_s=0.1).forward_only == 0
    assert WorkerReport(worker_id=0, step=0, samples=0, compute_s=0.0).rejection(1) is None
    assert WorkerReport(worker_id=0, step=0, samples=0, compute_s=0.0, forward_only=1).rejection(1).field == \
        "forward_only"
    # the fast path and the field-by-field checks agree: numpy ints take the slow path and pass
    assert WorkerReport(worker_id=0, step=0, samples=8, compute_s=0.1, forward_only=np.int64(8)).rejection(1) is None


def test_forward_only_round_trips_through_packed_rows_pickle_and_a_saved_replay_log(tmp_path):
    reports = [WorkerReport(worker_id=w, step=step, samples=100, compute_s=0.1 * (1 + w), step_s=0.2,
                            loss=1.0, grad_norm=1.0, forward_only=70 * w + step)  # finite: NaN != NaN
               for step in range(6) for w in range(2)]
    packed = pickle.loads(pickle.dumps(PackedReports.pack(reports)))  # as it travels (client, relay, actor)
    back = list(packed.reports())
    assert back == reports and [r.forward_only for r in back] == [r.forward_only for r in reports]
    s = _scheduler()
    s.report(packed)
    s.bundle(Boundary(6, 4, s.decision().batch_sizes), dict(s.versions))
    save(recorded(s), tmp_path / "run.replay")
    log = load(tmp_path / "run.replay")
    rows = [row for event in log["events"] if event[0] == "report" for row in event[1]]
    assert [row[-1] for row in rows] == [r.forward_only for r in reports]
    # worker 1 took twice as long for ~53 trained-sample equivalents to worker 0's ~98: the split moved
    assert s.decision("node").batch_sizes == (166, 34)
    assert [d["node"] for d in replay(log) if "node" in d][-1] == s.decision("node").to_dict()


def test_a_packed_row_without_forward_only_reads_as_0():
    """Rows recorded before the field (a saved replay log) carry 12 fields."""
    row = (0, 3, 50, 0.5, 0.0, 1.0, 0.0, 1.0, 1.0, "CPU", None, None)
    (report,) = PackedReports([row]).reports()
    assert isinstance(report, WorkerReport) and report.forward_only == 0
    (refusal,) = PackedReports([row[:11]]).reports()
    assert isinstance(refusal, str) and "12 WorkerReport fields, or 13 with forward_only" in refusal


RATE = 1000.0  # trained samples/s of every worker's device (forward + backward)
PHI = 1.0 / 3.0  # what a forward-only sample costs these emulated devices, relative to a trained one


def _run(deriver: NodePriorityDeriver, fixed_s, forward_share, steps: int) -> list[WorkerReport]:
    """Noise-free workers reporting at the sizes they were told: step time ``c + (trained + PHI fo) / RATE``
    with ``fo = round(share * b)`` of the batch forwarded only. Returns the last step's reports."""
    reports: list[WorkerReport] = []
    for step in range(steps):
        sizes = deriver.current.batch_sizes
        reports = []
        for w, (b, c, share) in enumerate(zip(sizes, fixed_s, forward_share)):
            fo = round(share * b)
            reports.append(WorkerReport(worker_id=w, step=step, samples=b, compute_s=c + (b - fo + PHI * fo) / RATE,
                                        forward_only=fo))
        deriver.ingest(reports)
        deriver.decide(Boundary(step + 1, 1, sizes), {})
    return reports


def _deriver(n: int = 2, batch: int = 200) -> NodePriorityDeriver:
    return NodePriorityDeriver(PDMLConfig(node_priority=NodePriorityConfig(
        global_batch_size=batch, warmup_steps=0, hysteresis=0.0)), n)


def test_a_worker_that_skips_70_percent_of_its_backward_passes_is_not_over_fed():
    """Equal devices, one forwarding 70% of its batch only: it measures 1.9x the samples/s of the other,
    yet its device is no faster, so both keep equal shares (counting every sample as trained gave it
    ~65% of the batch, 130 of 200: the next steps' high-loss share is the data's, not the worker's)."""
    deriver = _deriver()
    last = _run(deriver, fixed_s=(0.0, 0.0), forward_share=(0.0, 0.7), steps=30)
    assert last[1].throughput > 1.5 * last[0].throughput
    assert abs(deriver.current.batch_sizes[0] - deriver.current.batch_sizes[1]) <= 2
    rates = deriver.stats().rates  # per sample at the cluster's mix (0.65 of a trained sample each here)
    assert rates[0] == pytest.approx(rates[1], rel=1e-6)
    assert deriver.units_per_sample == pytest.approx(1.0 - 0.35 * (1.0 - PHI), rel=1e-3)


def test_batch_sizes_follow_the_per_sample_cost_at_the_clusters_mix():
    """Half of every batch forwarded only: a sample costs 2/3 of a trained one everywhere, so worker 1's
    fixed 50 ms is worth 75 samples (not the 50 it would be at a trained sample's cost): (137.5, 62.5)."""
    deriver = _deriver()
    _run(deriver, fixed_s=(0.0, 0.05), forward_share=(0.5, 0.5), steps=60)
    b0, b1 = deriver.current.batch_sizes
    assert abs(b0 - 137.5) <= 2 and b0 + b1 == 200
    model = deriver.step_model()  # the ridge prior on c still pulls the fit a little
    assert model.fixed_s[1] == pytest.approx(0.05, rel=1e-2) and model.rates[0] == pytest.approx(1.5 * RATE, rel=1e-2)


def test_the_cost_mix_is_saved_restored_and_checked():
    deriver = _deriver()
    _run(deriver, fixed_s=(0.0, 0.0), forward_share=(0.0, 0.7), steps=5)
    state = deriver.state_dict()
    restored = _deriver()
    restored.load_state_dict(state)
    assert restored.mix == deriver.mix and restored.step_model().rates.tolist() == deriver.step_model().rates.tolist()
    older = {k: v for k, v in state.items() if k != "mix"}  # written before forward-only samples counted
    restored.load_state_dict(older)
    assert restored.units_per_sample == 1.0
    units, samples = state["mix"]
    for bad in ([units, [5.0, 5.0 * PHI / 2]], [[6.0, 6.0], [5.0, 5.0]], [units, [float("nan"), 1.0]], "x", [units]):
        with pytest.raises(StateError, match="cost mix"):
            restored.load_state_dict({**state, "mix": bad})
