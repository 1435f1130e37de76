"""The one registry of pipeline schedules: name -> "module:Class", imported on first use.

Schedule names are written here and nowhere else: configs, the CLI and the benchmarks read them
from ``PROJECT_SCHEDULES``, ``TORCH_SCHEDULES`` and ``STATIC_SCHEDULES``. This module imports nothing at load time, so configs
can validate names against it without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Sequence

from pdml_ray.errors import ConfigError

if TYPE_CHECKING:
    from pdml_ray.pipeline.plan import PipelineSchedule

PROJECT_SCHEDULES: dict[str, str] = {
    "gpipe": "pdml_ray.pipeline.static:GPipeSchedule",
    "1f1b": "pdml_ray.pipeline.static:OneFOneBSchedule",
    "1f1b-weighted": "pdml_ray.pipeline.static:WeightedOneFOneBSchedule",
    "critical-path": "pdml_ray.pipeline.static:CriticalPathSchedule",
    "osprey": "pdml_ray.pipeline.osprey:OspreySchedule",
    "auto": "pdml_ray.pipeline.auto:AutoSchedule",
}

TORCH_SCHEDULES: dict[str, str] = {
    "torch-gpipe": "pdml_ray.pipeline.torch_orders:TorchGPipe",
    "torch-1f1b": "pdml_ray.pipeline.torch_orders:Torch1F1B",
    "torch-interleaved-1f1b": "pdml_ray.pipeline.torch_orders:TorchInterleaved1F1B",
    "torch-looped-bfs": "pdml_ray.pipeline.torch_orders:TorchLoopedBFS",
    "torch-zb": "pdml_ray.pipeline.torch_orders:TorchZeroBubble",
    "torch-interleaved-zb": "pdml_ray.pipeline.torch_orders:TorchInterleavedZeroBubble",
    "torch-interleaved-zb-3": "pdml_ray.pipeline.torch_orders:TorchInterleavedZeroBubble3",
    "torch-interleaved-zb-4": "pdml_ray.pipeline.torch_orders:TorchInterleavedZeroBubble4",
    "torch-zbv": "pdml_ray.pipeline.torch_orders:TorchZBV",
    "torch-dualpipev": "pdml_ray.pipeline.torch_orders:TorchDualPipeV",
}
"""Baselines from the orders torch.distributed.pipelining's schedule classes generate (torch 2.13
pinned): static, one data-parallel pipeline per replica, some with two chunks per rank (virtual
stages; torch's interleaved zero bubble also at three and four, the chunk counts osprey's zero-bubble
lanes may choose) or split backward. They run in the simulator (``pdml-ray simulate``, ``bench pipeline``),
not on the Ray-actor runtime (which runs F + B plans without virtual stages), so a run's
``PipelineConfig.schedule`` takes only ``PROJECT_SCHEDULES``."""

ALL_SCHEDULES: dict[str, str] = PROJECT_SCHEDULES | TORCH_SCHEDULES
"""Every name ``make_schedule`` builds: the project's schedules, then torch's baselines."""

MAX_STAGES = 1024
MAX_REPLICAS = 1024
"""Most stages, and replicas per stage, a schedule is built for."""
MAX_ACTIONS = 1 << 20
"""Most actions (2 x stages x micro-batches) one step's plan may hold: plans are built and validated in
Python, and a step of a million actions is far beyond any pipeline's."""

STATIC_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "1f1b-weighted", "critical-path")
"""Schedules whose plan is fixed before the step and run strictly in order (osprey's warm start and
auto's static side are chosen from these)."""


def make_schedule(name: str, *, stages: int, replicas: int | Sequence[int], microbatches: int,
                   config: Any = None) -> PipelineSchedule:
    """Build schedule ``name`` (from ``ALL_SCHEDULES``) for ``stages`` x ``replicas`` (an int, or one
    count per stage).

    ``config`` is a ``pdml_ray.config.PipelineConfig`` (or None for defaults). Sizes are checked here,
    where they enter: ConfigError naming the argument unless ``1 <= stages <= MAX_STAGES``, every
    replica count in ``[1, MAX_REPLICAS]``, ``microbatches >= 1`` and at most ``MAX_ACTIONS`` actions.
    """
    if not isinstance(name, str) or name not in ALL_SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule {name!r}; valid names: {sorted(ALL_SCHEDULES)}")
    if not _count(stages, 1, MAX_STAGES):
        raise ConfigError(f"pipeline stages must be an integer in [1, {MAX_STAGES}], got {stages!r}")
    reps: tuple[int, ...]
    if isinstance(replicas, int) and _count(replicas, 1, MAX_REPLICAS):
        reps = (replicas,) * stages
    elif isinstance(replicas, (list, tuple)) and all(_count(r, 1, MAX_REPLICAS) for r in replicas):
        reps = tuple(int(r) for r in replicas)
        if len(reps) != stages:
            raise ConfigError(f"pipeline replicas has {len(reps)} counts for {stages} stages; give one per stage "
                              "(or one integer for all)")
    else:
        raise ConfigError(f"pipeline replicas must be an integer in [1, {MAX_REPLICAS}] or a list of them, one per "
                          f"stage (every stage needs at least one replica), got {replicas!r}")
    if not _count(microbatches, 1, MAX_ACTIONS // (2 * stages)):
        raise ConfigError(f"pipeline microbatches must be an integer in [1, {MAX_ACTIONS // (2 * stages)}] for "
                          f"{stages} stages (at most {MAX_ACTIONS} actions per step), got {microbatches!r}")
    module_name, cls_name = ALL_SCHEDULES[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(stages=stages, replicas=reps, microbatches=microbatches, config=config)


def _count(x: Any, low: int, high: int) -> bool:
    """An integer (not a bool) in [low, high]."""
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high
