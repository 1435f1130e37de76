"""Reports in the boundary's collectives (``report_via="boundary"``), over a real two-rank gloo group.

Two processes (``run_local_ranks``) train a small model through ``PDMLContext``. Rank 0 holds a real ``Scheduler``
in its process (its client's transport records every call); rank 1 has no scheduler at all, so
whatever of its reports reaches the scheduler came through the gather. The same run with
``report_via="worker"`` is the control: there rank 0 makes a report call per boundary and rank 1's
reports, with nowhere to go, never arrive.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pdml_ray.client import LocalSchedulerTransport, PackedReports, SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, WorkerReport
from pdml_ray.errors import SchedulerUnavailableError
from pdml_ray.pipeline.torch_exec import run_local_ranks
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.boundary_reports import BoundaryReports, capacity
from pdml_ray.train.context import PDMLContext

STEPS, INTERVAL = 24, 4


class Recorder(LocalSchedulerTransport):
    def __init__(self, scheduler):
        super().__init__(scheduler)
        self.calls: list[tuple[str, int]] = []  # (method, reports carried)

    def submit(self, method, *args):
        carried = len(args[-1]) if method in ("report", "bundle") and isinstance(args[-1], PackedReports) else 0
        self.calls.append((method, carried))
        return super().submit(method, *args)


def _rank(rank: int, world_size: int, route: str) -> dict:
    config = PDMLConfig(decision_interval=INTERVAL, report_via=route, node_priority=NodePriorityConfig(
        global_batch_size=32, warmup_steps=0, hysteresis=0.0, ema_alpha=1.0, emulated_speeds=[1.0, 0.5],
        emulated_per_sample_s=1e-3))  # compute slept, so CPU load (the whole unit tier) cannot flip a share
    scheduler, recorder = (Scheduler(config, 2), None) if rank == 0 else (None, None)
    client = None
    if scheduler is not None:
        scheduler.register(1, "B")  # rank 1 has no client to register itself
        recorder = Recorder(scheduler)
        client = SchedulerClient(recorder)
    ctx = PDMLContext(config, rank, 2, torch.device("cpu"), "A" if rank == 0 else "B", client)
    torch.manual_seed(0)
    model = ctx.prepare_model(torch.nn.Linear(4, 2))
    x, y = torch.randn(STEPS * 32, 4), torch.randint(0, 2, (STEPS * 32,))
    for batch in ctx.epoch(0, len(x)):
        idx = torch.as_tensor(batch.indices)
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[idx]), y[idx], reduction="none")).backward()
        model.zero_grad()
    result = {"adopted": [[s, v, list(b)] for s, v, b in ctx.adopted], "gathers": ctx.gathers_reports}
    if scheduler is not None:
        t = scheduler.telemetry()
        result.update(calls=recorder.calls, rows=[[int(w), int(s), float(c) / max(int(n), 1)] for w, s, c, n in
                                                  zip(t["worker_id"], t["step"], t["compute_s"], t["samples"])],
                      types=list(scheduler.stats().derivers["node"].accelerator_types))
    return result


def _run(route: str) -> tuple[dict, dict]:
    zero, one = run_local_ranks(_rank, 2, route)
    return zero, one


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")
def test_the_groups_reports_ride_in_the_boundary_and_rank_0_sends_them_with_its_request():
    zero, one = _run("boundary")
    assert zero["gathers"] and one["gathers"]
    # no report call at any boundary: every report rode in a bundle request (at most one call a boundary)
    boundaries = [carried for method, carried in zero["calls"] if method == "bundle"]
    assert [m for m, _ in zero["calls"] if m == "report"] == [] and sum(boundaries) > 0, zero["calls"]
    # rank 1's reports reached the scheduler (it has no client): every step before the last boundary,
    # with its accelerator type from the gather, its compute time a sample as measured (slower: speed 0.5)
    rows = {(w, s): c for w, s, c in zero["rows"]}
    last_boundary = (STEPS - 1) // INTERVAL * INTERVAL
    for worker in (0, 1):
        assert {s for w, s in rows if w == worker} >= set(range(last_boundary - 1)), (worker, sorted(rows))
    assert zero["types"] == ["A", "B"]
    assert np.median([rows[1, s] / rows[0, s] for s in range(1, last_boundary - 1)]) > 1.3
    # both ranks adopted the same decisions at the same steps; the node shares, decided on rank 1's
    # gathered reports too, give the slower rank 1 the smaller batch
    assert zero["adopted"] == one["adopted"] and zero["adopted"], zero["adopted"]
    assert all(sizes[1] < sizes[0] for _, _, sizes in zero["adopted"]), zero["adopted"]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")
def test_without_the_gather_each_rank_calls_and_rank_1_has_nowhere_to_send():
    zero, one = _run("worker")
    assert not zero["gathers"] and not one["gathers"]
    assert [m for m, _ in zero["calls"]].count("report") >= 2
    assert all(carried == 0 for method, carried in zero["calls"] if method == "bundle")
    assert {w for w, _, _ in zero["rows"]} == {0}


def _report(step: int, losses: bool = False) -> WorkerReport:
    return WorkerReport(worker_id=1, step=step, samples=8, compute_s=0.125 * (step + 1), wait_s=0.5, step_s=1.5,
                        overhead_s=1e-4, loss=0.75, grad_norm=2.0, accelerator_type="B",
                        sample_indices=np.arange(8) if losses else None,
                        sample_losses=np.ones(8, np.float32) if losses else None, forward_only=3)


def test_the_rows_come_back_exact_and_what_does_not_fit_is_left_to_the_rank(monkeypatch):
    """One process: ``dist.gather`` stood in for by a copy, to check the packing alone."""
    def gather(mine, box, dst):  # both ranks' slots hold this rank's tensor
        for slot in box:
            slot.copy_(mine)

    monkeypatch.setattr(dist, "gather", gather)
    side = BoundaryReports(0, 2, torch.device("cpu"), decision_interval=2, accelerator_types=["A", "B"])
    assert side.capacity == capacity(2) == 4
    reports = [_report(s) for s in range(6)] + [_report(9, losses=True)]
    rows, rest = side.exchange(reports)
    want = [row[:9] + ("A",) + row[10:] for row in PackedReports.pack(reports[:4]).rows]  # rank 0's slot
    assert rows[:4] == want and rows[4:] == [r[:9] + ("B",) + r[10:] for r in want]
    assert all(type(r[0]) is int and type(r[1]) is int and type(r[12]) is int for r in rows)  # noqa: E721
    assert [r.step for r in rest] == [4, 5, 9]  # beyond the capacity, and the one with sample losses


class Failing(Recorder):
    """Bundle requests are taken, then fail (the scheduler died with them in flight)."""

    def result(self, pending, timeout_s=None):
        if self.calls and self.calls[-1][0] == "bundle":
            raise SchedulerUnavailableError("actor died")
        return super().result(pending, timeout_s)


def test_reports_in_a_request_are_ingested_first_sent_apart_when_it_cannot_go_and_counted_when_lost():
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=32))
    scheduler = Scheduler(config, 2)
    client = SchedulerClient(Recorder(scheduler))
    rows = PackedReports.pack([_report(s) for s in range(3)]).rows
    assert client.request(Boundary(5, 5, (16, 16)), {}, rows)
    assert scheduler.reports_received == 3  # ingested before the bundle was decided
    # a request still pending: the next one does not go out, its reports go as a report call
    assert not client.request(Boundary(10, 5, (16, 16)), {}, rows)
    assert client.transport.calls == [("bundle", 3), ("report", 3)] and scheduler.reports_received == 6
    assert client.poll() is not None
    # a request that fails takes its reports with it: counted as lost
    failing = SchedulerClient(Failing(Scheduler(config, 2)))
    assert failing.request(Boundary(5, 5, (16, 16)), {}, rows)
    assert failing.poll() is None and (failing.reports_dropped, failing.report_calls_failed) == (3, 1)
