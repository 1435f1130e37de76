"""The real GPU path (CUDA tensors, NCCL). Skipped where no GPU is visible; the CPU suite never needs it."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_gpu_check_script_trains_through_pdml_trainer():
    script = Path(__file__).resolve().parents[2] / "examples" / "gpu_check.py"
    out = subprocess.run([sys.executable, str(script), "--workers", "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "GPU path OK" in out.stdout
