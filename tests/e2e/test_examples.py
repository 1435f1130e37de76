"""The GPT example runs as a user would run it locally (tiny size): DDP, a DataLoader with worker
processes over ctx.batch_sampler, ctx.report checkpoints, Ray Train's Result with result.pdml."""

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_gpt_example_trains_through_a_dataloader(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": "local"}
    out = subprocess.run([sys.executable, str(EXAMPLES / "train_gpt.py"), "--speeds", "1,0.5", "--steps", "12",
                          "--layers", "1", "--width", "32", "--seq", "16", "--vocab", "64", "--storage", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("metrics {'epoch': 0") and "PDMLRunInfo(decisions=" in last and "reports=24" in last
    assert "'pdml/batch_size_samples'" in out.stdout  # pdml-ray's figures reach Ray Train's Result.metrics
