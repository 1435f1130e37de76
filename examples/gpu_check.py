"""The training half of the one GPU check (``scripts/gpu_check.sh`` runs it after ``tests/gpu``).

Run on a machine with at least one GPU:   python examples/gpu_check.py [--workers N] [--json FILE]

Every check trains through ``PDMLTrainer`` with one GPU per worker (default: every visible GPU):

- ``path``: 40 steps of the classification loop (a DDP MLP). Every worker records, from inside its
  process, that its device is CUDA, that its process group's backend is NCCL and that its step timer
  is the CUDA-event one; the run must have reported, with sizes summing to the global batch.
- ``weights_ddp``, ``weights_fsdp``: a model wrapped in DDP, or sharded with FSDP2 (``fully_shard``),
  at EMULATED speeds 1 and 0.4 so that the batch sizes differ; at every step rank 0 compares the
  combined gradient with one process's gradient on the same global batch (max abs difference < 1e-4).
- ``syncbn``: a small convolutional model with BatchNorm and ``node_priority.batchnorm="sync"``: its
  layers must be ``SyncBatchNorm`` on every worker, and the combined gradient must equal one process's
  (plain BatchNorm over the whole global batch) at every step: global statistics make the trained model
  the one uniform data parallelism trains, whatever the shares.

- ``pipeline_nccl`` (2 or more GPUs; not a Ray Train run): the project's 1f1b plan on torch's own
  pipeline runtime (``pdml_ray.pipeline.torch_exec``), one stage per GPU and activations over NCCL; its
  gradients must equal one step of torch's ``Schedule1F1B`` (max abs difference < 1e-4).

With one GPU every check runs one rank (``world_size`` 1 in the JSON): the CUDA path, the hooks on
NCCL, CUDA events, SyncBatchNorm's conversion; the weighting across ranks and SyncBatchNorm's
cross-rank statistics need 2 or more GPUs, and ``multi_rank_nccl`` says whether they ran. Exit status
0 when every check passed.
"""

import argparse
import json
import sys

import numpy as np
import ray
import ray.train
import torch
import torch.nn.functional as F

TOLERANCE = 1e-4
"""Largest absolute gradient difference from one process's (float32, TF32 off)."""


def path_loop(config: dict) -> None:
    """The classification loop, after this worker records where it runs (1.0 yes, 0.0 no): its device
    is CUDA, its process group is NCCL, its step timer uses CUDA events."""
    import torch.distributed as dist

    from pdml_ray.train import get_context
    from pdml_ray.train.timing import CudaEventTimer
    from pdml_ray.train.workloads import classification_loop

    ctx = get_context()
    on_cuda = ctx.device.type == "cuda" and torch.cuda.is_available()
    nccl = dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"
    ctx.record_measurement(f"gpu_check/rank{ctx.rank}/cuda", float(on_cuda))
    ctx.record_measurement(f"gpu_check/rank{ctx.rank}/nccl", float(nccl))
    ctx.record_measurement(f"gpu_check/rank{ctx.rank}/cuda_events", float(isinstance(ctx._timer, CudaEventTimer)))
    classification_loop(config)


def _bn_model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 4))


