"""A short synthetic run that gives every exported series a value: the calls a training run makes on
its scheduler (register, data set size, reports, decision requests), with every priority axis on.

The metric tests replay it on an in-process ``Scheduler`` and on the scheduler actor, and check the
Grafana dashboard's queries against the names it produces; replay it yourself to see the dashboard
filled without training anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pdml_ray.config import GradientPriorityConfig, NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.decisions import Boundary, WorkerReport

NUM_WORKERS = 2
NUM_SAMPLES = 400
GLOBAL_BATCH = 40
INTERVAL = 5
COMPUTE_S = (0.02, 0.05)
"""Compute seconds per step of worker 0 and 1 at the uniform batch: worker 1 is the straggler."""
WAIT_S = (0.03, 0.001)
STEP_S = (0.06, 0.06)


def config(scheduler_name: str = "pdml-metrics-demo") -> PDMLConfig:
    """Node, sample and gradient priorities on, decisions every ``INTERVAL`` steps."""
    return PDMLConfig(decision_interval=INTERVAL,
                      node_priority=NodePriorityConfig(global_batch_size=GLOBAL_BATCH, warmup_steps=0),
                      sample_priority=SamplePriorityConfig(), gradient_priority=GradientPriorityConfig(),
                      scheduler_name=scheduler_name)


def reports(step: int, sizes: tuple[int, ...]) -> list[WorkerReport]:
    """One step's reports of every worker, with per-sample losses for the sample table."""
    rng = np.random.default_rng(step)
    out = []
    offset = 0
    for w, b in enumerate(sizes):
        idx = (np.arange(offset, offset + b) + step * GLOBAL_BATCH) % NUM_SAMPLES
        offset += b
        losses = rng.uniform(0.5, 2.0, size=b).astype(np.float32)
        scale = b / (GLOBAL_BATCH / NUM_WORKERS)
        out.append(WorkerReport(worker_id=w, step=step, samples=b, compute_s=COMPUTE_S[w] * scale, wait_s=WAIT_S[w],
                                step_s=STEP_S[w], overhead_s=0.001, loss=float(losses.mean()) / (1 + 0.05 * step),
                                grad_norm=1.0 + w, accelerator_type=("H100", "A100")[w],
                                sample_indices=idx.astype(np.int64), sample_losses=losses))
    return out


def calls(steps: int = 30) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(method, args) of the scheduler calls of a ``steps``-step run, in order; one malformed report
    (rejected, counted under ``field="compute_s"``) included. ``bundle`` calls assume the previous
    bundle's decisions were adopted (``since`` follows what the scheduler published)."""
    yield "register", (0, "H100")
    yield "register", (1, "A100")
    yield "set_dataset_size", (NUM_SAMPLES,)
    sizes = (GLOBAL_BATCH // NUM_WORKERS,) * NUM_WORKERS
    for first in range(0, steps, INTERVAL):
        yield "report", ([r for s in range(first, first + INTERVAL) for r in reports(s, sizes)],)
        yield "bundle", (Boundary(first + INTERVAL, INTERVAL, sizes), None)
    yield "report", ([WorkerReport(worker_id=0, step=steps, samples=4, compute_s=-1.0)],)


def replay(scheduler: Any, steps: int = 30, call: Callable[[Any, str, tuple[Any, ...]], Any] | None = None) -> None:
    """Make ``calls(steps)`` on ``scheduler``, each through ``call(scheduler, method, args)`` (default: a
    plain method call on a ``Scheduler`` in this process; for the scheduler actor pass
    ``lambda h, m, a: ray.get(getattr(h, m).remote(*a))``). Each ``bundle`` gets the versions the
    previous ones published, as rank 0 would send them."""
    since: dict[str, int] = {}
    for method, args in calls(steps):
        if method == "bundle":
            args = (args[0], dict(since))
        result = call(scheduler, method, args) if call is not None else getattr(scheduler, method)(*args)
        if method == "bundle":
            since.update({name: d.version for name, d in result.decisions.items()})
