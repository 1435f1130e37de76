"""One local Ray cluster for the Ray tier, shared by its modules (starting and stopping Ray costs seconds
per module, and a warm cluster keeps its idle worker processes, which have torch imported already)."""

import os

import pytest

ray = pytest.importorskip("ray")

HERE = os.path.dirname(os.path.abspath(__file__))


def _start() -> None:
    # Ray workers import training loops from tests/ray/loops.py: put this folder on their path
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="pdml-test",
             runtime_env={"env_vars": {"PYTHONPATH": HERE, "OMP_NUM_THREADS": "1"}})


OWN_CLUSTER = ("test_cluster_prior.py", "test_elastic_ray.py")
"""Modules that end the shared cluster to run a multi-node cluster of their own: they run last, so the
shared cluster starts once (in file order it started three times, each start some seconds on 2 cores)."""


def pytest_collection_modifyitems(config, items):
    """The Ray tier's modules in file order, the ``OWN_CLUSTER`` ones after the rest."""
    tier = [i for i, item in enumerate(items) if str(item.path).startswith(HERE + os.sep)]
    if tier:
        chosen = [items[i] for i in tier]
        chosen.sort(key=lambda item: item.path.name in OWN_CLUSTER)  # stable: file order otherwise
        for i, item in zip(tier, chosen):
            items[i] = item


@pytest.hookimpl(trylast=True)  # after the runner's teardown, which ends the module's fixtures
def pytest_runtest_teardown(item, nextitem):
    """The shared cluster ends with the Ray tier's last test: the tiers after it expect no Ray running."""
    if (nextitem is None or not str(nextitem.path).startswith(HERE + os.sep)) and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster with 4 logical CPUs: the one the previous module left, or a fresh one where a
    module ended it to run a cluster of its own (the elastic and accelerator-prior tests)."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not ray.is_initialized():
        _start()
    yield ray
