"""Training loops run by Ray Train workers in the Ray tests (importable there via PYTHONPATH)."""

import json

import numpy as np
import ray
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pdml_ray.train import get_context
from pdml_ray.train.workloads import make_classification, make_mlp

STEPS = 44
KILL_AT = 30


def checking_loop(config):
    torch.set_num_threads(1)
    ctx = get_context()
    x, y = make_classification(STEPS * 512, 64, 4, seed=1)
    hidden = config.get("hidden", 2048)
    model = ctx.prepare_model(make_mlp(64, hidden, 4, depth=2, seed=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    reference = make_mlp(64, hidden, 4, depth=2, seed=1)
    grad_checks, sizes_seen, steps_done, history = [], [], 0, []
    kill_at = config.get("kill_at", KILL_AT)
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        sizes_seen.append(list(ctx.decision.batch_sizes))
        if batch.step % 4 == 1:
            # the whole global batch, gathered from every rank, through one process's model copy
            everyone = [None] * ctx.world_size
            dist.all_gather_object(everyone, batch.indices)
            if ctx.rank == 0:
                reference.load_state_dict(model.module.state_dict())  # DDP keeps the user module in .module
                reference.zero_grad()
                idx = np.concatenate(everyone)
                F.cross_entropy(reference(x[idx]), y[idx]).backward()
                diff = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
                grad_checks.append({"step": batch.step, "sizes": [len(e) for e in everyone], "max_abs_diff": diff})
        optimizer.step()
        optimizer.zero_grad()
        steps_done += 1
        if batch.step == kill_at and ctx.rank == 0:
            history = ctx.client.call("decision_history")  # the scheduler's record, before it dies
            ray.kill(ray.get_actor(ctx.config.scheduler_name, namespace=ctx.config.namespace), no_restart=True)
    if ctx.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"grad_checks": grad_checks, "sizes": sizes_seen, "steps_done": steps_done,
                       "history": history,
                       "adopted": ctx.adopted, "client_failures": ctx.client.failures}, f)


def first_step_loop(config):
    """One step; each rank writes its accelerator type and the batch sizes it ran with."""
    ctx = get_context()
    x, y = make_classification(config["num_samples"], 16, 2, seed=0)
    model = ctx.prepare_model(make_mlp(16, 32, 2, depth=1, seed=0))
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        with open(f"{config['out']}.{ctx.rank}", "w") as f:
            json.dump({"accelerator_type": ctx.accelerator_type, "batch_sizes": list(ctx.decision.batch_sizes),
                       "mine": len(batch.indices)}, f)
        break


def sampling_loop(config):
    """Priority-sampled training; a known subset has flipped labels (persistently high loss).
    Each rank writes the indices it drew and its batch sizes; rank 0 saves the scheduler state. With
    ``rho``, the loop cross-fits the irreducible-loss models and sends their losses; with ``report``,
    each epoch ends in a Ray Train checkpoint (ctx.report), which a rerun resumes from."""
    import os
    import tempfile

    import ray.train

    torch.set_num_threads(1)
    ctx = get_context()
    n, hard = config["num_samples"], config["hard"]
    x, y = make_classification(n, 16, 2, seed=3)
    y = y.clone()
    y[:hard] = 1 - y[:hard]  # samples [0, hard) are mislabelled: the model keeps getting them wrong
    if config.get("rho"):  # rho-loss: each half scored by a model trained on the other, as a user's loop does
        from pdml_ray.train import fit_crossfit_irreducible_losses

        il = fit_crossfit_irreducible_losses(lambda: make_mlp(16, 32, 2, depth=1, seed=4),
                                             lambda out, t: F.cross_entropy(out, t, reduction="none"), (x, y),
                                             folds=2, steps=200, lr=1e-2, batch_size=64, seed=5)
        ctx.set_irreducible_losses(il.losses)
    model = make_mlp(16, 64, 2, depth=1, seed=3)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            model.load_state_dict(torch.load(os.path.join(d, "model.pt")))
    model = ctx.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    drawn, sizes, weights_seen, first_step = [], [], [], ctx.global_step
    for epoch in range(ctx.start_epoch, config["epochs"]):
        for batch in ctx.epoch(epoch, n):
            idx = torch.as_tensor(batch.indices)
            with ctx.step(batch) as step:
                step.loss(F.cross_entropy(model(x[idx]), y[idx], reduction="none")).backward()
            optimizer.step()
            optimizer.zero_grad()
            drawn.append(batch.indices.tolist())
            sizes.append(list(ctx.decision.batch_sizes))
            weights_seen.append(float(batch.sample_weights.min()) if batch.sample_weights is not None else None)
        if config.get("report"):
            with tempfile.TemporaryDirectory() as d:
                torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
                ctx.report({"epoch": epoch}, checkpoint=ray.train.Checkpoint.from_directory(d) if ctx.rank == 0 else None)
    saved = ctx.save_scheduler_state(config["checkpoint_dir"])
    with open(f"{config['out']}.{ctx.rank}", "w") as f:
        json.dump({"drawn": drawn, "sizes": sizes, "weights_min": weights_seen, "saved": saved,
                   "first_step": first_step}, f)


