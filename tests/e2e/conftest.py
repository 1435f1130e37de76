"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_address(request):
    """One local Ray cluster for the module, of the module's ``RAY_CPUS`` logical CPUs (default 4); the
    module's subprocesses (benchmarks, snippets) join it through RAY_ADDRESS. Its address is yielded."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=getattr(request.module, "RAY_CPUS", 4), include_dashboard=False,
             log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
