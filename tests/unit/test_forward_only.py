"""Selective-backprop's forward-only samples in the reports: checked where reports enter, carried through
every place reports are packed, sent, logged and replayed (no Ray)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pdml_ray.client import PackedReports
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, WorkerReport
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
    assert s.decision("node").batch_sizes == (133, 67)  # worker 1 took twice as long: the split moved
    assert [d["node"] for d in replay(log) if "node" in d][-1] == s.decision("node").to_dict()


def test_a_packed_row_without_forward_only_reads_as_0():
    """Rows recorded before the field (a saved replay log) carry 12 fields."""
    row = (0, 3, 50, 0.5, 0.0, 1.0, 0.0, 1.0, 1.0, "CPU", None, None)
    (report,) = PackedReports([row]).reports()
    assert isinstance(report, WorkerReport) and report.forward_only == 0
    (refusal,) = PackedReports([row[:11]]).reports()
    assert isinstance(refusal, str) and "12 WorkerReport fields, or 13 with forward_only" in refusal
