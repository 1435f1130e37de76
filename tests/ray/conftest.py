"""One local Ray cluster per test module (starting Ray costs seconds; tests share it)."""

import os

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster with 4 logical CPUs, shut down after the module."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if ray.is_initialized():
        ray.shutdown()
    # Ray workers import training loops from tests/ray/loops.py: put this folder on their path
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="pdml-test",
             runtime_env={"env_vars": {"PYTHONPATH": here, "OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()
