"""Ray Train loops of the P3 all-reduce tests (importable by the workers through PYTHONPATH)."""

import json

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pdml_ray.config import P3Config
from pdml_ray.train import get_context
from pdml_ray.train.p3_sync import P3AllReduce, prepare
from pdml_ray.train.workloads import make_classification

STEPS = 24
GLOBAL_BATCH = 128


def uneven_mlp() -> torch.nn.Module:
    """Layers of 1k, 33k, 263k and 4k parameters: the third dominates the communication."""
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)


def p3_loop(config):
    """Three copies of one model on the same global batches: P3 order (through ctx, EMULATED link),
    then FIFO order (driven by hand, no emulation) and, on rank 0, single-process training."""
    torch.set_num_threads(1)
    ctx = get_context()
    x, y = make_classification(STEPS * GLOBAL_BATCH, 16, 8, seed=2)
    base = uneven_mlp()
    model, p3 = prepare(ctx, base, make_optimizer(base), record_timeline=True)
    fifo_model = uneven_mlp()
    fifo = P3AllReduce(fifo_model, make_optimizer(fifo_model), P3Config(policy="fifo", slice_elements=20_000))
    bucketed_model = uneven_mlp()  # DDP-like buckets: 2 x 20k-element slices each, some across layers
    bucketed = P3AllReduce(bucketed_model, make_optimizer(bucketed_model),
                           P3Config(policy="bucketed", slice_elements=20_000, bucket_bytes=160_000))
    mine, weights = [], []
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        mine.append(batch.indices)
        weights.append(batch.grad_weight)
    p3.finish()
    # FIFO and bucketed orders on the same batches and weights, afterwards (inside the loop they would
    # crowd P3's timeline)
    for sync, other in ((fifo, fifo_model), (bucketed, bucketed_model)):
        for indices, weight in zip(mine, weights):
            sync.begin(weight)
            F.cross_entropy(other(x[indices]), y[indices]).backward()
            sync.end_backward()
        sync.finish()
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)  # once at the end: a collective per step would sync the ranks
    batches = [np.concatenate([e[k] for e in everyone]) for k in range(len(mine))]
    sizes = [[len(e[k]) for e in everyone] for k in range(len(mine))]
    if ctx.rank != 0:
        return
    reference = uneven_mlp()
    optimizer = make_optimizer(reference)
    for idx in batches:
        optimizer.zero_grad()
        F.cross_entropy(reference(x[idx]), y[idx]).backward()
        optimizer.step()

    def max_diff(a, b):
        return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))

    # what `pdml-ray status --json` shows of the run's p3 axis (the scheduler's stats record, rendered)
    from pdml_ray.cli.status import render

    status = json.loads(render({"p3-test": ctx.client.call("stats")}, as_json=True))
    steps = {}
    for kind, step, index, t in p3.timeline:
        steps.setdefault(step, {"forward0": None, "last_done": 0.0, "layer0_done": 0.0})
        if kind == "forward" and index == 0 and steps[step]["forward0"] is None:
            steps[step]["forward0"] = t
        if kind == "done":
            steps[step]["last_done"] = max(steps[step]["last_done"], t)
            if p3.plan.slices[index].layer == 0:
                steps[step]["layer0_done"] = max(steps[step]["layer0_done"], t)
    with open(config["out"], "w") as f:
        json.dump({"p3_vs_reference": max_diff(model, reference), "fifo_vs_reference": max_diff(fifo_model, reference),
                   "bucketed_vs_reference": max_diff(bucketed_model, reference),
                   "p3_vs_fifo": max_diff(model, fifo_model), "sizes": sizes, "steps": steps,
                   "order": list(p3.issue_plan.order), "policy": p3.issue_plan.policy,
                   "slice_layers": [s.layer for s in p3.plan.slices], "combiner": ctx._combiner.name,
                   "status_p3": status["schedulers"]["p3-test"]["derivers"]["p3"], "decision": p3.decision.to_dict(),
                   "slice_elements": p3.plan.slice_elements, "credit_bytes": p3.credit_bytes,
                   "versions": dict(ctx.versions)}, f)
