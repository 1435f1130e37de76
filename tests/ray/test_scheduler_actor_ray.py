"""The scheduler actor under load: decisions are served on their own thread, so a bundle never waits
behind a queue of report calls (only behind the one chunk of reports being ingested)."""

import re
import time

import ray

from pdml_ray.actors.scheduler import create_scheduler
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, WorkerReport

FLOOD_CALLS = 100


def test_a_decision_does_not_wait_behind_a_flood_of_reports(ray_local):
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=256), scheduler_name="load-test")
    handle = create_scheduler(config, 4)
    ray.get([handle.register.remote(w, "CPU") for w in range(4)])
    batch = [WorkerReport(worker_id=k % 4, step=k // 4, samples=64, compute_s=0.1) for k in range(2000)]
    # ~10 ms each, queued: a second or more in all, well beyond a decision's round trip (20 calls once
    # finished before the bundle came back on a loaded CI machine)
    flood = [handle.report.remote(batch) for _ in range(FLOOD_CALLS)]
    time.sleep(0.05)
    t0 = time.perf_counter()
    bundle = ray.get(handle.bundle.remote(Boundary(10, 5, (64,) * 4), {"node": 0}), timeout=60)
    latency = time.perf_counter() - t0
    still_queued = len(ray.wait(flood, num_returns=len(flood), timeout=0)[1])
    ray.get(flood)
    assert still_queued > 0, "the flood finished before the bundle came back: make it longer"
    assert bundle is not None and latency < 1.0, latency
    stats = ray.get(handle.stats.remote())
    assert stats.reports_received == FLOOD_CALLS * 2000 and stats.process_cpu_s > 0
    assert ray.get(handle.memory_rss_mb.remote()) > 10
    # the actor's side of that decision: its wait for the lock and Scheduler.bundle, within the round trip
    profile = ray.get(handle.decision_profile.remote())
    assert len(profile["bundle_s"]) == len(profile["lock_wait_s"]) == len(profile["thread_cpu_s"]) == 1
    assert profile["bundle_s"][0] > 0 and 0 <= profile["lock_wait_s"][0]
    assert profile["lock_wait_s"][0] + profile["bundle_s"][0] < latency
    assert all(g in (0, 1, 2) and s >= 0 for g, s in profile["gc_pauses"])
    assert ray.get(handle.decision_profile.remote())["bundle_s"] == []  # read once: each call gives what is new
    ray.kill(handle)


def test_the_actor_says_its_run_and_decision_version_to_the_dashboard(ray_local):
    """Ray's actor list shows ``repr(actor)`` (its ``repr_name``): the run, workers, versions."""
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64), scheduler_name="repr-test")
    handle = create_scheduler(config, 2)
    text = ray.get(handle.__ray_call__.remote(lambda self: repr(self)))
    # the run is its metrics tag: the name plus 8 hex digits of the actor id
    assert re.fullmatch(r"PDMLScheduler\(run=repr-test-[0-9a-f]{8}, workers=2, node v0, last_step=-1, reports=0\)",
                        text), text
    ray.kill(handle)


def test_packed_reports_through_the_actor_refuse_bad_rows_whole_and_apply_the_rest(ray_local):
    """The client's wire format through the real actor, over several lock chunks: each refused report
    is counted once and moves nothing; every other report is applied."""
    from pdml_ray.actors.scheduler import REPORT_CHUNK
    from pdml_ray.client import PackedReports

    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=256), scheduler_name="packed-test")
    handle = create_scheduler(config, 4)
    good = [WorkerReport(worker_id=k % 4, step=k // 4, samples=64, compute_s=0.1) for k in range(3 * REPORT_CHUNK)]
    rows = PackedReports.pack(good).rows
    rows[5] = rows[5][:3] + (-0.1,) + rows[5][4:]  # compute_s < 0
    rows[REPORT_CHUNK] = ("garbage",)  # the first row of the second chunk
    ray.get(handle.report.remote(PackedReports(rows)))
    stats = ray.get(handle.stats.remote())
    assert (stats.reports_received, stats.reports_rejected) == (3 * REPORT_CHUNK - 2, 2)
    assert stats.rejected_by_kind == {"compute_s": 1, "type": 1}
    telemetry = ray.get(handle.telemetry.remote())
    assert len(telemetry["step"]) == 3 * REPORT_CHUNK - 2 and (telemetry["compute_s"] > 0).all()
    ray.get(handle.close.remote())
    ray.kill(handle)
