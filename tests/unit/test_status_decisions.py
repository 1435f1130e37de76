"""What pdml-ray status and result.pdml call the decision in force and the pending one, from the
scheduler's node decision history (no Ray)."""

import argparse
import json

from pdml_ray.cli import status
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.result_metrics import in_force_and_pending


def _d(version, step, sizes):
    return {"version": version, "effective_step": step, "batch_sizes": sizes, "grad_weights": [], "shares": []}


HISTORY = [_d(0, 0, [32, 32]), _d(1, 12, [40, 24]),
           _d(2, 20, [47, 17]), _d(3, 24, [47, 17])]  # v2 came late: the workers passed step 20, v3 re-issues it


def test_the_decision_in_force_is_the_newest_that_took_effect_and_the_pending_one_waits_for_its_step():
    assert in_force_and_pending(HISTORY, 30) == (HISTORY[3], None)
    assert in_force_and_pending(HISTORY, 22) == (HISTORY[1], HISTORY[3])  # v2 was dropped, never in force
    assert in_force_and_pending(HISTORY, 12) == (HISTORY[1], HISTORY[3])
    assert in_force_and_pending(HISTORY, 5) == (HISTORY[0], HISTORY[3])
    assert in_force_and_pending(HISTORY[:2], 5) == (HISTORY[0], HISTORY[1])


def test_status_shows_the_decision_in_force_and_the_pending_one_with_its_effective_step(monkeypatch):
    scheduler = Scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64)), 2)
    scheduler.last_step = 22
    stats = scheduler.stats()

    class Handle:
        class stats:  # noqa: N801 - Ray's method handles
            remote = staticmethod(lambda: stats)

        class decision_history:  # noqa: N801
            remote = staticmethod(lambda name: HISTORY)

    import ray

    import pdml_ray.actors.scheduler as actors
    import pdml_ray.cli.cluster as cluster

    monkeypatch.setattr(cluster, "connect", lambda address: None)
    monkeypatch.setattr(actors, "list_schedulers", lambda namespace: ["pdml-run"])
    monkeypatch.setattr(actors, "find_scheduler", lambda name, namespace: Handle())
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    args = argparse.Namespace(address="auto", name=None, namespace="pdml", json=False)
    text = status.render(status.fetch_stats(args), as_json=False)
    assert "node decision in force at step 22: v1 from step 12: batch sizes [40, 24]" in text
    assert "pending: v3 from step 24: batch sizes [47, 17]" in text
    shown = json.loads(status.render(status.fetch_stats(args), as_json=True))["node_decisions"]["pdml-run"]
    assert shown["in_force"]["version"] == 1 and shown["pending"]["effective_step"] == 24
