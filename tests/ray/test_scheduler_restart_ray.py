"""The scheduler actor restarts from its last snapshot: killed mid-run (``ray.kill(no_restart=False)``),
Ray restarts it, it loads the snapshot (estimates, decisions, counters), training goes on through the
restart on its last decision, and decisions resume afterwards."""

import json
import time

import pytest
import ray
import ray.train
import torch
import torch.nn.functional as F

from pdml_ray.actors.scheduler import SNAPSHOT_INTERVAL_S, create_scheduler, find_scheduler
from pdml_ray.actors.snapshot_store import SnapshotStore
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, WorkerReport
from pdml_ray.train import PDMLTrainer, get_context
from pdml_ray.train.workloads import make_classification, make_mlp

STEPS_PER_EPOCH = 64  # 64 x 256 samples, global batch 256
EPOCHS = 3
KILL_AT = 40
SLOWER = 0.25  # rank 1's EMULATED speed from the kill on (0.5 before): the split must move after the restart
MAX_EXTRA_EPOCHS = 10  # epochs trained beyond EPOCHS while the restarted scheduler has not decided yet


def restart_loop(config):
    """Train EPOCHS epochs; at step KILL_AT rank 0 sends one malformed report, has the scheduler save a
    snapshot, reads its stats and kills it (Ray restarts it), and rank 1 becomes slower (EMULATED), so
    the restarted scheduler has a new split to decide. Training goes on (up to MAX_EXTRA_EPOCHS more)
    until rank 0 has adopted a decision of the restarted scheduler: how long Ray takes to restart an
    actor depends on the machine's load. Rank 0 writes what it saw."""
    torch.set_num_threads(1)
    ctx = get_context()
    x, y = make_classification(STEPS_PER_EPOCH * 256, 16, 2, seed=0)
    model = ctx.prepare_model(make_mlp(16, 32, 2, depth=1, seed=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps, out = 0, {}

    def go_on(epoch):  # the same answer on both ranks: rank 0's, all-reduced
        if epoch < EPOCHS:
            return True
        waiting = ctx.rank == 0 and not any(s > KILL_AT and v > out["version_at_kill"] for s, v, _ in ctx.adopted)
        flag = torch.tensor([1.0 if waiting and epoch < EPOCHS + MAX_EXTRA_EPOCHS else 0.0])
        torch.distributed.all_reduce(flag)
        return bool(flag.item())

    epoch = 0
    while go_on(epoch):
        epoch += 1
        for batch in ctx.epoch(epoch - 1, len(x)):
            with ctx.step(batch) as step:
                step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if batch.step == KILL_AT and ctx.rank == 1:
                ctx.speed = SLOWER
            if batch.step == KILL_AT and ctx.rank == 0:
                # a refused report (unknown worker): counted, and the count must survive the restart
                ctx.client.report([WorkerReport(worker_id=99, step=batch.step, samples=8, compute_s=0.1)], flush=True)
                while ctx.client.call("stats").reports_rejected < 1:  # reports travel on their own thread
                    time.sleep(0.05)
                ctx.client.call("snapshot")
                before = ctx.client.call("stats")
                out["before"] = {"reports_received": before.reports_received, "last_step": before.last_step,
                                 "reports_rejected": before.reports_rejected, "versions": dict(before.versions),
                                 "rejected_by_kind": dict(before.rejected_by_kind)}
                out["version_at_kill"] = ctx.versions["node"]
                ray.kill(ray.get_actor(ctx.config.scheduler_name, namespace=ctx.config.namespace), no_restart=False)
                out["killed_at"] = batch.step
                out["killed_time"] = time.time()
    if ctx.rank == 0:
        ctx.flush()
        after = ctx.client.call("stats")  # a blocking call waits through the restart
        out.update(steps_done=steps, adopted=ctx.adopted, client_failures=ctx.client.failures,
                   reports_dropped=ctx.client.reports_dropped, report_calls_failed=ctx.client.report_calls_failed,
                   after={"reports_received": after.reports_received, "last_step": after.last_step,
                          "reports_rejected": after.reports_rejected, "versions": dict(after.versions),
                          "restarts": after.restarts, "rejected_by_kind": dict(after.rejected_by_kind)},
                   snapshots=ctx.client.call("snapshot_info"))
        with open(config["out"], "w") as f:
            json.dump(out, f)


@pytest.fixture(scope="module")
def run(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("restart") / "out.json"
    # EMULATED speeds (sleep compute mode, 0.1 ms per sample / speed), and no noise gate or hysteresis:
    # the deriver keeps publishing refinements, so decisions after the restart show up within steps
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(
        global_batch_size=256, emulated_speeds=[1.0, 0.5], emulated_per_sample_s=1e-4, warmup_steps=2, hysteresis=0.0, decision_confidence=0.0))
    result = PDMLTrainer(restart_loop, train_loop_config={"out": str(out)},
                         scaling_config=ray.train.ScalingConfig(num_workers=2),
                         run_config=ray.train.RunConfig(name="restart-test", storage_path=str(out.parent)),
                         pdml_config=config).fit()
    return result, json.loads(out.read_text())


def test_training_finishes_through_the_restart(run):
    result, out = run
    assert result.error is None
    assert out["killed_at"] == KILL_AT
    assert out["steps_done"] % STEPS_PER_EPOCH == 0
    assert EPOCHS * STEPS_PER_EPOCH <= out["steps_done"] <= (EPOCHS + MAX_EXTRA_EPOCHS) * STEPS_PER_EPOCH


def test_the_restarted_scheduler_kept_its_counters(run):
    result, out = run
    before, after = out["before"], out["after"]
    assert after["restarts"] == 1, after
    # restored from the snapshot taken just before the kill, then counting on: never reset to 0
    assert after["reports_received"] > before["reports_received"] > 0, (before, after)
    assert after["last_step"] > before["last_step"] >= KILL_AT - 4, (before, after)
    assert before["reports_rejected"] >= 1 and before["rejected_by_kind"].get("worker_id", 0) >= 1, before
    assert after["reports_rejected"] >= before["reports_rejected"], (before, after)
    assert after["rejected_by_kind"].get("worker_id", 0) >= 1, after
    assert result.pdml.stats is not None and result.pdml.stats.restarts == 1
    assert any("actor restarted 1x from its snapshot" in line for line in result.pdml.stats.summary_lines())


def test_decisions_resume_after_the_restart(run):
    _, out = run
    after_kill = [(step, version) for step, version, _ in out["adopted"] if step > out["killed_at"]]
    assert after_kill, out["adopted"]
    assert max(v for _, v in after_kill) > out["version_at_kill"], (out["version_at_kill"], out["adopted"])
    # the restarted scheduler follows rank 1's slow-down (0.5 -> SLOWER of rank 0's speed): its share
    # falls below the 1:0.5 split (where the settled split lands depends on how long the run went on)
    sizes = out["adopted"][-1][2]
    assert sizes[1] / sizes[0] < 0.45, out["adopted"]
    # the restarted scheduler's numbering continues above the workers': versions only ever go up
    versions = [v for _, v, _ in out["adopted"]]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), versions
    assert out["after"]["versions"]["node"] >= max(versions)


def test_reports_lost_with_the_actor_are_counted_not_fatal(run):
    _, out = run
    # the flush before the snapshot emptied rank 0's calls, so it may have lost none; whatever it lost
    # is counted: every failed call's reports (at least one each) are in reports_dropped
    assert out["reports_dropped"] >= out["report_calls_failed"], out
    # rank 0 sent one report per step (flushed before the snapshot and at the end, none in the actor
    # when it was killed): each reached the scheduler (restored counts included) or was counted lost
    assert out["after"]["reports_received"] >= out["steps_done"] - out["reports_dropped"], out


def _until_restarted(handle, timeout_s=60.0):
    """The stats of a scheduler just killed with no_restart=False, once Ray has restarted it (a call sent
    while the old process is still dying fails: sent again)."""
    deadline = time.monotonic() + timeout_s
    while True:  # ray.kill returns at once: the old process may still answer a call or two
        try:
            stats = ray.get(handle.stats.remote(), timeout=timeout_s)
            if stats.restarts >= 1 or time.monotonic() > deadline:
                return stats
        except ray.exceptions.RayActorError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def test_the_actor_snapshots_on_its_own_and_restores_after_a_kill(ray_local):
    """No forced snapshot: the background thread saves one within SNAPSHOT_INTERVAL_S of the reports."""
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64), scheduler_name="snap-test")
    handle = create_scheduler(config, 2)
    ray.get([handle.register.remote(w, "CPU") for w in range(2)])
    good = [WorkerReport(worker_id=k % 2, step=k // 2, samples=32, compute_s=0.1 + 0.05 * (k % 2)) for k in range(40)]
    bad = [WorkerReport(worker_id=0, step=3, samples=32, compute_s=-1.0)]
    ray.get(handle.report.remote(good + bad))
    ray.get(handle.bundle.remote(Boundary(20, 5, (32, 32)), {"node": 0}))
    before = ray.get(handle.stats.remote())
    deadline = time.monotonic() + SNAPSHOT_INTERVAL_S + 10
    while ray.get(handle.snapshot_info.remote())["saved"] < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.get(handle.snapshot_info.remote())["saved"] >= 1
    ray.kill(handle, no_restart=False)
    after = _until_restarted(handle)
    assert after.restarts == 1
    assert (after.reports_received, after.reports_rejected, after.last_step) == (40, 1, 19)
    assert after.rejected_by_kind == {"compute_s": 1} and after.versions == before.versions
    ray.get(handle.report.remote(good[:2]))  # and it goes on counting
    assert ray.get(handle.stats.remote()).reports_received == 42
    ray.kill(handle)  # for good this time
    deadline = time.monotonic() + 30
    while find_scheduler("snap-test", config.namespace) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    # a fresh scheduler under the same name starts empty and deletes the old run's snapshot
    fresh = create_scheduler(config, 2)
    stats = ray.get(fresh.stats.remote())
    assert stats.reports_received == 0 and stats.restarts == 0
    assert SnapshotStore("snap-test", config.namespace).load() is None
    ray.get(fresh.close.remote())
    ray.kill(fresh)
