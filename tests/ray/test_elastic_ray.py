"""Elastic worker counts: a PDMLTrainer run with ScalingConfig(num_workers=(2, 3)) and half a CPU per
worker, on a local cluster of an A100-labelled head node, grows to 3 workers when an H100-labelled node
joins and shrinks back to 2 when that node is killed. Each start resumes from the latest checkpoint;
the scheduler is resized, seeds the newcomer from the accelerator prior, and its shares are in force
within one decision interval of each restart; every sample of each epoch is used exactly once in the
history of the final model (the steps a restart rolled back are replayed from the checkpoint)."""

import json
import os
import threading
import time

import pytest
import ray
import ray.train
from ray.cluster_utils import Cluster

from pdml_ray.config import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.errors import ConfigError
from pdml_ray.priority.node import NodePriorityDeriver
from pdml_ray.train import PDMLTrainer

from elastic_loops import elastic_loop

N, B, K = 64 * 40, 64, 4  # 40 steps per epoch, 2 epochs


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    # After the node is killed, Ray Train's resource view still counts it: it first tries 3 workers and
    # waits out its worker-group start timeout (60 s) before it shrinks to 2 (the guide says so). That
    # timeout bounds only the wait for the group's placement group (its resources), not the workers' start,
    # and here a group that fits is placed in well under a second; a timed-out start is retried without
    # counting as a failure (FailureConfig.controller_failure_limit, default unlimited), so 5 s only
    # shortens the wait (20 s before: 15 s of each run spent waiting for a node known dead).
    timeout = os.environ.get("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S")
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = "5"
    if ray.is_initialized():
        ray.shutdown()
    here = os.path.dirname(os.path.abspath(__file__))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"accelerator_type:A100": 1}})
    ray.init(address=c.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here, "OMP_NUM_THREADS": "1"}})
    yield c
    ray.shutdown()
    c.shutdown()
    if timeout is None:
        os.environ.pop("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S")
    else:
        os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = timeout


def _lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _wait(path, condition, timeout_s=240):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition(_lines(path)):
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting; last lines: {_lines(path)[-2:]}")


def test_a_run_grows_to_three_workers_and_back_with_every_sample_once(cluster, tmp_path):
    out = str(tmp_path / "steps.jsonl")
    config = PDMLConfig(decision_interval=K, node_priority=NodePriorityConfig(
        global_batch_size=B, warmup_steps=1000))  # no measurement moves the shares: they are the prior's
    trainer = PDMLTrainer(elastic_loop, train_loop_config={"out": out, "num_samples": N, "pace_s": 0.25},
                          scaling_config=ray.train.ScalingConfig(num_workers=(2, 3), resources_per_worker={"CPU": 0.5},
                                                                 elastic_resize_monitor_interval_s=1.0),
                          run_config=ray.train.RunConfig(name="elastic", storage_path=str(tmp_path),
                                                         failure_config=ray.train.FailureConfig(max_failures=3)),
                          pdml_config=config)
    box = {}
    fit = threading.Thread(target=lambda: box.update(result=trainer.fit()), daemon=True)
    fit.start()
    _wait(out, lambda ls: any(line["step"] >= 6 for line in ls))
    node = cluster.add_node(num_cpus=1, resources={"accelerator_type:H100": 1})
    _wait(out, lambda ls: any(line["world"] == 3 and line["step"] >= line["start"] + 2 * K for line in ls))
    cluster.remove_node(node)
    fit.join(timeout=300)
    assert not fit.is_alive() and box["result"].error is None

    lines = _lines(out)
    attempts = []  # each start of the worker group, in order: its lines
    for line in lines:
        if not attempts or attempts[-1][0]["attempt"] != line["attempt"]:
            attempts.append([])
        attempts[-1].append(line)
    worlds = [a[0]["world"] for a in attempts]
    assert [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]] == [2, 3, 2], worlds

    # the history of the final model: each start's steps before the next start's checkpoint step
    history = []
    for attempt, following in zip(attempts, attempts[1:] + [None]):
        end = following[0]["start"] if following else float("inf")
        assert following is None or end <= attempt[-1]["step"] + 1  # it resumed from a step this one reached
        history += [line for line in attempt if line["step"] < end]
    assert [line["step"] for line in history] == list(range(2 * N // B))
    for epoch in (0, 1):
        ids = [i for line in history if line["epoch"] == epoch for rank in line["ids"] for i in rank]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}"

    for attempt in attempts:
        first = attempt[0]
        prior = list(NodePriorityDeriver(config, first["world"], first["types"]).initial().batch_sizes)
        for line in attempt:
            assert [len(r) for r in line["ids"]] == line["sizes"]  # every rank trained its size
        in_force = next((line["step"] for line in attempt if line["sizes"] == prior), None)
        assert in_force is not None, (first["types"], prior, [line["sizes"] for line in attempt[:K + 1]])
        lag = in_force - first["start"]
        print(f"start at step {first['start']} with {first['world']} workers {first['types']}: shares {prior} in "
              f"force after {lag} steps; ran to step {attempt[-1]['step']}")
        assert lag <= K  # the target: in force within one decision interval of the restart
        assert all(line["sizes"] == prior for line in attempt if line["step"] >= first["start"] + lag)
    three = next(a for a in attempts if a[0]["world"] == 3)
    assert sorted(three[0]["types"]) == ["A100", "A100", "H100"] or sorted(three[0]["types"]) == ["A100", "H100", "H100"]
    assert max(three[-1]["sizes"]) > B // 3  # the newcomer's H100 prior gives it the larger share


@pytest.mark.parametrize("config, match", [
    (PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B), sample_priority=SamplePriorityConfig()),
     "node priorities alone"),
    (PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B, emulated_speeds=[1.0, 0.5])), "emulated_speeds"),
    (PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B, min_batch=30)), "min_batch=30 x 3 workers"),
])
def test_what_an_elastic_run_cannot_follow_is_refused_before_it_starts(config, match):
    with pytest.raises(ConfigError, match=match):
        PDMLTrainer(elastic_loop, scaling_config=ray.train.ScalingConfig(num_workers=(2, 3)), pdml_config=config)
