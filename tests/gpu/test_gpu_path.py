"""The real GPU path (CUDA tensors, NCCL, DDP's hook on the GPU). Skipped where no GPU is visible; the CPU
suite never needs it.

With two or more GPUs, two Ray Train workers (one GPU each, NCCL) train with unequal batch sizes and
rank 0 checks every step's combined gradient against the same global batch's gradient in one process.
With one GPU the same test runs one rank: it checks the CUDA path (the DDP hook on NCCL, CUDA event
timing, a step's gradient equal to the reference's), but not the weighting across ranks, which needs two.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RAY_TESTS = Path(__file__).resolve().parents[1] / "ray"


def test_combined_gradient_on_gpus_equals_the_single_process_gradient(tmp_path):
    import ray
    import ray.train

    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.train import PDMLTrainer

    sys.path.insert(0, str(RAY_TESTS))
    from loops import wrapped_loop

    workers = min(2, torch.cuda.device_count())
    out = tmp_path / "out.json"
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": str(RAY_TESTS), "OMP_NUM_THREADS": "1"}}, log_to_driver=False)
    try:
        config = PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(
            global_batch_size=256, emulated_speeds=[1.0, 0.4][:workers], warmup_steps=1,
            ema_alpha=1.0), scheduler_name="gpu-grad")
        PDMLTrainer(wrapped_loop, train_loop_config={"out": str(out), "steps": 10, "sync": "ddp"},
                    scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=True),
                    run_config=ray.train.RunConfig(name="gpu-grad", storage_path=str(tmp_path)),
                    pdml_config=config).fit()
    finally:
        ray.shutdown()
    result = json.loads(out.read_text())
    assert result["device"].startswith("cuda") and result["world_size"] == workers
    assert result["checks"], result
    for check in result["checks"]:
        assert check["max_abs_diff"] < 1e-5, check
    if workers >= 2:  # the emulated 0.4 worker must have got a smaller batch, so weights were exercised
        assert len([c for c in result["checks"] if c["sizes"][0] != c["sizes"][1]]) >= 3, result["checks"]


def test_gpu_check_script_trains_through_pdml_trainer():
    script = Path(__file__).resolve().parents[2] / "examples" / "gpu_check.py"
    out = subprocess.run([sys.executable, str(script), "--workers", "1"], capture_output=True, text=True, timeout=600,
                         env={**os.environ})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "GPU path OK" in out.stdout
