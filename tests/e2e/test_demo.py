"""The README's main job (`make demo` is `pdml-ray demo`) runs end to end, at a tiny size, as a newcomer runs it."""

import ast
import os
import re
import subprocess
import sys


def test_the_demo_trains_both_runs_and_shows_the_split_beside_the_speed_ratio():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "pdml_ray.cli", "demo", "--steps", "30", "--global-batch", "64",
                          "--compute", "sleep", "--per-sample-ms", "0.5"],
                         capture_output=True, text=True, timeout=900, env=env)
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "run 1/2: uniform shares" in out and "run 2/2: node priorities" in out and "EMULATED" in out
    sizes = ast.literal_eval(re.search(r"batch sizes\s+\|?\s*\[[^\]]*\]\s+\|?\s*(\[[^\]]*\])", out).group(1))
    ratio = ast.literal_eval(re.search(r"speed-ratio split \(for comparison\)\s+\|?\s*\|?\s*(\[[^\]]*\])", out).group(1))
    assert sum(sizes) == 64 and sum(ratio) == 64 and ratio == [23, 23, 9, 9]  # 64 x 1/2.8 and 64 x 0.4/2.8, rounded
    # two fast workers (1.0) and two slow (0.4): node priorities give each fast one more than each slow one
    assert min(sizes[:2]) > max(sizes[2:]), out[-2000:]
    assert "the split follows the emulated speeds" in out
