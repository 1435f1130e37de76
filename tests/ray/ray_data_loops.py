"""Training loops for the Ray Data tests (importable by Ray workers via PYTHONPATH)."""

import json

import torch
import torch.nn.functional as F

from pdml_ray.train import get_context
from pdml_ray.train.workloads import make_mlp


def ray_data_loop(config):
    """Two epochs of ctx.iter_torch_batches("train") with prefetching and a checkpoint every 4 steps
    (model, optimizer, pdml-ray's state); on its first start rank 1 dies at step ``crash_at``, and the
    group restarts from the latest checkpoint. Rank 0 appends one JSON line per step: this start's first
    step, the step, the epoch, and every rank's row ids (from the dataset's own column), batch sizes in
    force and input dtype. At the end each rank writes the decisions it adopted."""
    import os
    import tempfile

    import ray.train
    import torch.distributed as dist

    torch.set_num_threads(1)
    ctx = get_context()
    marker = config["out"] + ".crashed"
    model = ctx.prepare_model(make_mlp(16, 64, 2, depth=1, seed=9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
    start = ctx.global_step
    for epoch in range(ctx.start_epoch, 2):
        for batch in ctx.iter_torch_batches("train", epoch=epoch, prefetch_batches=2):
            with ctx.step() as step:
                step.loss(F.cross_entropy(model(batch["x"]), batch["y"], reduction="none")).backward()
            optimizer.step()
            optimizer.zero_grad()
            ranks = [None] * ctx.world_size
            dist.all_gather_object(ranks, {"ids": batch["id"].tolist(), "sizes": list(ctx.decision.batch_sizes),
                                           "dtype": str(batch["x"].dtype)})
            if ctx.rank == 0:
                with open(config["out"], "a") as f:
                    f.write(json.dumps({"start": start, "step": ctx.global_step - 1, "epoch": epoch,
                                        "ids": [r["ids"] for r in ranks], "sizes": ranks[0]["sizes"],
                                        "rank_sizes": [r["sizes"] for r in ranks],
                                        "dtypes": [r["dtype"] for r in ranks]}) + "\n")
            if ctx.global_step == config["crash_at"] and ctx.rank == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # a worker dies: Ray Train restarts the group from the last checkpoint
            if ctx.global_step % 4 == 0:
                with tempfile.TemporaryDirectory() as d:
                    if ctx.rank == 0:
                        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                                   os.path.join(d, "model.pt"))
                    ctx.report({"step": ctx.global_step},
                               checkpoint=ray.train.Checkpoint.from_directory(d) if ctx.rank == 0 else None)
    with open(f"{config['out']}.rank{ctx.rank}", "w") as f:
        json.dump({"adopted": ctx.adopted, "stale": ctx.stale_bundles}, f)