def weights_loop(config: dict) -> None:
    """``config["sync"]``: 'ddp' (the user wraps in DDP), 'fsdp' (fully_shard) or 'syncbn' (a plain
    BatchNorm model; prepare_model converts it). Rank 0 compares each step's combined gradient with
    one process's on the same global batch and writes the results to ``config["out"]``."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from pdml_ray.train import get_context

    torch.backends.cuda.matmul.allow_tf32 = False  # full float32, so that 1e-4 means something
    torch.backends.cudnn.allow_tf32 = False
    ctx = get_context()
    dev, sync = ctx.device, config["sync"]
    g = torch.Generator().manual_seed(1)
    n = config["steps"] * ctx.config.node.batch
    x = torch.randn(n, 3, 8, 8, generator=g) if sync == "syncbn" else torch.randn(n, 32, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    x, y = x.to(dev), y.to(dev)
    model = (_bn_model() if sync == "syncbn" else _mlp()).to(dev)
    reference = (_bn_model() if sync == "syncbn" else _mlp()).to(dev)  # plain BatchNorm: one process
    if sync == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    elif sync == "fsdp":
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    model = ctx.prepare_model(model)
    inner = model.module if hasattr(model, "module") else model
    synced = sum(isinstance(m, torch.nn.SyncBatchNorm) for m in inner.modules())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    checks = []
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            idx = torch.as_tensor(batch.indices, device=dev)
            step.loss(F.cross_entropy(model(x[idx]), y[idx], reduction="none")).backward()
        everyone: list = [None] * ctx.world_size
        dist.all_gather_object(everyone, batch.indices)
        params = [full(p.detach()) for p in model.parameters()]  # collectives under FSDP2: every rank
        grads = [full(p.grad) for p in model.parameters()]
        if ctx.rank == 0:
            with torch.no_grad():
                for q, p in zip(reference.parameters(), params):
                    q.copy_(p)
            reference.zero_grad()
            idx = torch.as_tensor(np.concatenate(everyone), device=dev)
            F.cross_entropy(reference(x[idx]), y[idx]).backward()
            diff = max((gr - q.grad).abs().max().item() for gr, q in zip(grads, reference.parameters()))
            checks.append({"step": batch.step, "sizes": [len(e) for e in everyone], "max_abs_diff": diff})
        optimizer.step()
        optimizer.zero_grad()
    if ctx.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"checks": checks, "device": str(dev), "world_size": ctx.world_size,
                       "sync_batchnorm_layers": synced, "timed_comm": ctx._combiner.timed_comm}, f)


def pipeline_rank(rank: int, world_size: int) -> float:
    """One step of the project's 1f1b plan on torch's pipeline runtime, stage r on GPU r and activations
    over NCCL, against one step of torch's own Schedule1F1B: the largest gradient difference on this rank."""
    from torch.distributed.pipelining import Schedule1F1B

    from pdml_ray import make_schedule
    from pdml_ray.pipeline.torch_exec import TorchPlanRuntime, pipeline_stages

    torch.backends.cuda.matmul.allow_tf32 = False
    dev, plan = torch.device("cuda", rank), make_schedule("1f1b", stages=world_size, replicas=1, microbatches=4).plan(0)
    gen = torch.Generator().manual_seed(1)  # the same batch on every rank
    x, y = torch.randn(64, 32, generator=gen).to(dev), torch.randn(64, 4, generator=gen).to(dev)
    grads = []
    for on_plan in (True, False):
        model = _mlp()
        stages = pipeline_stages(model, plan, rank, dev)
        runner = TorchPlanRuntime(stages, 4, loss_fn=F.mse_loss) if on_plan else Schedule1F1B(stages[0], 4, loss_fn=F.mse_loss)
        if on_plan:
            runner.load(plan)
        runner.step(x, target=y)
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    return max((a - b).abs().max().item() for a, b in zip(*grads))


def check_pipeline(gpus: int) -> dict:
    """``pipeline_rank`` on every GPU (one pipeline stage each)."""
    from pdml_ray.pipeline.torch_exec import run_local_ranks

    diffs = run_local_ranks(pipeline_rank, gpus, backend="nccl", timeout_s=300.0)
    return {"ok": max(diffs) < TOLERANCE, "stages": gpus, "max_abs_diff": max(diffs)}


