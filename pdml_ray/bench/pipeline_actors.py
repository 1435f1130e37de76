"""The Ray-actor half of ``pdml-ray bench pipeline``: a static schedule vs an adaptive one, side by side
on one real ``PipelineRuntime`` with one EMULATED slow replica."""

from __future__ import annotations

import os
from typing import Any

import ray
import torch
from torch import nn

from pdml_ray.actors.stage import DEFAULT_STAGE_NUM_CPUS
from pdml_ray.errors import ConfigError
from pdml_ray.runtime.pipeline import PipelineRuntime, StepResult


def compare_schedules(static_name: str = "1f1b", adaptive_name: str = "osprey", stages: int = 3, replicas: int = 2,
                      slow_replica_speed: float = 0.5, steps: int | None = None, microbatches: int | None = None,
                      quick: bool = False, seed: int = 0, *, slow_replica: tuple[int, int] | None = None,
                      warmup_steps: int = 1, config: Any = None,
                      num_cpus_per_actor: float = DEFAULT_STAGE_NUM_CPUS) -> dict[str, Any]:
    """Measure a static schedule against the adaptive one on a real pipeline with one EMULATED slow replica.

    A small MLP is split into ``stages`` stages with ``replicas`` replicas each; replica
    ``slow_replica`` (default: the last replica of the middle stage) runs at ``slow_replica_speed``.
    Both schedulers drive the same actors, one step each in turn (ABBA order, so drift and noise
    fall on both alike), on the same batch per round. The first ``warmup_steps`` rounds (allocator
    and first-call warm-up) are left out of the medians; the adaptive scheduler's learning steps after
    that are counted. Uses the running Ray cluster; if none, connects to RAY_ADDRESS when set, else
    starts a private local instance; stops only what it started.
    """
    from statistics import median

    from pdml_ray.pipeline.registry import make_scheduler

    steps = steps if steps is not None else (5 if quick else 12)
    microbatches = microbatches if microbatches is not None else (8 if quick else 12)
    if steps < 1 or microbatches < 1 or warmup_steps < 0:
        raise ConfigError(f"need steps >= 1, microbatches >= 1 and warmup_steps >= 0, got "
                         f"{steps}, {microbatches}, {warmup_steps}")
    slow = slow_replica if slow_replica is not None else (stages // 2, replicas - 1)
    # Sized so that one action computes for several milliseconds, above Ray's per-call overhead
    # (~1-5 ms on a busy 2-core machine), else the slow replica's sleep is lost in that overhead.
    width, mb_size, in_dim, out_dim = (768, 64, 64, 16) if quick else (1024, 64, 128, 32)
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(in_dim, width), nn.Tanh()]
    for _ in range(2 * stages):  # two equal hidden layers per stage: the split is balanced
        layers += [nn.Linear(width, width), nn.Tanh()]
    layers.append(nn.Linear(width, out_dim))
    model = nn.Sequential(*layers)
    generator = torch.Generator().manual_seed(seed)
    batch = microbatches * mb_size

    started_ray = not ray.is_initialized()
    if started_ray:
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)  # the user's cluster
        else:
            # address="local": a fresh private instance, never some other job's cluster on this machine.
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, stages * replicas),
                     include_dashboard=False, log_to_driver=False)
    runtime = PipelineRuntime(model, stages, replicas, nn.MSELoss(), lr=0.01, speeds={slow: slow_replica_speed},
                              num_cpus_per_actor=num_cpus_per_actor)
    try:
        names = {"static": static_name, "adaptive": adaptive_name}
        schedulers = {role: make_scheduler(name, stages=stages, replicas=replicas, microbatches=microbatches,
                                           config=config) for role, name in names.items()}
        results: dict[str, list[StepResult]] = {"static": [], "adaptive": []}
        for rnd in range(warmup_steps + steps):
            x = torch.randn(batch, in_dim, generator=generator)
            y = torch.randn(batch, out_dim, generator=generator)
            order = ("static", "adaptive") if rnd % 2 == 0 else ("adaptive", "static")
            for role in order:
                results[role].append(runtime.run_step(schedulers[role], x, y, len(results[role])))
        timed = {role: [r.step_time_s for r in rs[warmup_steps:]] for role, rs in results.items()}
        med = {role: float(median(ts)) for role, ts in timed.items()}
        # No schedule beats total real compute / cores on one machine: when this floor is near the
        # static step time, the run is CPU-bound and moving work off the slow replica cannot pay.
        cores = os.cpu_count() or 1
        cpu_floor_s = float(median([r.compute_s for r in results["static"][warmup_steps:]])) / cores
        speeds = {f"s{k}r{r}": s for (k, r), s in sorted(runtime.speeds.items())}
        return {
            "static_schedule": static_name, "adaptive_schedule": adaptive_name,
            "osprey_over_static": med["adaptive"] / med["static"],
            "static_median_step_s": med["static"], "adaptive_median_step_s": med["adaptive"],
            "static_step_s": timed["static"], "adaptive_step_s": timed["adaptive"],
            "cpu_floor_s": cpu_floor_s, "cpu_floor_over_static": cpu_floor_s / med["static"], "local_cores": cores,
            "note": ("all stage actors share this machine's cores: real compute / cores (cpu_floor_s) bounds every "
                     "schedule, so the closer cpu_floor_over_static is to 1, the less any re-balancing can gain"),
            "stages": stages, "replicas": replicas, "microbatches": microbatches, "microbatch_size": mb_size,
            "steps": steps, "warmup_steps": warmup_steps, "layers_per_stage": runtime.stage_sizes,
            "model": f"MLP {in_dim}-{width}x{2 * stages + 1}-{out_dim}, Tanh",
            "speeds": speeds, "slow_replica": f"s{slow[0]}r{slow[1]}",
            # Micro-batches per replica in the last step: where each schedule put the work.
            "forward_counts": {role: {f"s{k}r{r}": n for (k, r), n in sorted(rs[-1].forward_counts.items())}
                               for role, rs in results.items()},
            "final_loss": {role: rs[-1].loss for role, rs in results.items()},
            "emulated": runtime.emulation_note(),
        }
    finally:
        runtime.shutdown()
        if started_ray:
            ray.shutdown()
