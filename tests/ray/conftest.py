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
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="pdml-test")
    yield ray
    ray.shutdown()
