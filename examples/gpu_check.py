"""A short smoke run of the real GPU path: CUDA tensors, NCCL all-reduce, CUDA event timing.

Run on a machine with at least one GPU:   python examples/gpu_check.py [--workers N]
It trains 40 steps through PDMLTrainer with one GPU per worker and prints the accelerator types,
rates, batch sizes and the all-reduce time. It checks, from inside every worker, that the worker's
device is CUDA and its process group's backend is NCCL (each worker records both as measurements the
scheduler keeps), that the run reported, and that the sizes sum to the global batch. (The
exact-gradient check on GPUs is ``tests/gpu/test_gpu_path.py``.)
"""

import argparse
import sys

import ray
import ray.train
import torch


def checked_loop(config: dict) -> None:
    """The classification loop, after this worker records where it runs: 1.0 when its device is CUDA
    (and CUDA is available in its process), 1.0 when its process group's backend is NCCL."""
    import torch.distributed as dist

    from pdml_ray.train import get_context
    from pdml_ray.train.workloads import classification_loop

    ctx = get_context()
    on_cuda = ctx.device.type == "cuda" and torch.cuda.is_available()
    nccl = dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"
    ctx.record_measurement(f"gpu_check/rank{ctx.rank}/cuda", float(on_cuda))
    ctx.record_measurement(f"gpu_check/rank{ctx.rank}/nccl", float(nccl))
    classification_loop(config)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=None, help="GPU workers (default: all visible GPUs)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: nothing to check here")
        return 1
    workers = args.workers or torch.cuda.device_count()
    from pdml_ray import NodePriorityConfig, PDMLConfig
    from pdml_ray.train import PDMLTrainer

    ray.init()
    result = PDMLTrainer(
        checked_loop,
        train_loop_config={"num_samples": 40 * 4096, "dim": 512, "hidden": 4096, "depth": 3, "num_classes": 10,
                           "epochs": 1, "lr": 0.05, "seed": 0, "progress_every": 10, "measure_comm": True},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=True),
        pdml_config=PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=4096)),
    ).fit()
    stats = result.pdml.stats
    node = stats.derivers["node"]
    print("accelerators:", list(node.accelerator_types))
    print("rates (samples/s):", [round(r) for r in node.rates], "batch sizes:", list(node.batch_sizes))
    print("all-reduce alone (s):", stats.measurements.get("comm_s"))
    on_cuda = [stats.measurements.get(f"gpu_check/rank{r}/cuda") for r in range(workers)]
    nccl = [stats.measurements.get(f"gpu_check/rank{r}/nccl") for r in range(workers)]
    print("per worker, on CUDA:", on_cuda, "NCCL process group:", nccl)  # 1.0 yes, 0.0 no, None: not recorded
    ok = (sum(node.batch_sizes) == 4096 and stats.reports_received > 0
          and all(v == 1.0 for v in on_cuda) and all(v == 1.0 for v in nccl))
    print("GPU path OK" if ok else "GPU path FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
