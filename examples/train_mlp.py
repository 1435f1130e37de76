"""Train an MLP with node priorities through PDMLTrainer: the smallest complete user program.

Locally:             python examples/train_mlp.py --speeds 1,0.4
On a GPU cluster:    ray job submit --working-dir . -- python examples/train_mlp.py --workers 16 --gpu
"""

import argparse

import ray
import ray.train

from pdml_ray import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.train import PDMLTrainer
from pdml_ray.train.workloads import classification_loop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="one GPU per worker (NCCL)")
    p.add_argument("--speeds", default=None, help="emulated speeds per worker for CPU machines, e.g. 1,0.4")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--sample-priorities", action="store_true", help="also turn on loss-based sample priorities")
    args = p.parse_args()

    speeds = [float(s) for s in args.speeds.split(",")] if args.speeds else None
    workers = len(speeds) if speeds else args.workers
    ray.init()  # under `ray job submit` this joins the cluster; locally it starts one
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=args.global_batch, emulated_speeds=speeds),
                        sample_priority=SamplePriorityConfig() if args.sample_priorities else None)
    result = PDMLTrainer(
        classification_loop,
        train_loop_config={"num_samples": args.steps * args.global_batch, "dim": 128, "hidden": 512, "depth": 2,
                           "num_classes": 10, "epochs": 1, "lr": 0.05, "seed": 0, "progress_every": 10},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=args.gpu),
        pdml_config=config,
    ).fit()
    stats = result.pdml.stats
    node = stats.derivers["node"]
    print(f"final batch sizes {list(node.batch_sizes)} (decision v{stats.versions['node']}, rates {node.rate_source}: "
          f"{[round(r) for r in node.rates]} samples/s)")
    if stats.emulation:
        print(stats.emulation)


if __name__ == "__main__":
    main()
