"""The Ray-actor half of ``pdml-ray bench pipeline``: static schedules vs an adaptive one, side by side
on one real ``PipelineRuntime`` with one EMULATED slow replica, compute real or EMULATED (sleep)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import ray
import torch
from torch import nn

from pdml_ray.actors.pipeline import DEFAULT_STAGE_NUM_CPUS
from pdml_ray.bench.common import init_ray
from pdml_ray.config import PDMLConfig, PipelineConfig
from pdml_ray.errors import ConfigError
from pdml_ray.runtime.pipeline import PipelineRuntime, StepResult
from pdml_ray.runtime.pipeline_plans import ScheduledPlans


def compare_schedules(static_name: str = "1f1b", adaptive_name: str = "osprey", stages: int = 3, replicas: int = 2,
                      slow_replica_speed: float = 0.5, steps: int | None = None, microbatches: int | None = None,
                      quick: bool = False, seed: int = 0, *, slow_replica: tuple[int, int] | None = None,
                      warmup_steps: int = 1, config: Any = None,
                      num_cpus_per_actor: float = DEFAULT_STAGE_NUM_CPUS, compute: str = "sleep",
                      per_sample_ms: float = 0.5, also: Sequence[str] = ()) -> dict[str, Any]:
    """Measure static schedules against the adaptive one on a real pipeline with one EMULATED slow replica.

    A small MLP is split into ``stages`` stages with ``replicas`` replicas each; replica
    ``slow_replica`` (default: the last replica of the middle stage) runs at ``slow_replica_speed``.
    ``compute="sleep"`` (default) EMULATES compute time: each action runs the real forward/backward of
    a small MLP and sleeps micro-batch size x ``per_sample_ms`` / speed (twice that for a backward),
    so the actors keep their speeds however few cores they share; ``"real"`` computes a larger MLP and
    slows the slow replica by sleeping (1/speed - 1) x its compute.
    Every scheduler (``static_name``, ``adaptive_name`` and the further baselines ``also``) drives the
    same actors, one step each per round on the same batch, in an order rotated every round (so drift
    and noise fall on all alike). The first ``warmup_steps`` rounds (allocator and first-call warm-up)
    are left out; the schedulers' learning steps after that are counted. ``paired`` holds, per
    baseline, the statistics of the per-round ratios adaptive / baseline (``paired_ratio_stats``).
    Uses the running Ray cluster; if none, connects to RAY_ADDRESS when set, else starts a private
    local instance; stops only what it started.
    """
    from statistics import median

    from pdml_ray.bench.common import paired_ratio_stats, ratio_key
    from pdml_ray.emulation import COMPUTE_MODES
    from pdml_ray.pipeline.registry import make_schedule

    if compute not in COMPUTE_MODES:
        raise ConfigError(f"compute must be one of {list(COMPUTE_MODES)}, got {compute!r}")
    steps = steps if steps is not None else (6 if quick else 16)
    microbatches = microbatches if microbatches is not None else (8 if quick else 12)
    if steps < 1 or microbatches < 1 or warmup_steps < 0:
        raise ConfigError(f"need steps >= 1, microbatches >= 1 and warmup_steps >= 0, got "
                         f"{steps}, {microbatches}, {warmup_steps}")
    slow = slow_replica if slow_replica is not None else (stages // 2, replicas - 1)
    if compute == "sleep":
        # Real compute well under a millisecond; the sleep (32 ms per forward of 64 samples at 0.5 ms)
        # stands far above Ray's per-call overhead (~1-5 ms on a busy 2-core machine).
        width, mb_size, in_dim, out_dim = 64, 64, 32, 8
    else:
        # Sized so that one action computes for several milliseconds, above Ray's per-call overhead,
        # else the slow replica's sleep is lost in that overhead.
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
        init_ray(max(os.cpu_count() or 1, stages * replicas))
    runtime = PipelineRuntime(model, stages, replicas, nn.MSELoss(), lr=0.01, speeds={slow: slow_replica_speed},
                              num_cpus_per_actor=num_cpus_per_actor, compute=compute,
                              per_sample_s=per_sample_ms / 1e3 if compute == "sleep" else 0.0)
    schedulers: dict[str, ScheduledPlans] = {}
    try:
        names = list(dict.fromkeys([static_name, adaptive_name, *also]))  # each schedule once, in this order
        # each schedule planned by its own run's scheduler actor (the runtime's default path), fetched ahead
        base = config if config is not None else PipelineConfig()
        schedulers.update({name: ScheduledPlans(PDMLConfig(pipeline=dataclasses.replace(base, schedule=name)),
                                                stages=stages, replicas=replicas, microbatches=microbatches)
                           for name in names})
        results: dict[str, list[StepResult]] = {name: [] for name in names}
        for rnd in range(warmup_steps + steps):
            x = torch.randn(batch, in_dim, generator=generator)
            y = torch.randn(batch, out_dim, generator=generator)
            shift = rnd % len(names)  # rotated order: AB, BA (ABC, BCA, CAB with three)
            for name in names[shift:] + names[:shift]:
                results[name].append(runtime.run_step(schedulers[name], x, y, len(results[name])))
        timed = {name: [r.step_time_s for r in rs[warmup_steps:]] for name, rs in results.items()}
        med = {name: float(median(ts)) for name, ts in timed.items()}
        paired = {ratio_key(adaptive_name, b): paired_ratio_stats(timed[b], timed[adaptive_name])
                  for b in names if b != adaptive_name}
        # No schedule beats total real compute / cores on one machine: when this floor is near the
        # static step time, the run is CPU-bound and moving work off the slow replica cannot pay.
        cores = os.cpu_count() or 1
        cpu_floor_s = float(median([r.compute_s for r in results[static_name][warmup_steps:]])) / cores
        speeds = {f"s{k}r{r}": s for (k, r), s in sorted(runtime.speeds.items())}

        predicted = (_simulated_step_s(names, stages, replicas, microbatches, mb_size * per_sample_ms / 1e3,
                                       slow, slow_replica_speed, warmup_steps + steps, config)
                     if compute == "sleep" else None)

        def counts(rs: list[StepResult]) -> dict[str, int]:  # micro-batches per replica in the last step
            return {f"s{k}r{r}": n for (k, r), n in sorted(rs[-1].forward_counts.items())}

        return {
            "compute": compute, "per_sample_ms": per_sample_ms if compute == "sleep" else None,
            "static_schedule": static_name, "adaptive_schedule": adaptive_name,
            "osprey_over_static": med[adaptive_name] / med[static_name],
            "static_median_step_s": med[static_name], "adaptive_median_step_s": med[adaptive_name],
            "static_step_s": timed[static_name], "adaptive_step_s": timed[adaptive_name],
            "paired": paired,
            "schedules": {name: {"median_step_s": med[name], "step_s": timed[name], "forward_counts": counts(rs),
                                 "final_loss": rs[-1].loss,
                                 # the driver's time blocked waiting for plans from the scheduler actor
                                 "plan_wait_s_per_step": schedulers[name].wait_s / schedulers[name].steps,
                                 "plan_wait_over_step": schedulers[name].wait_s / schedulers[name].steps / med[name]}
                          for name, rs in results.items()},
            # With sleep compute the costs are known exactly: what the simulator predicts for the same
            # schedules (no Ray overhead, no gradient sum), to read the measured step times against.
            "simulated_step_s": predicted,
            "order": "one step of each schedule per round on the same batch, order rotated every round",
            "cpu_floor_s": cpu_floor_s, "cpu_floor_over_static": cpu_floor_s / med[static_name], "local_cores": cores,
            "note": ("all stage actors share this machine's cores: real compute / cores (cpu_floor_s) bounds every "
                     "schedule, so the closer cpu_floor_over_static is to 1, the less any re-balancing can gain"
                     + ("; with --compute sleep the real compute is small and the floor far below the step"
                        if compute == "sleep" else "")),
            "stages": stages, "replicas": replicas, "microbatches": microbatches, "microbatch_size": mb_size,
            "steps": steps, "warmup_steps": warmup_steps, "layers_per_stage": runtime.stage_sizes,
            "model": f"MLP {in_dim}-{width}x{2 * stages + 1}-{out_dim}, Tanh",
            "speeds": speeds, "slow_replica": f"s{slow[0]}r{slow[1]}",
            # Micro-batches per replica in the last step: where each schedule put the work.
            "forward_counts": {"static": counts(results[static_name]), "adaptive": counts(results[adaptive_name])},
            "final_loss": {"static": results[static_name][-1].loss, "adaptive": results[adaptive_name][-1].loss},
            "emulated": runtime.emulation_note(),
        }
    finally:
        for plans in schedulers.values():
            plans.close()
        runtime.shutdown()
        if started_ray:
            ray.shutdown()


def _simulated_step_s(names: Sequence[str], stages: int, replicas: int, microbatches: int, forward_s: float,
                      slow: tuple[int, int], slow_speed: float, steps: int, config: Any) -> dict[str, float]:
    """Steady-state step time (s, median of the second half) the simulator predicts for each schedule
    on the sleep-compute costs: forward ``forward_s``, backward twice that, divided by the speeds."""
    from pdml_ray.pipeline.simulate import ClusterProfile, compare_in_simulation, steady_state
    from pdml_ray.pipeline.stage import BACKWARD_SLEEP_FACTOR

    speeds = [[1.0] * replicas for _ in range(stages)]
    speeds[slow[0]][slow[1]] = slow_speed
    profile = ClusterProfile.build(stages, replicas, forward_s=forward_s, backward_s=BACKWARD_SLEEP_FACTOR * forward_s,
                                   speeds=tuple(tuple(row) for row in speeds))
    results = compare_in_simulation(profile, microbatches, names, steps=max(2, steps), config=config)
    return {name: float(v) for name, v in steady_state(results, max(2, steps) // 2)["makespan_s"].items()}
