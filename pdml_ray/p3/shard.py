"""The P3 parameter-server runtime's core, without Ray: the shards' side (``pdml_ray.p3.ps`` is the
workers').

- ``ShardState``: one parameter-server shard. It owns the slices ``shard_of`` gives it (round-robin
  over the plan's slices, so every shard holds a share of every large layer), their values and one
  optimizer over them. ``push`` adds a worker's weighted gradient slices; once every worker has
  pushed a slice for a step, the shard applies the update to that slice alone and the updated value
  is what ``value(slice)`` returns. Elementwise optimizers (SGD with momentum and weight decay)
  update a slice exactly as they would the whole parameter, so the result does not depend on the
  order slices arrive in.
- ``ShardTransport``: how a worker reaches the shards (Ray actor calls in the runtime,
  ``pdml_ray.actors.p3_ps.RayShardTransport``); ``LocalShardTransport`` calls in-process shards directly.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.p3.slicing import SlicePlan


def shard_of(slice_index: int, num_shards: int) -> int:
    """The shard that holds slice ``slice_index``: round-robin over the plan."""
    return slice_index % num_shards



@dataclass(frozen=True, slots=True)
class SGDSettings:
    """The shards' optimizer: ``torch.optim.SGD`` over each shard's slices (elementwise, so sliced
    updates equal whole-model updates)."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not self.lr > 0 or self.momentum < 0 or self.weight_decay < 0:
            raise ConfigError(f"SGD needs lr > 0, momentum >= 0, weight_decay >= 0, got {self}")


class ShardState:
    """One parameter-server shard: slices ``{i : shard_of(i, num_shards) == shard}`` of ``plan``."""

    def __init__(self, shard: int, num_shards: int, plan: SlicePlan, initial_layers: Sequence[Tensor],
                 num_workers: int, sgd: SGDSettings, momentum_layers: Sequence[Tensor] | None = None) -> None:
        """``initial_layers``: each layer's parameters, flat; ``momentum_layers``: each layer's SGD momentum
        buffer, flat, to continue from (a run re-sliced at a decision boundary), or None: none yet."""
        if not 0 <= shard < num_shards or num_workers < 1:
            raise ConfigError(f"shard {shard} of {num_shards} with {num_workers} workers is not a valid layout")
        self.shard, self.num_workers = shard, num_workers
        self.slices = [s for s in plan.slices if shard_of(s.index, num_shards) == shard]
        self.values = {s.index: nn.Parameter(initial_layers[s.layer][s.start:s.stop].detach().clone().float())
                       for s in self.slices}
        self.optimizer = torch.optim.SGD(list(self.values.values()), lr=sgd.lr, momentum=sgd.momentum,
                                         weight_decay=sgd.weight_decay) if self.values else None
        if momentum_layers is not None and self.optimizer is not None:
            for s in self.slices:
                self.optimizer.state[self.values[s.index]]["momentum_buffer"] = (
                    momentum_layers[s.layer][s.start:s.stop].detach().clone().float())
        self._sums: dict[tuple[int, int], Tensor] = {}  # (step, slice) -> sum of weighted gradients, float64
        self._pushed: dict[tuple[int, int], set[int]] = {}  # (step, slice) -> workers that pushed it
        self.updates = 0

    def push(self, step: int, worker: int, slice_ids: Sequence[int], grads: Sequence[Tensor]) -> list[int]:
        """Worker ``worker``'s weighted gradient slices of ``step``; returns the slices whose update is
        now complete (every worker pushed them) and applied."""
        done = []
        for sid, grad in zip(slice_ids, grads):
            if sid not in self.values:
                raise PlanError(f"slice {sid} was pushed to shard {self.shard}, which does not hold it")
            key = (step, sid)
            workers = self._pushed.setdefault(key, set())
            if worker in workers:
                raise PlanError(f"worker {worker} pushed slice {sid} of step {step} twice")
            workers.add(worker)
            g = grad.detach().reshape(-1).to(torch.float64)
            self._sums[key] = self._sums[key] + g if key in self._sums else g.clone()
            if len(workers) == self.num_workers:
                self._apply(sid, self._sums.pop(key))
                del self._pushed[key]
                done.append(sid)
        return done

    def _apply(self, sid: int, grad_sum: Tensor) -> None:
        assert self.optimizer is not None
        param = self.values[sid]
        param.grad = grad_sum.to(param.dtype)
        # one slice at a time: the others keep their gradients out of this step
        others = [(p, p.grad) for p in self.values.values() if p is not param]
        for p, _ in others:
            p.grad = None
        self.optimizer.step()
        for p, g in others:
            p.grad = g
        param.grad = None
        self.updates += 1

    def value(self, sid: int) -> Tensor:
        return self.values[sid].detach().clone()

    def momentum(self) -> dict[int, Tensor]:
        """Each held slice's SGD momentum buffer (those that have one: momentum > 0, updated at least once)."""
        if self.optimizer is None:
            return {}
        state = self.optimizer.state
        return {sid: state[p]["momentum_buffer"].detach().clone() for sid, p in self.values.items()
                if "momentum_buffer" in state.get(p, {})}


class ShardTransport(Protocol):
    """How a worker reaches the shards (Ray actor calls in the runtime, direct calls in unit tests)."""

    def push(self, shard: int, step: int, worker: int, slice_ids: list[int], grads: list[Tensor]) -> Future[list[Tensor]]:
        """Push weighted gradient slices; the future resolves to the slices' values after ``step``'s
        update (once every worker has pushed them). One call per message and shard: push and pull."""
        ...


class LocalShardTransport:
    """Direct calls to in-process shards (unit tests, no Ray): a push's future resolves when the update
    of its slices is applied."""

    def __init__(self, shards: Sequence[ShardState]) -> None:
        self.shards = list(shards)
        self._lock = threading.Lock()
        self._waiting: list[tuple[Future[list[Tensor]], int, list[int]]] = []  # (future, step, slices)
        self._done: dict[tuple[int, int], Tensor] = {}  # (step, slice) -> updated value

    def push(self, shard: int, step: int, worker: int, slice_ids: list[int], grads: list[Tensor]) -> Future[list[Tensor]]:
        fut: Future[list[Tensor]] = Future()
        with self._lock:
            for sid in self.shards[shard].push(step, worker, slice_ids, grads):
                self._done[(step, sid)] = self.shards[shard].value(sid)
            self._waiting.append((fut, step, list(slice_ids)))
            ready = [w for w in self._waiting if all((w[1], i) in self._done for i in w[2])]
            self._waiting = [w for w in self._waiting if w not in ready]
        for f, st, ids in ready:
            f.set_result([self._done[(st, i)] for i in ids])
        return fut
