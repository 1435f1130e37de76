"""Runtime 1: P3 as published, over parameter-server shards on Ray actors.

    ps = P3ParameterServer(num_workers=2, num_shards=2)
    result = ps.run(model, loss_fn, x, y, batch_sizes=(20, 12), steps=10, sgd=SGDSettings(lr=0.05),
                    config=P3Config(policy="p3", slice_elements=40_000, emulated_bandwidth_gbps=1.0))
    result.parameters        # the shards' parameters after the last step (one flat vector)

Each step k, worker w trains on rows ``[k B + offset_w, k B + offset_w + b_w)`` of (x, y) (the global
batch k cut into the workers' shares) with gradient weight ``b_w / B``, so the sum the shards apply
is the mean gradient of the global batch: the parameters equal single-process SGD's on the same
global batches whatever the send order (``tests/ray/test_p3_ps_ray.py``).

- Shards (``pdml_ray.actors.p3_ps.P3ShardActor``) hold the slices round-robin
  (``pdml_ray.p3.shard.shard_of``), apply SGD per slice as soon as every worker pushed it, and answer
  each push with the updated values.
- Workers (the straggler runtime's ``GradientWorkerHost`` actor shell hosting ``RayP3PSWorker``, a
  ``pdml_ray.p3.ps.P3PSWorker``) push slices from parameter hooks
  during backward, in send-queue order (``p3`` / ``fifo`` / ``bucketed``), through an EMULATED link
  (``P3Config.emulated_bandwidth_gbps``: each message waits until it would have arrived, both ways);
  the next forward waits per layer (forward pre-hooks) for that layer's updated slices only.
- The data set and initial parameters are published once with ``ray.put`` (the straggler runtime's
  convention); results come back as object refs, gathered with one ``ray.get``.

Reuse of the straggler-tolerant runtime: its worker actor itself (``GradientWorkerHost`` via
``launch_gradient_worker``, configured with ``worker_cls=RayP3PSWorker``; ``call`` / ``call_fn`` run the
worker's methods), its conventions (``DEFAULT_GRADIENT_WORKER_NUM_CPUS``, ``gradient_worker_name``, ``configure``
to reuse actors across runs) and object-store publishing.
``P3Config.credit_bytes`` (default four slices) is the ``p3`` policy's window per EMULATED link
(``pdml_ray.p3.ps``: it hides the runtime's per-message cost behind the message ahead). Not modelled:
the shards' own NIC (each worker's link is the bottleneck), ``P3Config.auto``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch
from torch import Tensor, nn

from pdml_ray.actors.gradient_worker import DEFAULT_GRADIENT_WORKER_NUM_CPUS
from pdml_ray.actors.p3_ps import RayP3PSWorker, launch_p3_shard, launch_p3_worker
from pdml_ray.config.p3 import P3Config
from pdml_ray.errors import ConfigError, UsageError
from pdml_ray.p3.link import LinkModel
from pdml_ray.p3.ps import LossFn, WorkerRun, layer_plan, measure_compute, model_layers
from pdml_ray.p3.shard import SGDSettings
from pdml_ray.p3.slicing import flatten_layer, reassemble

WARMUP_STEPS = 2  # steps left out of the iteration time (one-off costs: first calls, allocations)


@dataclass(frozen=True, slots=True)
class P3PSResult:
    policy: str
    parameters: Tensor  # the shards' values after the last step, flat, in the model's parameter order
    worker_parameters: tuple[Tensor, ...]  # each replica's, after applying the last update
    runs: tuple[WorkerRun, ...]
    link: LinkModel | None

    @property
    def iteration_s(self) -> float:
        """Median steady-state iteration time: per step the slowest worker's, warm-up steps left out."""
        per_step = [max(vals) for vals in zip(*(r.iteration_s for r in self.runs))]
        return float(statistics.median(per_step[WARMUP_STEPS:] or per_step))

    @property
    def forward_wait_s(self) -> float:
        per_step = [max(vals) for vals in zip(*(r.forward_wait_s for r in self.runs))]
        return float(statistics.median(per_step[WARMUP_STEPS:] or per_step))


def global_batches(batch_sizes: Sequence[int], steps: int) -> list[list[tuple[int, int, float]]]:
    """Per worker, per step: (first row, rows, weight b_w / B) of its share of global batch k."""
    total = sum(batch_sizes)
    if total < 1 or any(b < 1 for b in batch_sizes):
        raise ConfigError(f"batch sizes must be >= 1 per worker, got {list(batch_sizes)}")
    return [[(k * total + sum(batch_sizes[:w]), b, b / total) for k in range(steps)]
            for w, b in enumerate(batch_sizes)]


