"""Training loops for the Ray Data tests (importable by Ray workers via PYTHONPATH)."""

import json

import torch
import torch.nn.functional as F

from pdml_ray.train import get_context
from pdml_ray.train.workloads import make_mlp


def ray_data_loop(config):
    """Two epochs of ctx.iter_torch_batches("train") with prefetching; each rank writes the row ids it
    trained per step (they come back in the batches, from the dataset's own column)."""
    torch.set_num_threads(1)
    ctx = get_context()
    # wide enough that a step's compute (several ms) stands above a loaded machine's timing jitter
    model = ctx.prepare_model(make_mlp(16, 1024, 2, depth=2, seed=9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for epoch in range(2):
        for batch in ctx.iter_torch_batches("train", epoch=epoch, prefetch_batches=config["prefetch"]):
            with ctx.step() as step:
                step.loss(F.cross_entropy(model(batch["x"]), batch["y"], reduction="none")).backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append({"epoch": epoch, "ids": batch["id"].tolist(), "sizes": list(ctx.decision.batch_sizes),
                          "dtype": str(batch["x"].dtype)})
    with open(f"{config['out']}.rank{ctx.rank}", "w") as f:
        json.dump({"steps": steps, "adopted": ctx.adopted, "stale": ctx.stale_bundles}, f)
