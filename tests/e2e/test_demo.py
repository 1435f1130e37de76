"""The README's main job (`make demo` is `pdml-ray demo`) runs end to end, at a tiny size, as a newcomer runs it:
two workers, one fast and one slow (the default four, two at 1.0 and two at 0.4, start twice as many Ray Train
workers for the same check; tests/unit/test_demo_args.py checks the defaults and their speed-ratio split)."""

import ast
import os
import re
import subprocess
import sys


def test_the_demo_trains_both_runs_and_shows_the_split_beside_the_speed_ratio():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "pdml_ray.cli", "demo", "--speeds", "1,0.4", "--steps", "30",
                          "--global-batch", "64", "--compute", "sleep", "--per-sample-ms", "0.5"],
                         capture_output=True, text=True, timeout=900, env=env)
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "run 1/2: uniform shares" in out and "run 2/2: node priorities" in out and "EMULATED" in out
    uniform, sizes = (ast.literal_eval(s) for s in
                      re.search(r"batch sizes\s+\|?\s*(\[[^\]]*\])\s+\|?\s*(\[[^\]]*\])", out).groups())
    ratio = ast.literal_eval(re.search(r"speed-ratio split \(for comparison\)\s+\|?\s*\|?\s*(\[[^\]]*\])", out).group(1))
    assert uniform == [32, 32] and sum(sizes) == 64 and ratio == [46, 18]  # 64 x 1/1.4 and 64 x 0.4/1.4, rounded
    # the fast worker (1.0) and the slow one (0.4): node priorities give the fast one more
    assert sizes[0] > sizes[1], out[-2000:]
    assert "the split follows the emulated speeds" in out
