"""Training loops for tests/ray/test_nonfinite_ray.py: one rank injects a NaN (or inf) loss at chosen steps.

Each step rank 0 checks the update against one process: the parameters before the step, the gradient
of the mean loss over the samples of the ranks that were NOT excluded (exactly the renormalised weights
``b_j / sum_good b``), one SGD step. Every rank writes what it saw (excluded ranks, dropped steps, the
guard's counts) to its own file; a run that must fail writes as far as it got.
"""

import json
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pdml_ray.train import get_context
from pdml_ray.train.workloads import make_classification, make_mlp


def _model(sync, dev):
    model = make_mlp(16, 32, 3, depth=2, seed=11).to(dev)
    if sync == "ddp":  # the user wraps: DDPHook
        return torch.nn.parallel.DistributedDataParallel(model)
    if sync == "fsdp":  # FSDP2: LossScale with the excluding reduce-scatter
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        return fully_shard(model)
    return model  # plain: prepare_model wraps it in DDP with the hook


def nan_loop(config):
    """``steps`` steps; rank ``bad_rank`` poisons its loss at ``bad_steps``, and every rank at
    ``all_bad_steps`` (``kind``: 'nan' multiplies the whole loss by NaN, so backward makes NaN gradients on
    that rank; 'inf' makes one sample's loss inf). Rank 0 compares every step's update with the good
    ranks' update computed in one process."""
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    ctx = get_context()
    dev = ctx.device
    steps, lr = config["steps"], 0.1
    bad_steps, bad_rank, kind = set(config["bad_steps"]), config.get("bad_rank", 1), config.get("kind", "nan")
    all_bad_steps = set(config.get("all_bad_steps", ()))
    x, y = make_classification(steps * 128, 16, 3, seed=11)  # B = 128: `steps` steps
    model = ctx.prepare_model(_model(config["sync"], dev))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    reference = make_mlp(16, 32, 3, depth=2, seed=11)

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    seen, checks, t_start = [], [], time.perf_counter()
    out = f"{config['out']}.rank{ctx.rank}"

    def write(error=None):
        with open(out, "w") as f:
            json.dump({"seen": seen, "checks": checks, "excluded": ctx.nonfinite.excluded,
                       "dropped_steps": ctx.nonfinite.dropped_steps, "events": ctx.nonfinite.events,
                       "steps_done": len(seen), "error": error, "wall_s": time.perf_counter() - t_start}, f)

    try:
        for batch in ctx.epoch(0, len(x)):
            before = [full(p.detach()).clone() for p in model.parameters()]
            with ctx.step(batch) as step:
                per_sample = F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")
                if (bad_rank in (-1, ctx.rank) and batch.step in bad_steps) or batch.step in all_bad_steps:  # -1: every rank
                    if kind == "nan":
                        per_sample = per_sample * float("nan")
                    else:
                        per_sample = per_sample + F.one_hot(torch.tensor(0), len(per_sample)) * float("inf")
                step.loss(per_sample).backward()
            optimizer.step()
            optimizer.zero_grad()
            seen.append({"step": batch.step, "excluded": list(step.excluded), "dropped": step.dropped})
            everyone = [None] * ctx.world_size
            dist.all_gather_object(everyone, batch.indices)
            after = [full(p.detach()) for p in model.parameters()]  # collectives under FSDP2: every rank
            if ctx.rank == 0:
                good = [everyone[j] for j in range(ctx.world_size) if j not in step.excluded]
                with torch.no_grad():
                    for q, p in zip(reference.parameters(), before):
                        q.copy_(p)
                reference.zero_grad()
                if good and not step.dropped:
                    idx = np.concatenate(good)
                    F.cross_entropy(reference(x[idx]), y[idx]).backward()
                    with torch.no_grad():
                        for q in reference.parameters():
                            q -= lr * q.grad
                diff = max((a - q).abs().max().item() for a, q in zip(after, reference.parameters()))
                finite = all(bool(torch.isfinite(a).all()) for a in after)
                checks.append({"step": batch.step, "sizes": [len(e) for e in everyone], "max_abs_diff": diff,
                               "finite": finite, "excluded": list(step.excluded)})
    except Exception as e:  # the run must fail with this error: note it, then let Ray Train see it
        write(f"{type(e).__name__}: {e}")
        raise
    write()


def cost_loop(config):
    """Per-step time of a small DDP model with the guard on or off (``check_nonfinite`` in the config)."""
    torch.set_num_threads(1)
    ctx = get_context()
    steps = config["steps"]
    x, y = make_classification(steps * config["batch"], 64, 4, seed=3)
    model = ctx.prepare_model(make_mlp(64, config.get("hidden", 256), 4, depth=2, seed=3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for batch in ctx.epoch(0, len(x)):
        t0 = time.perf_counter()
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - t0)
    with open(f"{config['out']}.rank{ctx.rank}", "w") as f:
        json.dump({"times": times}, f)
