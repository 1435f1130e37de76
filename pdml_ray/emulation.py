"""Emulated heterogeneity for machines whose workers are all alike (a CPU laptop, CI).

A worker with speed factor ``s`` (1.0 = full speed, 0.4 = 40% of it) sleeps ``(1/s - 1)`` times
its measured compute time after each unit of work, so its observed throughput is ``s`` times what
it would be. The compute time is wall time (synchronised on a GPU): with more workers than cores,
a worker's compute includes waiting for a core, and a slow device in the same crowded machine would
take 1/s times that too. The flip side: stalls caused by other processes are scaled with it, so
emulated runs on a busy machine look more uneven than the speeds say.

Everything that uses this must say so in its output: the speeds are emulated, the compute
(forward, backward, optimizer, collectives) is real.
"""

from __future__ import annotations

import time

EMULATION_NOTE = (
    "speeds are EMULATED: a worker with speed s sleeps (1/s - 1) x its measured compute time "
    "after each step; compute, gradients and collectives are real"
)


def emulated_delay_s(compute_s: float, speed: float) -> float:
    """Extra seconds a worker of relative ``speed`` spends on work that took ``compute_s``."""
    if not speed > 0:
        raise ValueError(f"emulated speed must be > 0, got {speed}")
    return max(0.0, compute_s) * (1.0 / speed - 1.0) if speed < 1.0 else 0.0


def emulate_speed(compute_s: float, speed: float) -> float:
    """Sleep so that work of ``compute_s`` seconds looks like it ran at ``speed``; returns the sleep."""
    delay = emulated_delay_s(compute_s, speed)
    if delay > 0:
        time.sleep(delay)
    return delay
