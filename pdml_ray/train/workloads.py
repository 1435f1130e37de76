"""Small real workloads on generated data (no downloads), shared by the demo, benchmarks and tests."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from pdml_ray.train.installed_context import get_context


def make_classification(num_samples: int, dim: int, num_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian inputs (N, dim) labelled by a fixed random two-layer teacher: learnable, not trivial."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, dim, generator=g)
    teacher = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.Tanh(), torch.nn.Linear(64, num_classes))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        y = teacher(x).argmax(dim=1)
    return x, y


def make_mlp(dim: int, hidden: int, num_classes: int, depth: int, seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    width = dim
    for _ in range(depth):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    layers.append(torch.nn.Linear(width, num_classes))
    return torch.nn.Sequential(*layers)


def wrap(model: torch.nn.Module, sync: str, device: torch.device) -> torch.nn.Module:
    """The model as a user of ``sync`` would hand it over: plain, DDP-wrapped, or sharded by FSDP2."""
    if sync == "ddp":
        model = model.to(device)
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if sync == "fsdp":
        from torch.distributed.fsdp import fully_shard

        model = model.to(device)
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return model
    return model


def classification_loop(config: dict) -> None:
    """The standard pdml-ray training loop on a generated classification task.

    config: num_samples, dim, hidden, depth, num_classes, epochs, lr, seed, progress_every (0 = quiet),
    measure_comm (bool), sync ('ddp' a DDP-wrapped model, the default; 'fsdp' FSDP2 fully_shard).
    Rank 0 prints progress; ``measure_comm`` records the all-reduce time alone.
    """
    torch.set_num_threads(config.get("threads", 1))
    ctx = get_context()
    x, y = make_classification(config["num_samples"], config["dim"], config["num_classes"], config["seed"])
    x, y = x.to(ctx.device), y.to(ctx.device)
    model = ctx.prepare_model(wrap(make_mlp(config["dim"], config["hidden"], config["num_classes"], config["depth"],
                                            config["seed"]), config.get("sync", "ddp"), ctx.device))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    every = config.get("progress_every", 0)
    label = config.get("label", "")
    steps_total = config["epochs"] * -(-config["num_samples"] // ctx.config.node.batch)
    t_start = time.perf_counter()
    for epoch in range(config["epochs"]):
        for batch in ctx.epoch(epoch, len(x)):
            idx = torch.as_tensor(batch.indices, device=ctx.device)
            xb, yb = x[idx], y[idx]
            with ctx.step(batch) as step:
                step.loss(F.cross_entropy(model(xb), yb, reduction="none")).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if every and ctx.rank == 0 and (batch.step + 1) % every == 0:
                elapsed = time.perf_counter() - t_start
                print(f"[{label}] step {batch.step + 1}/{steps_total}  {elapsed:6.1f}s  "
                      f"batch sizes {list(ctx.decision.batch_sizes)}  (decision v{ctx.decision.version})", flush=True)
    if config.get("measure_comm"):
        comm_s = ctx.measure_comm_s()
        if ctx.rank == 0:
            ctx.record_measurement("comm_s", comm_s)
