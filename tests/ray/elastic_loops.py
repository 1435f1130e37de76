"""The training loop of the elastic Ray test (importable by Ray workers via PYTHONPATH)."""

import json
import os
import tempfile
import time
import uuid

import ray.train
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pdml_ray.train import get_context
from pdml_ray.train.workloads import make_classification, make_mlp


def elastic_loop(config):
    """Two epochs through ctx.epoch with a checkpoint every 4 steps (model, optimizer, pdml-ray's state),
    resuming from the latest; rank 0 appends one JSON line per step: this start's id, worker count, first
    step and accelerator types, the step, its epoch, the sizes in force and every rank's sample ids.
    Each step sleeps ``pace_s`` after the update (not compute) so that the driver's resizes land mid-run."""
    torch.set_num_threads(1)
    ctx = get_context()
    n = config["num_samples"]
    x, y = make_classification(n, 16, 2, seed=5)
    model = ctx.prepare_model(make_mlp(16, 32, 2, depth=1, seed=5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
    types = [None] * ctx.world_size
    dist.all_gather_object(types, ctx.accelerator_type)
    start, attempt = ctx.global_step, uuid.uuid4().hex
    for epoch in range(ctx.start_epoch, 2):
        for batch in ctx.epoch(epoch, n):
            with ctx.step(batch) as step:
                step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
            optimizer.step()
            optimizer.zero_grad()
            ids = [None] * ctx.world_size
            dist.all_gather_object(ids, batch.indices.tolist())
            if ctx.rank == 0:
                with open(config["out"], "a") as f:
                    f.write(json.dumps({"attempt": attempt, "world": ctx.world_size, "start": start, "types": types,
                                        "step": batch.step, "epoch": epoch, "sizes": list(ctx.decision.batch_sizes),
                                        "ids": ids}) + "\n")
            if ctx.global_step % 4 == 0:
                with tempfile.TemporaryDirectory() as d:
                    if ctx.rank == 0:
                        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                                   os.path.join(d, "model.pt"))
                    ctx.report({"step": ctx.global_step},
                               checkpoint=ray.train.Checkpoint.from_directory(d) if ctx.rank == 0 else None)
            time.sleep(config["pace_s"])