def link_of(config: P3Config) -> LinkModel | None:
    bw = config.emulated_bandwidth_gbps
    return LinkModel(bw * 1e9 / 8, config.emulated_latency_us * 1e-6) if bw is not None else None


class P3ParameterServer:
    """``num_workers`` worker actors and ``num_shards`` shard actors, reused across ``run`` calls."""

    def __init__(self, num_workers: int = 2, num_shards: int = 2, *, name_prefix: str | None = None,
                 num_cpus_per_actor: float = DEFAULT_GRADIENT_WORKER_NUM_CPUS) -> None:
        if not ray.is_initialized():
            raise UsageError("P3ParameterServer needs a running Ray cluster: call ray.init() first")
        if num_workers < 1 or num_shards < 1:
            raise ConfigError(f"need >= 1 worker and >= 1 shard, got {num_workers} and {num_shards}")
        self.workers = [launch_p3_worker(i, name_prefix=name_prefix, num_cpus=num_cpus_per_actor)
                        for i in range(num_workers)]
        self.shards = [launch_p3_shard(i, name_prefix=name_prefix, num_cpus=num_cpus_per_actor)
                       for i in range(num_shards)]

    def run(self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, *, batch_sizes: Sequence[int],
            steps: int, sgd: SGDSettings, config: P3Config, timeout_s: float = 300.0,
            compute_sleep_s: list[tuple[float, float]] | None = None) -> P3PSResult:
        """``steps`` steps of ``model`` (left unchanged; every actor gets a copy) under ``config``;
        ``compute_sleep_s``: per layer (forward, backward) seconds of EMULATED compute (``P3PSWorker``)."""
        if len(batch_sizes) != len(self.workers):
            raise ConfigError(f"{len(batch_sizes)} batch sizes for {len(self.workers)} workers")
        if steps * sum(batch_sizes) > len(x):
            raise ConfigError(f"{steps} steps of {sum(batch_sizes)} samples need {steps * sum(batch_sizes)} rows, "
                              f"the data set has {len(x)}")
        plan = layer_plan(model, config.slice_elements, config.element_size)
        layers = [flatten_layer(ps) for _, _, ps in model_layers(model)]
        link = link_of(config)
        layers_ref, x_ref, y_ref = ray.put(layers), ray.put(x), ray.put(y)  # published once
        ray.get([s.configure.remote(i, len(self.shards), plan, layers_ref, len(self.workers), sgd)
                 for i, s in enumerate(self.shards)], timeout=120)
        ray.get([w.configure.remote(i, model, loss_fn, x_ref, y_ref, batches, self.shards, policy=config.policy,
                                    slice_elements=config.slice_elements, bucket_bytes=config.bucket_bytes, link=link,
                                    compute_sleep_s=compute_sleep_s, credit_bytes=config.effective_credit_bytes,
                                    transfer=config.ps_transfer, worker_cls=RayP3PSWorker)
                 for i, (w, batches) in enumerate(zip(self.workers, global_batches(batch_sizes, steps)))], timeout=120)
        outs = ray.get([w.call.remote("train_and_parameters") for w in self.workers], timeout=timeout_s)
        values: dict[int, Tensor] = {}
        for part in ray.get([s.values.remote() for s in self.shards]):
            values.update(part)
        flat = torch.cat(reassemble(plan, [values[i] for i in range(len(plan.slices))]))
        return P3PSResult(config.policy, flat, tuple(p for _, p in outs), tuple(r for r, _ in outs), link)

    def compute_s(self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, *, batch_sizes: Sequence[int],
                  steps: int) -> float:
        """Median forward + backward seconds of an iteration (the slowest worker's, all computing at
        once as in training), without communication."""
        x_ref, y_ref = ray.put(x), ray.put(y)
        times = ray.get([w.call_fn.remote(measure_compute, model, loss_fn, x_ref, y_ref, batches, num_threads=1)
                         for w, batches in zip(self.workers, global_batches(batch_sizes, steps))], timeout=300)
        per_step = [max(vals) for vals in zip(*times)]
        return float(statistics.median(per_step[WARMUP_STEPS:] or per_step))

    def shutdown(self) -> None:
        for a in self.workers + self.shards:
            ray.kill(a)
        self.workers, self.shards = [], []

    def __enter__(self) -> P3ParameterServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
