"""Two nodes advertising accelerator_type:H100 and accelerator_type:A100: workers learn their type,
the first decision follows the prior, and the scheduler's gauges show it on the metrics endpoint."""

import json
import os
import time
import urllib.request

import pytest
import ray
import ray.train
from ray.cluster_utils import Cluster

from pdml_ray.batching import round_to_batch_sizes
from pdml_ray.config import DEFAULT_ACCELERATOR_PRIOR, NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer

from loops import first_step_loop

GLOBAL_BATCH = 132


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():  # the session's shared local cluster (tests/ray/conftest.py): this module needs its own
        ray.shutdown()
    here = os.path.dirname(os.path.abspath(__file__))
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "_system_config": {"metrics_report_interval_ms": 500}})  # workers never land here
    c.add_node(num_cpus=1, resources={"accelerator_type:H100": 1})
    c.add_node(num_cpus=1, resources={"accelerator_type:A100": 1})
    ray.init(address=c.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here, "OMP_NUM_THREADS": "1"}})
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("prior") / "rank"
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=GLOBAL_BATCH), scheduler_name="prior-test")
    trainer = PDMLTrainer(first_step_loop, train_loop_config={"out": str(out), "num_samples": GLOBAL_BATCH},
                          scaling_config=ray.train.ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD",
                                                                 resources_per_worker={"CPU": 1}),
                          run_config=ray.train.RunConfig(name="prior-test", storage_path=str(out.parent)),
                          pdml_config=config, keep_scheduler=True)
    result = trainer.fit()
    ranks = [json.loads(open(f"{out}.{r}").read()) for r in range(2)]
    yield result, ranks
    assert trainer.scheduler is not None
    ray.kill(trainer.scheduler)


def test_workers_learn_their_accelerator_and_start_from_the_prior(run):
    _, ranks = run
    types = [r["accelerator_type"] for r in ranks]
    assert sorted(types) == ["A100", "H100"]
    expected = round_to_batch_sizes([DEFAULT_ACCELERATOR_PRIOR[t] for t in types], GLOBAL_BATCH).tolist()
    assert ranks[0]["batch_sizes"] == expected == ranks[1]["batch_sizes"]
    assert [r["mine"] for r in ranks] == expected
    h100 = types.index("H100")
    assert expected[h100] > 2.5 * expected[1 - h100]


def _scrape_all_nodes() -> list[str]:
    lines = []
    for node in ray.nodes():
        port = node.get("MetricsExportPort")
        if node.get("Alive") and port:
            try:
                text = urllib.request.urlopen(f"http://{node['NodeManagerAddress']}:{port}/metrics", timeout=5).read()
            except OSError:
                continue
            lines += [l for l in text.decode().splitlines() if l.startswith("ray_pdml_") and 'run="prior-test-' in l]
    return lines


def test_priorities_are_exported_as_metrics(run):
    _, ranks = run
    types = [r["accelerator_type"] for r in ranks]
    sizes = ranks[0]["batch_sizes"]
    wanted = {f'worker="{w}"': (types[w], sizes[w]) for w in range(2)}
    expected = {tag: float(size) for tag, (_, size) in wanted.items()}
    deadline = time.monotonic() + 45
    found: dict = {}
    # until the newest values show: the first export may still hold the uniform start (decision 0)
    while time.monotonic() < deadline and found != expected:
        for line in _scrape_all_nodes():
            if line.startswith("ray_pdml_batch_size_samples{"):
                for tag, (accel, size) in wanted.items():
                    if tag in line and f'accelerator_type="{accel}"' in line:
                        found[tag] = float(line.rsplit(" ", 1)[1])
        time.sleep(1)
    assert found == expected
    names = {l.split("{", 1)[0] for l in _scrape_all_nodes()}
    assert {"ray_pdml_node_priority_ratio", "ray_pdml_grad_weight_ratio", "ray_pdml_decision_version"} <= names
