"""Train a small GPT (causal transformer blocks) on random tokens through a DataLoader, with node
priorities: a real architecture, DDP, a DataLoader with worker processes, checkpoints via ctx.report.

Locally (CPU, small):  python examples/train_gpt.py --speeds 1,0.4
On a GPU cluster:      ray job submit --working-dir . -- python examples/train_gpt.py --workers 16 --gpu \\
                           --layers 12 --width 768 --seq 1024 --global-batch 512

The tokens are random (no download): the loss goes to the entropy of the vocabulary, ln(vocab); the
point is the training path, not the model's quality. With --speeds the speed differences are
EMULATED (a worker at speed s sleeps (1/s - 1) x its compute time); the training itself is real.

With --data ray the same tokens come from a Ray Dataset (``PDMLTrainer(datasets=...)``,
``ctx.iter_torch_batches``) instead of the DataLoader. Each epoch's metrics say what the input costs:
``ingest_ms``, the time the loop waited for its next batch per step, against ``step_ms`` (each epoch's
first step left out: it pays the loader's start-up). ``examples/ray_data_ingest.py`` compares the two.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import ray
import ray.data
import ray.train
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from pdml_ray import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer, get_context


class RandomTokens(Dataset):
    """``size`` sequences of ``seq + 1`` random token ids, the same on every rank (seeded by index)."""

    def __init__(self, size: int, seq: int, vocab: int) -> None:
        self.size, self.seq, self.vocab = size, seq, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (self.seq + 1,), generator=torch.Generator().manual_seed(i))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq, width))
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.blocks(h, mask=self.causal[: tokens.shape[1], : tokens.shape[1]], is_causal=True))


def epoch_batches(ctx: Any, data: RandomTokens, epoch: int, source: str) -> Iterable[torch.Tensor]:
    """This epoch's token batches (b_i, seq + 1) at this worker's batch size: Ray Data or a DataLoader."""
    if source == "ray":
        return (batch["tokens"] for batch in ctx.iter_torch_batches("train", epoch=epoch))
    return DataLoader(data, batch_sampler=ctx.batch_sampler(epoch, len(data)), num_workers=2, prefetch_factor=2,
                      pin_memory=ctx.device.type == "cuda")


def timed(batches: Iterable[torch.Tensor], clock: dict[str, float]) -> Iterator[torch.Tensor]:
    """The batches; ``clock`` gets the seconds the loop waited for them (``wait_s``), the steps counted and
    the span from the first batch to the last step's end (``span_s``), the first batch left out."""
    it, t_first = iter(batches), None
    while True:
        t0 = time.perf_counter()
        batch = next(it, None)
        if t_first is None:
            t_first = time.perf_counter()
        else:
            clock["span_s"] = t0 - t_first
            if batch is not None:
                clock["wait_s"] += time.perf_counter() - t0
                clock["steps"] += 1
        if batch is None:
            return
        yield batch


def train_loop(config: dict) -> None:
    ctx = get_context()
    torch.set_num_threads(config["threads"])
    data = RandomTokens(config["samples"], config["seq"], config["vocab"])
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GPT(config["vocab"], config["seq"], config["width"], config["layers"], config["heads"]).to(ctx.device)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    model = ctx.prepare_model(nn.parallel.DistributedDataParallel(model, device_ids=device_ids))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"), map_location=ctx.device)
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
    for epoch in range(ctx.start_epoch, config["epochs"]):
        clock = {"wait_s": 0.0, "steps": 0, "span_s": 0.0}
        for tokens in timed(epoch_batches(ctx, data, epoch, config["data"]), clock):
            tokens = tokens.to(ctx.device, non_blocking=True)
            with ctx.step() as step:
                logits = model(tokens[:, :-1])  # (b, T, vocab)
                per_token = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # (b, T)
                step.loss(per_token).backward()  # reduced per sequence, then over the global batch
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if ctx.rank == 0 and ctx.global_step % config["log_every"] == 0:
                print(f"step {ctx.global_step}  loss {per_token.mean().item():.3f} (ln vocab "
                      f"{math.log(config['vocab']):.3f})  batch sizes {list(ctx.decision.batch_sizes)}", flush=True)
        with tempfile.TemporaryDirectory() as d:  # end of epoch: model, optimizer and pdml-ray's state
            if ctx.rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                           os.path.join(d, "model.pt"))
            steps = max(clock["steps"], 1)
            ctx.report({"epoch": epoch, "loss": per_token.mean().item(), "ingest_ms": 1e3 * clock["wait_s"] / steps,
                        "step_ms": 1e3 * clock["span_s"] / steps},
                       checkpoint=ray.train.Checkpoint.from_directory(d) if ctx.rank == 0 else None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="one GPU per worker (NCCL)")
    p.add_argument("--speeds", default=None, help="EMULATED speeds per worker on CPU machines, e.g. 1,0.4")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=40, help="steps per epoch")
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--name", default=None, help="run name; an existing run of that name (in --storage) continues "
                                                "from its last checkpoint, e.g. --epochs 1 then --epochs 2 trains "
                                                "the second epoch (default: a new name per invocation)")
    p.add_argument("--storage", default=None, help="Ray Train storage_path (default ~/ray_results)")
    p.add_argument("--data", choices=("dataloader", "ray"), default="dataloader",
                   help="the input: a DataLoader over ctx.batch_sampler, or a Ray Dataset through ctx.iter_torch_batches")
    p.add_argument("--cpus-per-worker", type=float, default=None,
                   help="CPUs each train worker reserves (Ray Train's default: 1); below 1 on a small machine "
                        "leaves Ray Data some")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> Any:
    """One PDMLTrainer run of the GPT (Ray already initialised); Ray Train's Result."""
    speeds = [float(s) for s in args.speeds.split(",")] if args.speeds else None
    workers = len(speeds) if speeds else args.workers
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=args.global_batch, emulated_speeds=speeds))
    samples = args.steps * args.global_batch
    datasets = None
    if args.data == "ray":  # row i holds the DataLoader path's sample i, made by Ray Data's tasks
        data = RandomTokens(samples, args.seq, args.vocab)
        datasets = {"train": ray.data.range(samples).map_batches(
            lambda rows: {"tokens": np.stack([data[int(i)].numpy() for i in rows["id"]])})}
    result = PDMLTrainer(
        train_loop,
        train_loop_config={"samples": samples, "seq": args.seq, "vocab": args.vocab, "data": args.data,
                           "width": args.width, "layers": args.layers, "heads": args.heads, "epochs": args.epochs,
                           "threads": 1 if not args.gpu else 4, "log_every": 5},
        datasets=datasets,
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers, use_gpu=args.gpu,
            resources_per_worker=None if args.cpus_per_worker is None else {"CPU": args.cpus_per_worker}),
        run_config=ray.train.RunConfig(name=args.name or time.strftime("pdml-gpt-%Y%m%d-%H%M%S"),
                                       storage_path=args.storage),
        pdml_config=config,
    ).fit()
    if config.node_priority.emulation:
        print(config.node_priority.emulation)
    return result


def main() -> None:
    args = parse_args()
    ray.init()  # under `ray job submit` this joins the cluster; locally it starts one
    result = run(args)
    mine = {k: v for k, v in result.metrics.items() if not k.startswith("pdml/")}
    print(f"pdml figures in Result.metrics: {sorted(k for k in result.metrics if k.startswith('pdml/'))}")
    print(f"metrics {mine}; {result.pdml}")


if __name__ == "__main__":
    main()
