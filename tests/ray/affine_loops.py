"""Training loops for the affine step-time Ray test (importable by Ray workers via PYTHONPATH)."""

import json
import time

import torch
import torch.nn.functional as F

from pdml_ray.train import get_context
from pdml_ray.train.workloads import make_classification, make_mlp

FIXED_S = 0.02
"""A fixed cost per step (seconds), slept inside the timed step: it does not grow with the batch."""
PER_SAMPLE_S = 0.00025
"""A per-sample cost (seconds), also slept. On 2 shared cores a worker's real compute rate depends on
what the other worker computes beside it, which no per-worker model predicts; sleeping keeps the cost
model t = c + b / r the test's own while the model, gradients and all-reduce stay real."""


def fixed_cost_loop(config):
    """A small MLP whose every step also costs FIXED_S + PER_SAMPLE_S per sample; rank 0 writes the
    batch sizes each step ran with."""
    torch.set_num_threads(1)
    ctx = get_context()
    steps, batch = config["steps"], config["global_batch"]
    x, y = make_classification(steps * batch, 32, 4, seed=2)
    model = ctx.prepare_model(make_mlp(32, config["hidden"], 4, depth=2, seed=2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sizes = []
    for b in ctx.epoch(0, len(x)):
        with ctx.step(b) as step:
            # the emulated slowdown stretches these too: a slow worker pays the fixed cost 1/speed times
            time.sleep(FIXED_S + PER_SAMPLE_S * len(b.indices))
            step.loss(F.cross_entropy(model(x[b.indices]), y[b.indices], reduction="none")).backward()
        optimizer.step()
        optimizer.zero_grad()
        sizes.append(list(ctx.decision.batch_sizes))
    if ctx.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"sizes": sizes}, f)
