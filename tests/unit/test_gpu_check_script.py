"""``scripts/gpu_check.sh`` on a machine without a GPU: it says it skipped, writes a JSON that says why,
installs nothing and exits 0 (on a GPU machine it would run the whole GPU check: not here)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


@pytest.mark.skipif(_gpus() > 0, reason="a GPU is visible: the script would run the whole GPU check")
def test_without_a_gpu_the_check_skips_cleanly_and_says_so(tmp_path):
    out = tmp_path / "gpu_check.json"
    venv = tmp_path / "venv"  # were anything installed, it would land here
    run = subprocess.run(["sh", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "VENV": str(venv)}, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SKIPPED" in run.stdout and "no NVIDIA GPU" in run.stdout
    report = json.loads(out.read_text())
    assert report["ran"] is False and report["gpus"] == 0 and "no NVIDIA GPU" in report["skipped"]
    assert not venv.exists()
