"""``topk`` and ``async`` on real Ray worker actors: the run finishes, the loss drops, the gradient
deriver is fed through the run's scheduler actor (topk) and a slow worker's gradients are applied stale (async)."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from pdml_ray.runtime.stragglers import StragglerRuntime, WorkerPool  # noqa: E402
from pdml_ray.stragglers.delays import FixedSlowdown, ShiftedExponential  # noqa: E402
from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model  # noqa: E402
from pdml_ray.stragglers.registry import make_policy  # noqa: E402

N, DIM, STEPS = 6, 8, 12
PER_SAMPLE_S = 2e-4  # 64 samples per partition: ~13 ms of emulated compute per partition


@pytest.fixture(scope="module")
def pool(ray_local):
    p = WorkerPool(num_cpus_per_worker=0.25)
    yield p
    p.shutdown()


def run(pool, name, stragglers, model, status=None):
    x, y = logistic_data(N * 64, DIM, seed=0)
    policy = make_policy(name, workers=N, stragglers=stragglers)
    rt = StragglerRuntime(policy, logistic_model(DIM), logistic_loss, x, y, lr=1.0, l2=1e-2, straggler_model=model,
                          per_sample_s=PER_SAMPLE_S, pool=pool)
    try:
        result = rt.train(STEPS)
        if status is not None:  # the answer to the last request may still be on its way (never waited on)
            deadline = time.monotonic() + 30
            sent = rt.feed.requests_sent if rt.feed is not None else 0
            while not status or (status["decision_requests"] < sent and time.monotonic() < deadline):
                status.update(_status(rt.scheduler_name))
                time.sleep(0.1)
        return rt, result
    finally:
        rt.shutdown()


def _status(name):
    """``pdml-ray status --json --name NAME`` of the running scheduler, as a dict."""
    import contextlib
    import io
    import json

    from pdml_ray.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", "--json", "--name", name]) == 0
    return json.loads(out.getvalue())["schedulers"][name]


def test_topk_trains_and_feeds_the_deriver(pool):
    status: dict = {}
    rt, r = run(pool, "topk", 1, ShiftedExponential(1.0, seed=0), status)
    # the run's scheduler actor derived the rule: its gradient axis is in pdml-ray status, no node axis
    assert rt.scheduler_name is not None and set(status["derivers"]) == {"gradient"}
    # every request the feed sent (at step 5, and at step 10 or once step 5's answer was in) was served:
    # version 0 is the prior rule, the step-5 request publishes the next (a later one only if the rule changed)
    sent = rt.feed.requests_sent
    assert 1 <= sent <= 2 and status["decision_requests"] == sent, (sent, status["decision_requests"])
    assert 1 <= status["versions"]["gradient"] <= sent, (sent, status["versions"])
    assert status["reports_received"] >= N * 5
    assert r.stalled is None and len(r.records) == STEPS
    assert r.final_loss < r.initial_loss - 0.1
    # the rule is adopted when the scheduler actor's answer is there, never waited on: on a loaded machine
    # an answer may come after the last step
    adopted = [s for s, _ in rt.feed.k_history]
    assert len(adopted) <= sent and all(5 <= s < STEPS for s in adopted) and rt.feed.cost_s > 0, adopted
    assert adopted == sorted(set(adopted)), adopted
    # the runtime has shut down (its scheduler actor too): the feed's figures stay readable, as a benchmark reads them
    assert rt.feed is not None and rt.feed.stats()["cost_s"] == rt.feed.cost_s
    assert all(set(dict(rec.combination.weights)) <= set(rec.arrived) and len(rec.arrived) >= N - 1
               for rec in r.records)


def test_async_trains_and_applies_the_slow_worker_stale(pool):
    rt, r = run(pool, "async", N - 3, FixedSlowdown((2,), 3.0))  # 3 gradients per update
    assert r.stalled is None and len(r.records) == STEPS
    assert r.final_loss < r.initial_loss - 0.1
    bound = rt.policy.max_staleness  # type: ignore[attr-defined]
    assert all(rec.combination.max_staleness <= bound for rec in r.records)
    assert max(rec.combination.max_staleness for rec in r.records) >= 1
