"""Straggler-tolerant data parallelism on real Ray worker actors: each policy with one injected
straggler and one injected death (n = 6, s = 2, so the tolerant policies survive both)."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from pdml_ray.config.stragglers import StragglerConfig  # noqa: E402
from pdml_ray.runtime.stragglers import StragglerRuntime, StragglerStallError, WorkerPool  # noqa: E402
from pdml_ray.stragglers.delays import Death, FixedSlowdown  # noqa: E402
from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model  # noqa: E402
from pdml_ray.stragglers.registry import POLICIES, make_policy  # noqa: E402

N, S, DIM = 6, 2, 8
SLOW, DYING, DEATH_STEP, STEPS = 1, 4, 3, 8
PER_SAMPLE_S = 2e-4  # 96 samples per partition: ~20 ms of emulated compute per partition
SLOWDOWN = 25.0  # the straggler's factor


@pytest.fixture(scope="module")
def pool(ray_local):
    p = WorkerPool(num_cpus_per_worker=0.25)
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def data():
    return logistic_data(N * (N + S) * 12, DIM, seed=0)


RUN_STATS: dict = {}  # policy name -> the runtime's exported run record (StragglerRunStats) of its last run


def run(pool, data, name, model, steps=STEPS, timeout_s=20.0, on_stall="report"):
    policy = make_policy(name, workers=N, stragglers=S)
    x, y = data
    rt = StragglerRuntime(policy, logistic_model(DIM), logistic_loss, x, y, lr=1.0, l2=1e-2, straggler_model=model,
                          per_sample_s=PER_SAMPLE_S, step_timeout_s=timeout_s, pool=pool)
    try:
        return rt.train(steps, on_stall=on_stall)
    finally:
        RUN_STATS[name] = rt.stats
        rt.shutdown()


STRAGGLER_AND_DEATH = Death((DYING,), DEATH_STEP, FixedSlowdown((SLOW,), SLOWDOWN))


@pytest.mark.parametrize("name", [p for p in POLICIES if p != "sync"])
def test_tolerant_policies_train_through_a_straggler_and_a_death(pool, data, name):
    r = run(pool, data, name, STRAGGLER_AND_DEATH)
    assert r.stalled is None and len(r.records) == STEPS
    assert r.final_loss < r.initial_loss - 0.1
    assert r.records[-1].dead == (DYING,)
    assert all(DYING not in rec.arrived for rec in r.records[DEATH_STEP:])
    # the straggler is never waited for: no step used its message, except async's within its staleness
    # bound (under load the other workers' steps stretch while its EMULATED slowdown does not)
    used = [rec for rec in r.records if SLOW in dict(rec.combination.weights)]
    if name == "async":
        bound = make_policy(name, workers=N, stragglers=S).max_staleness  # type: ignore[attr-defined]
        assert all(rec.combination.max_staleness <= bound for rec in used), [rec.step for rec in used]
    else:
        assert not used, (name, [rec.step for rec in used])
    # its late steps were cut short (cancelled), not queued: one call per step, each shorter than
    # its full emulated compute, and at most one report per step. How much shorter depends on when the
    # newer step's announcement reaches the worker: a full run on a loaded 2-core machine saw 0.26 s
    # of a 0.48 s step, so the bound is the full step, not a fraction of it
    slow = [rep for rec in r.records for rep in rec.reports if rep.worker_id == SLOW]
    full_s = SLOWDOWN * PER_SAMPLE_S * len(data[0]) / make_policy(name, workers=N, stragglers=S).num_partitions
    assert slow and len(slow) <= STEPS and min(rep.compute_s for rep in slow) < full_s, [rep.compute_s for rep in slow]
    reports = [rep for rec in r.records for rep in rec.reports if rep.worker_id != SLOW]
    assert all(rep.samples > 0 and rep.grad_norm > 0 for rep in reports if rep.loss == rep.loss)
    # the exported run record: every step counted, the straggler's cut-short replies dropped
    stats = RUN_STATS[name]
    assert stats.steps == STEPS and stats.worker_deaths == 1 and stats.results_dropped >= len(slow) - 1
    if name.startswith("gc-"):
        assert all(rec.combination.exact for rec in r.records) and r.grad_cosine > 0.9999
        assert r.partitions_per_step == S + 1
    if name.startswith("pgc-"):
        assert r.partitions_per_step == 1 and r.grad_cosine > 0.99


def test_sync_reports_a_death_as_stalled_naming_the_worker(pool, data):
    r = run(pool, data, "sync", Death((DYING,), DEATH_STEP))
    assert r.stalled is not None and f"worker {DYING}" in r.stalled
    assert len(r.records) == DEATH_STEP and r.final_loss < r.initial_loss
    assert RUN_STATS["sync"].steps == DEATH_STEP and RUN_STATS["sync"].results_dropped == 0  # sync waits for all
    with pytest.raises(StragglerStallError, match=f"worker {DYING}"):
        run(pool, data, "sync", Death((DYING,), 1), on_stall="raise")


def test_a_silent_worker_stalls_sync_after_the_timeout_not_forever(pool, data):
    t0 = time.perf_counter()
    r = run(pool, data, "sync", FixedSlowdown((SLOW,), 1e5), steps=3, timeout_s=1.0)  # ~30 min per step
    assert r.stalled is not None and "timed out" in r.stalled and f"[{SLOW}]" in r.stalled
    assert r.records == () and time.perf_counter() - t0 < 60


def test_telemetry_reaches_a_scheduler_actor(pool, data):
    @ray.remote(num_cpus=0)
    class Sink:
        def __init__(self):
            self.reports = []

        def report(self, reports):
            self.reports.extend(reports)

        def get(self):
            return self.reports

    sink = Sink.remote()
    x, y = data
    config = StragglerConfig(policy="ignore-stragglers", workers=N, stragglers=S, lr=1.0, per_sample_ms=PER_SAMPLE_S * 1e3)
    rt = StragglerRuntime.from_config(config, logistic_model(DIM), logistic_loss, x, y, l2=1e-2,
                                      straggler_model=FixedSlowdown((SLOW,), SLOWDOWN), pool=pool, scheduler=sink)
    try:
        r = rt.train(4)
    finally:
        rt.shutdown()
    got = ray.get(sink.get.remote())
    assert {rep.step for rep in got} == {0, 1, 2, 3}
    assert all(rep.samples == len(x) // N and rep.grad_norm > 0 and rep.compute_s > 0 for rep in got)
    assert len(got) >= 4 * (N - S) and all(rep.worker_id != SLOW for rep in got)  # cut-short steps are not sent
    assert len(r.records) == 4
