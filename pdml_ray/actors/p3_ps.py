"""Ray actor shells of the P3 parameter-server runtime (``pdml_ray.runtime.p3_ps``).

- ``P3ShardActor``: an asyncio actor around ``pdml_ray.p3.shard.ShardState``. ``push`` adds one worker's
  gradient slices and returns the updated values once every worker has pushed them: each call is
  one coroutine awaiting its slices' events, so thousands can wait at once without threads.
- Workers: the straggler-tolerant runtime's own actor shell (``pdml_ray.actors.gradient_worker.GradientWorkerHost``,
  launched by ``launch_gradient_worker``) configured with ``worker_cls=RayP3PSWorker``: a
  ``pdml_ray.p3.ps.P3PSWorker`` (a model replica, this worker's share of every global batch, the
  hooks, the EMULATED links) whose transport to the shards is ``RayShardTransport``: one fire-and-forget
  actor call per layer (or message) and shard, the returned ObjectRef's ``future()`` is the pull.

The conventions are the straggler-tolerant runtime's: a fraction of a CPU per actor,
``max_restarts=0``, ``configure`` (re)builds the core object so one set of actors serves several runs,
names from ``gradient_worker_name``; the data set is published once with ``ray.put`` and passed by
reference.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import ray
from torch import Tensor, nn

from pdml_ray.actors.gradient_worker import DEFAULT_GRADIENT_WORKER_NUM_CPUS, launch_gradient_worker
from pdml_ray.errors import UsageError
from pdml_ray.p3.ps import LossFn, P3PSWorker, WorkerRun
from pdml_ray.p3.shard import SGDSettings, ShardState
from pdml_ray.p3.slicing import SlicePlan


class P3Shard:
    """One parameter-server shard as an asyncio actor."""

    def __init__(self) -> None:
        self.state: ShardState | None = None
        self._events: dict[tuple[int, int], asyncio.Event] = {}
        self._done: dict[tuple[int, int], Tensor] = {}  # (step, slice) -> updated value
        self._pulls: dict[tuple[int, int], int] = {}  # (step, slice) -> workers that have taken it

    async def configure(self, shard: int, num_shards: int, plan: SlicePlan, initial_layers: list[Tensor],
                        num_workers: int, sgd: SGDSettings, momentum_layers: list[Tensor] | None = None) -> int:
        self.state = ShardState(shard, num_shards, plan, initial_layers, num_workers, sgd, momentum_layers)
        self._events, self._done, self._pulls = {}, {}, {}
        return len(self.state.slices)

    def _event(self, key: tuple[int, int]) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    async def push(self, step: int, worker: int, slice_ids: list[int], grads: list[Tensor]) -> list[Tensor]:
        """Add the slices; return their values after ``step``'s update (waits for the other workers)."""
        state = self.state
        if state is None:
            raise UsageError("P3Shard.push before configure(): the runtime configures every shard first")
        for sid in state.push(step, worker, slice_ids, grads):
            self._done[(step, sid)] = state.value(sid)
            self._event((step, sid)).set()
        out = []
        for sid in slice_ids:
            key = (step, sid)
            await self._event(key).wait()
            out.append(self._done[key])
            self._pulls[key] = self._pulls.get(key, 0) + 1
            if self._pulls[key] == state.num_workers:  # every worker has its copy
                del self._done[key], self._events[key], self._pulls[key]
        return out

    async def values(self) -> dict[int, Tensor]:
        """The current value of every slice this shard holds."""
        if self.state is None:
            return {}
        return {sid: self.state.value(sid) for sid in self.state.values}

    async def momentum(self) -> dict[int, Tensor]:
        """The SGD momentum buffer of every slice this shard holds that has one."""
        return self.state.momentum() if self.state is not None else {}


class RayShardTransport:
    """``pdml_ray.p3.shard.ShardTransport`` over shard actor handles."""

    def __init__(self, shards: Sequence[Any]) -> None:
        self.shards = list(shards)

    def push(self, shard: int, step: int, worker: int, slice_ids: list[int], grads: list[Tensor]) -> Future[list[Tensor]]:
        return self.shards[shard].push.remote(step, worker, slice_ids, grads).future()


class RayP3PSWorker(P3PSWorker):
    """A ``P3PSWorker`` reaching the shards through Ray (``RayShardTransport`` over their handles), one torch
    thread; hosted by the straggler runtime's actor shell: ``GradientWorkerHost.configure(worker, model, loss_fn,
    x, y, batches, shards, worker_cls=RayP3PSWorker, **P3PSWorker's keyword arguments)``."""

    def __init__(self, worker: int, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor,
                 batches: list[tuple[int, int, float]], shards: list[Any], **kwargs: Any) -> None:
        super().__init__(worker, model, loss_fn, x, y, batches, RayShardTransport(shards), len(shards), num_threads=1,
                         **kwargs)

    def train_segment(self, first_step: int, stop_step: int) -> tuple[float, float, float] | None:
        """Steps ``first_step`` .. ``stop_step - 1`` (the links stay open for the next segment); what this
        worker's link was over them (``P3PSWorker.link_measurement``), for the scheduler's ``p3`` axis."""
        self.train(first_step, stop_step, close=False)
        return self.link_measurement(first_step, stop_step)

    def finish(self) -> tuple[WorkerRun, Tensor]:
        """After the last segment: close the links; the measurements and this replica's final parameters
        (one flat vector)."""
        self.close()
        return self.run, self.parameters_vector()


P3ShardActor = ray.remote(P3Shard)


def launch_p3_shard(index: int, *, name_prefix: str | None = None,
                    num_cpus: float = DEFAULT_GRADIENT_WORKER_NUM_CPUS) -> Any:
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0, "max_concurrency": 1000}
    if name_prefix is not None:
        options["name"] = f"{name_prefix}-p3-shard{index}"
    return P3ShardActor.options(**options).remote()


def launch_p3_worker(index: int, *, name_prefix: str | None = None,
                     num_cpus: float = DEFAULT_GRADIENT_WORKER_NUM_CPUS) -> Any:
    """A worker actor of the straggler runtime's shell (``GradientWorkerHost``), to configure with
    ``worker_cls=RayP3PSWorker``."""
    return launch_gradient_worker(index, name_prefix=f"{name_prefix}-p3" if name_prefix is not None else None,
                            num_cpus=num_cpus)
