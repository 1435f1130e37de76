"""Emulated heterogeneity for machines whose workers are all alike (a CPU laptop, CI).

A worker with speed factor ``s`` (1.0 = full speed, 0.4 = 40% of it) sleeps ``(1/s - 1)`` times
its measured compute time after each unit of work, so its observed throughput is ``s`` times what
it would be. The compute time is wall time (synchronised on a GPU): with more workers than cores,
a worker's compute includes waiting for a core, and a slow device in the same crowded machine would
take 1/s times that too. The flip side: stalls caused by other processes are scaled with it, so
emulated runs on a busy machine look more uneven than the speeds say.

What is scaled is this worker's own work: the measured compute leaves out the collectives inside
forward and backward (DDP's buffer broadcast, FSDP2's all-gathers and reduce-scatters, which wait for
other ranks; ``pdml_ray.train.timing``), so a wait for a faster rank is never slept again. The
worker's fixed cost per step (Python, kernel launches) is scaled with the rest, as on a device that is
slower at everything: a model whose step is mostly fixed cost then gets a split further from the
speed ratio than one whose step is mostly per-sample work (``emulated_per_sample_s`` emulates the
latter exactly).

Everything that uses this must say so in its output: the speeds are emulated, the compute
(forward, backward, optimizer, collectives) is real.
"""

from __future__ import annotations

import time


EMULATION_NOTE = (
    "speeds are EMULATED: a worker with speed s sleeps (1/s - 1) x its measured compute time "
    "after each step; compute, gradients and collectives are real"
)


def check_speed(speed: object, where: str = "emulated speed") -> float:
    """The one check of a speed factor: a number in (0, 1], the fastest worker being 1.0."""
    from pdml_ray.config.checks import check_range  # at call time: pdml_ray.config.node imports this module

    check_range(speed, where, 0.0, 1.0, open_low=True, hint="the fastest worker is 1.0, one at half its speed 0.5")
    return float(speed)  # type: ignore[arg-type]


def emulated_delay_s(compute_s: float, speed: float) -> float:
    """Extra seconds a worker of relative ``speed`` (in (0, 1]) spends on work that took ``compute_s``."""
    return max(0.0, compute_s) * (1.0 / speed - 1.0) if speed < 1.0 else 0.0


def emulate_speed(compute_s: float, speed: float) -> float:
    """Sleep so that work of ``compute_s`` seconds looks like it ran at ``speed``; returns the sleep."""
    delay = emulated_delay_s(compute_s, speed)
    if delay > 0:
        time.sleep(delay)
    return delay


COMPUTE_MODES = ("real", "sleep")
"""How benchmarks spend a worker's compute: ``real`` (the workload's own forward/backward, slowed by
``emulate_speed``) or ``sleep`` (a small real forward/backward for the gradients, plus a sleep of
``samples x per_sample_s / speed``: contention on a small machine barely moves it, so the ideal is
exact and what is measured is the scheduler)."""

SLEEP_COMPUTE_NOTE = (
    "compute is EMULATED (--compute sleep): each worker runs a small real forward/backward for its "
    "gradients, then sleeps samples x per-sample time / speed; collectives are real"
)


def sleep_compute_s(samples: int, per_sample_s: float, speed: float = 1.0) -> float:
    """Seconds a worker of relative ``speed`` spends on ``samples`` in the sleep compute mode."""
    return max(0, samples) * per_sample_s / check_speed(speed)


def sleep_compute(samples: int, per_sample_s: float, speed: float = 1.0) -> float:
    """Sleep for ``sleep_compute_s(samples, per_sample_s, speed)``; returns the seconds slept."""
    delay = sleep_compute_s(samples, per_sample_s, speed)
    if delay > 0:
        time.sleep(delay)
    return delay