def wrapped_loop(config):
    """A model the user wrapped (DDP, or FSDP2's fully_shard) under unequal batch sizes; each step rank 0
    compares the combined gradient with the same global batch's gradient in one process."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False  # on a GPU: full float32, so 1e-5 is meaningful
    torch.backends.cudnn.allow_tf32 = False
    ctx = get_context()
    dev = ctx.device
    steps = config["steps"]
    x, y = make_classification(steps * 256, 32, 4, seed=2)
    x, y = x.to(dev), y.to(dev)
    model = make_mlp(32, 64, 4, depth=2, seed=2).to(dev)  # the same start on every rank
    reference = make_mlp(32, 64, 4, depth=2, seed=2).to(dev)
    if config["sync"] == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    else:
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    model = ctx.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    checks = []
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            idx = torch.as_tensor(batch.indices, device=dev)
            step.loss(F.cross_entropy(model(x[idx]), y[idx], reduction="none")).backward()
        everyone = [None] * ctx.world_size
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
            diff = max((g - q.grad).abs().max().item() for g, q in zip(grads, reference.parameters()))
            checks.append({"step": batch.step, "sizes": [len(e) for e in everyone], "max_abs_diff": diff})
        optimizer.step()
        optimizer.zero_grad()
    if ctx.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"checks": checks, "has_module": hasattr(model, "module") or config["sync"] == "fsdp",
                       "device": str(dev), "world_size": ctx.world_size}, f)


def plain_loop(config):
    """A loop that never goes through the context: it trains (here: does nothing) without pdml-ray."""
    get_context()


def short_loop(config):
    """A few real steps; rank 0 writes the scheduler name it reported to and the steps it ran."""
    torch.set_num_threads(1)
    ctx = get_context()
    x, y = make_classification(config["steps"] * 64, 16, 2, seed=5)
    model = ctx.prepare_model(make_mlp(16, 32, 2, depth=1, seed=5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        optimizer.step()
        optimizer.zero_grad()
    if ctx.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"scheduler": ctx.config.scheduler_name, "steps": ctx.global_step}, f)


def resumable_loop(config):
    """``config["epochs"]`` epochs through ``ctx.epoch`` or, with ``sampler``, a DataLoader over
    ``ctx.batch_sampler``; a checkpoint every 4 steps (ctx.report). With ``crash_at``, rank 1 dies once at
    that step. Every rank appends (attempt, step, epoch, indices) to its own log; rank 0 writes the final
    parameters, and the number of copies of one print that reached its stdout and stderr files."""
    import os
    import sys
    import tempfile

    import ray.train
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    ctx = get_context()
    n, out = config["num_samples"], config["out"]
    if ctx.rank == 0:
        marker = f"pdml-print-marker-{os.getpid()}-{ctx.global_step}"
        print(marker, flush=True)
        sys.stderr.flush()
        sinks = [os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)]
        copies = sum(open(s, errors="replace").read().count(marker) for s in sinks if os.path.isfile(s))
        with open(out + ".prints", "a") as f:
            f.write(json.dumps({"sinks": sinks, "copies": copies}) + "\n")
    x, y = make_classification(n, 16, 3, seed=7)
    model = make_mlp(16, 64, 3, depth=1, seed=7)  # no dropout: a resumed run can match bit for bit
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # the user's own state, as in any Ray Train loop
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
    model = ctx.prepare_model(model)
    marker_file = out + ".crashed"
    attempt = 2 * config.get("run", 0) + int(os.path.exists(marker_file))  # which fit(), restarted or not
    data = TensorDataset(torch.arange(n))
    with open(f"{out}.rank{ctx.rank}", "a") as log:
        for epoch in range(ctx.start_epoch, config["epochs"]):
            if config["sampler"]:
                batches = ((ctx.step(), ids.numpy()) for (ids,) in DataLoader(data, batch_sampler=ctx.batch_sampler(epoch, n)))
            else:
                batches = ((ctx.step(b), b.indices) for b in ctx.epoch(epoch, n))
            for scope, indices in batches:
                step_number = ctx.global_step
                with scope as step:
                    loss = step.loss(F.cross_entropy(model(x[indices]), y[indices], reduction="none"))
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                log.write(json.dumps({"attempt": attempt, "step": step_number, "epoch": epoch,
                                      "indices": [int(i) for i in indices]}) + "\n")
                log.flush()
                if step_number == config.get("crash_at") and ctx.rank == 1 and not os.path.exists(marker_file):
                    open(marker_file, "w").close()
                    os._exit(1)  # a worker dies: Ray Train restarts the group from the last checkpoint
                if (step_number + 1) % 4 == 0:
                    with tempfile.TemporaryDirectory() as d:
                        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                                   os.path.join(d, "model.pt"))
                        ctx.report({"step": step_number}, checkpoint=ray.train.Checkpoint.from_directory(d))
    if ctx.rank == 0:
        params = torch.cat([p.detach().flatten() for p in model.module.parameters()])
        with open(out + ".params", "w") as f:
            json.dump({"params": params.tolist(), "attempt": attempt}, f)


def dataloader_loop(config):
    """Two epochs through a DataLoader with 2 worker processes over ctx.batch_sampler; each rank writes
    the sample ids it trained per step (they come back from the loader, not from the context)."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    ctx = get_context()
    n = config["num_samples"]
    x, y = make_classification(n, 16, 2, seed=9)
    data = TensorDataset(x, y, torch.arange(n))
    # wide enough that a step's compute (several ms) stands above a loaded machine's timing jitter,
    # so the emulated 2.5x speed gap passes the noise gate within the run
    model = ctx.prepare_model(make_mlp(16, 1024, 2, depth=2, seed=9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for epoch in range(2):
        loader = DataLoader(data, batch_sampler=ctx.batch_sampler(epoch, n), num_workers=2, prefetch_factor=2)
        for xb, yb, ids in loader:
            with ctx.step() as step:
                step.loss(F.cross_entropy(model(xb), yb, reduction="none")).backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append({"epoch": epoch, "ids": ids.tolist(), "sizes": list(ctx.decision.batch_sizes)})
    with open(f"{config['out']}.rank{ctx.rank}", "w") as f:
        json.dump({"steps": steps, "adopted": ctx.adopted, "stale": ctx.stale_bundles}, f)


def buffers_loop(config):
    """A model with BatchNorm wrapped by prepare_model (DDP); rank 0 writes each rank's running statistics
    as each forward reaches BatchNorm (after DDP's broadcast: then they must agree)."""
    torch.set_num_threads(1)
    ctx = get_context()
    x, y = make_classification(12 * 128, 16, 2, seed=4)
    torch.manual_seed(4)
    model = ctx.prepare_model(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                                  torch.nn.ReLU(), torch.nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    starts = []
    # DDP broadcasts rank 0's buffers at the start of each forward: look just before BatchNorm runs
    model.module[1].register_forward_pre_hook(lambda m, args: starts.append(m.running_mean.tolist()))
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        optimizer.step()
        optimizer.zero_grad()
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, starts)
    if ctx.rank == 0:
        with open(config["out"], "w") as f:
            json.dump(everyone, f)
