"""The partition median the sample table's robust scale takes (the EMA is tested with osprey's estimates)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pdml_ray.priority.estimators import median


@pytest.mark.parametrize("n", [1, 2, 3, 64, 255, 256])
def test_median_equals_numpys(n: int):
    x = np.random.default_rng(n).exponential(size=n)
    assert median(x) == pytest.approx(float(np.median(x)), rel=0, abs=0)
    assert median(np.array([3.0, 1.0, 2.0, 10.0])) == 2.5


def test_a_scored_update_imports_nothing():
    """np.median's first call imports numpy.ma (15 ms); the sample table's robust scale must not pay it
    inside a training step."""
    code = ("import sys, numpy as np\n"
            "from pdml_ray.config import SamplePriorityConfig\n"
            "from pdml_ray.priority.sample import SamplePrioritizer\n"
            "sp = SamplePrioritizer(1000, SamplePriorityConfig())\n"
            "before = set(sys.modules)\n"
            "sp.update(np.arange(64), np.linspace(0.1, 2.0, 64), 0)\n"
            "print(sorted(set(sys.modules) - before))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out