def check_path(workers: int) -> dict:
    from pdml_ray import NodePriorityConfig, PDMLConfig
    from pdml_ray.train import PDMLTrainer

    result = PDMLTrainer(
        path_loop,
        train_loop_config={"num_samples": 40 * 4096, "dim": 512, "hidden": 4096, "depth": 3, "num_classes": 10,
                           "epochs": 1, "lr": 0.05, "seed": 0, "progress_every": 10, "measure_comm": True},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=True),
        pdml_config=PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=4096), scheduler_name="gpu-path"),
    ).fit()
    stats = result.pdml.stats
    node = stats.derivers["node"]
    per_worker = {what: [stats.measurements.get(f"gpu_check/rank{r}/{what}") for r in range(workers)]
                  for what in ("cuda", "nccl", "cuda_events")}  # 1.0 yes, 0.0 no, None: not recorded
    ok = (sum(node.batch_sizes) == 4096 and stats.reports_received > 0
          and all(v == 1.0 for values in per_worker.values() for v in values))
    return {"ok": ok, "accelerators": list(node.accelerator_types), "rates": [float(r) for r in node.rates],
            "batch_sizes": list(node.batch_sizes), "comm_s": stats.measurements.get("comm_s"), **per_worker}


def check_weights(sync: str, workers: int, out: str) -> dict:
    from pdml_ray import NodePriorityConfig, PDMLConfig
    from pdml_ray.train import PDMLTrainer

    config = PDMLConfig(decision_interval=2, scheduler_name=f"gpu-{sync}", node_priority=NodePriorityConfig(
        global_batch_size=256, emulated_speeds=[1.0 if r % 2 == 0 else 0.4 for r in range(workers)],
        warmup_steps=1, ema_alpha=1.0, batchnorm="sync" if sync == "syncbn" else "floor"))
    PDMLTrainer(weights_loop, train_loop_config={"out": out, "steps": 10, "sync": sync},
                scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=True),
                pdml_config=config).fit()
    with open(out) as f:
        got = json.load(f)
    worst = max((c["max_abs_diff"] for c in got["checks"]), default=float("inf"))
    unequal = sum(len(set(c["sizes"])) > 1 for c in got["checks"])
    ok = got["device"].startswith("cuda") and bool(got["checks"]) and worst < TOLERANCE
    if workers >= 2:  # the emulated 0.4 workers got smaller batches: the weights were exercised
        ok = ok and unequal >= 3
    if sync == "syncbn":
        ok = ok and got["sync_batchnorm_layers"] == 1
    if sync == "fsdp":
        ok = ok and got["timed_comm"]  # FSDP2's collectives bracketed out of the compute time
    return {"ok": ok, "max_abs_diff": worst, "steps_checked": len(got["checks"]), "steps_with_unequal_sizes": unequal,
            "world_size": got["world_size"], "sync_batchnorm_layers": got["sync_batchnorm_layers"],
            "timed_comm": got["timed_comm"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=None, help="GPU workers (default: all visible GPUs)")
    p.add_argument("--json", default=None, help="write the checks' results to this file")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: nothing to check here")
        return 1
    gpus = torch.cuda.device_count()
    workers = args.workers or gpus
    import tempfile

    ray.init(log_to_driver=False)
    checks: dict = {}
    try:
        checks["path"] = check_path(workers)
        with tempfile.TemporaryDirectory() as tmp:
            for sync in ("ddp", "fsdp", "syncbn"):
                name = "syncbn" if sync == "syncbn" else f"weights_{sync}"
                checks[name] = check_weights(sync, workers, f"{tmp}/{sync}.json")
    finally:
        ray.shutdown()
    if gpus >= 2:
        checks["pipeline_nccl"] = check_pipeline(gpus)
    report = {"gpus": gpus, "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
              "world_size": workers, "multi_rank_nccl": workers >= 2,
              "not_run": ([] if workers >= 2 else ["gradient weights across ranks", "SyncBatchNorm across ranks",
                                                   "NCCL between ranks (needs 2 or more GPUs)"])
              + ([] if gpus >= 2 else ["pipeline stages over NCCL on torch's runtime (needs 2 or more GPUs)"]),
              "checks": checks, "ok": all(c["ok"] for c in checks.values())}
    for name, c in checks.items():
        print(f"{name:<14} {'OK' if c['ok'] else 'FAILED'}  {json.dumps({k: v for k, v in c.items() if k != 'ok'})}")
    print(f"world size {workers} of {gpus} GPU(s); multi-rank NCCL {'run' if workers >= 2 else 'NOT run (1 GPU)'}")
    print("GPU path OK" if report["ok"] else "GPU path FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
