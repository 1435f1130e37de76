"""A short smoke run of the real GPU path: CUDA tensors, NCCL all-reduce, CUDA event timing.

Run on a machine with at least one GPU:   python examples/gpu_check.py [--workers N]
It trains 40 steps through PDMLTrainer with one GPU per worker and prints the accelerator types,
rates, batch sizes and the all-reduce time; it checks that the run reported and the sizes sum to the
global batch. (The exact-gradient check on GPUs is ``tests/gpu/test_gpu_path.py``.)
"""

import argparse
import sys

import ray
import ray.train
import torch


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
    from pdml_ray.train.workloads import classification_loop

    ray.init()
    result = PDMLTrainer(
        classification_loop,
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
    ok = sum(node.batch_sizes) == 4096 and stats.reports_received > 0
    print("GPU path OK" if ok else "GPU path FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
