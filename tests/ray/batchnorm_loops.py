"""A small ResNet-style model with BatchNorm on generated images, for tests/ray/test_batchnorm_ray.py."""

import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pdml_ray.train import get_context

CLASSES = 4


def make_images(num_samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 3, 8, 8) images: one fixed random pattern per class (the same for every seed) plus noise."""
    patterns = torch.randn(CLASSES, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (num_samples,), generator=g)
    return patterns[y] + torch.randn(num_samples, 3, 8, 8, generator=g), y


class Block(nn.Module):
    """conv-BN-ReLU-conv-BN plus the identity, then ReLU (a ResNet basic block)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


def small_resnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16), Block(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))


def _train_schedule(model: nn.Module, steps: int) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # the rate decays linearly to 0: the model, and with it the running statistics, settle by the end
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)


def uniform_ddp_reference(steps: int, batch: int, seed: int) -> dict:
    """``batchnorm_loop`` under uniform shares, two DDP replicas computed in this process: each step's
    global batch (the epoch's permutation seeded by (seed, 0), cut in steps) splits into halves, rank
    0's first; each half normalises with its own batch statistics, the gradients are the halves'
    mean, and the running statistics are rank 0's (DDP broadcasts rank 0's buffers before every
    forward, so rank 1's updates never last)."""
    torch.set_num_threads(1)
    x, y = make_images(steps * batch, seed=1)
    x_test, y_test = make_images(512, seed=2)
    model = small_resnet()
    optimizer, schedule = _train_schedule(model, steps)
    perm = np.random.default_rng([seed, 0]).permutation(len(x))
    for s in range(steps):
        rows = perm[s * batch:(s + 1) * batch]
        (F.cross_entropy(model(x[rows[:batch // 2]]), y[rows[:batch // 2]]) / 2).backward()
        rank0 = {k: v.clone() for k, v in model.named_buffers()}
        (F.cross_entropy(model(x[rows[batch // 2:]]), y[rows[batch // 2:]]) / 2).backward()
        for k, v in model.named_buffers():
            v.copy_(rank0[k])
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    model.eval()
    with torch.no_grad():
        return {"accuracy": float((model(x_test).argmax(dim=1) == y_test).float().mean())}


def batchnorm_loop(config):
    """Train for ``steps`` steps; rank 0 writes each step's batch sizes and the held-out accuracy (eval
    mode: the running statistics, which DDP broadcasts from rank 0)."""
    torch.set_num_threads(1)
    ctx = get_context()
    x, y = make_images(config["steps"] * ctx.config.node.batch, seed=1)
    x_test, y_test = make_images(512, seed=2)
    model = ctx.prepare_model(small_resnet())
    optimizer, schedule = _train_schedule(model, config["steps"])
    sizes = []
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.cross_entropy(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
        sizes.append(list(ctx.decision.batch_sizes))
    model.eval()
    with torch.no_grad():
        accuracy = float((model.module(x_test).argmax(dim=1) == y_test).float().mean())
    if ctx.rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"sizes": sizes, "accuracy": accuracy}, f)
