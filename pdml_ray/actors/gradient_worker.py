"""Ray actor shell around ``GradientWorker``: one actor per data-parallel worker of the
straggler-tolerant runtime (``pdml_ray.runtime.stragglers``).

``run`` returns ``(message, WorkerReply)``; call it with ``.options(num_returns=2)`` so the message
tensor stays in the object store as its own ObjectRef (the aggregator fetches only the messages its
combination uses) while it waits on the small reply. The actor is threaded (``max_concurrency``): a
newer step's ``run`` announces itself while an older one still sleeps its EMULATED compute time,
which cuts the older one short, so a straggler never queues steps the aggregator has moved past.

An EMULATED death (``straggler_model.death_step``) exits the actor's process at that step: Ray
reports it to the aggregator as ``ActorDiedError``, as it would a crashed node.

The same shell hosts other data-parallel workers: ``configure(..., worker_cls=C)`` builds a ``C``
instead of a ``GradientWorker`` (the P3 parameter-server runtime's ``pdml_ray.actors.p3_ps.RayP3PSWorker``),
``call(method, ...)`` runs one of its methods and ``call_fn(fn, ...)`` a function in the actor.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ray
from torch import Tensor

from pdml_ray.errors import UsageError
from pdml_ray.stragglers.policy import WorkerTask
from pdml_ray.stragglers.worker import GradientWorker, WorkerReply

# Workers mostly sleep (emulated compute); a fraction of a CPU lets 8 of them share 2 cores.
DEFAULT_GRADIENT_WORKER_NUM_CPUS = 0.25


class GradientWorkerHost:
    """The actor: a ``GradientWorker`` plus the emulated death. ``configure`` (re)builds the worker, so
    one pool of actors serves several runs (starting an actor costs seconds; configuring it does not)."""

    def __init__(self) -> None:
        self.worker: Any = None  # a GradientWorker, or what ``worker_cls`` built

    def configure(self, worker_id: int, *args: Any, worker_cls: Callable[..., Any] | None = None, **kwargs: Any) -> int:
        """Become worker ``worker_id`` (args/kwargs as ``GradientWorker``, or as ``worker_cls``); any step
        of a previous configuration still sleeping is cut short (a ``GradientWorker``) or it is closed."""
        self._retire()
        self.worker = (worker_cls or GradientWorker)(worker_id, *args, **kwargs)
        return worker_id

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` of the configured worker (for workers other than ``GradientWorker``)."""
        if self.worker is None:
            raise UsageError(f"GradientWorkerHost.call({method!r}) before configure(): the runtime configures every worker first")
        return getattr(self.worker, method)(*args, **kwargs)

    def call_fn(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in this actor's process (configured or not)."""
        return fn(*args, **kwargs)

    def _retire(self) -> None:
        if isinstance(self.worker, GradientWorker):
            self.worker.announce(2**62)
        elif self.worker is not None and hasattr(self.worker, "close"):
            self.worker.close()

    def run(self, step: int, params: Tensor, task: WorkerTask, *old_params: Tensor) -> tuple[Tensor, WorkerReply]:
        worker = self.worker
        if not isinstance(worker, GradientWorker):
            raise UsageError("GradientWorkerHost.run needs a GradientWorker: configure() it first (without another worker_cls)")
        if worker.dies_at(step):
            os._exit(1)  # EMULATED death: the process goes away mid-step, as a crashed node's would
        return worker.run(step, params, task, *old_params)

    def tick(self, step: int) -> int:
        """The aggregator reached ``step`` while this worker still computes an older one (asynchronous
        policies): an EMULATED death due by ``step`` happens now, mid-computation."""
        if isinstance(self.worker, GradientWorker) and self.worker.dies_at(step):
            os._exit(1)
        return step

    def stop(self) -> None:
        """Cut short whatever step is sleeping (the run is over)."""
        if isinstance(self.worker, GradientWorker):
            self.worker.announce(2**62)


GradientWorkerActor = ray.remote(GradientWorkerHost)


def gradient_worker_name(prefix: str, worker: int) -> str:
    return f"{prefix}-dp-worker{worker}"


def launch_gradient_worker(index: int, *, name_prefix: str | None = None,
                     num_cpus: float = DEFAULT_GRADIENT_WORKER_NUM_CPUS) -> Any:
    """Start one (unconfigured) worker actor and return its handle; ``configure`` gives it a worker id,
    model and partitions."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0, "max_concurrency": 4}
    if name_prefix is not None:
        options["name"] = gradient_worker_name(name_prefix, index)
    return GradientWorkerActor.options(**options).remote()
