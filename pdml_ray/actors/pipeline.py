"""Ray actor shell around ``StageWorker``: one actor per (stage, replica) of the pipeline runtime.

``forward`` and ``backward`` return ``(tensor, CallTiming)``; call them with
``.options(num_returns=2)`` so that the tensor stays in the object store as its own ObjectRef (it
goes straight into the next stage's call) while the driver only fetches the small timing.

``die_at`` is a TEST-ONLY fault injection: the actor's process exits with ``os._exit`` (as a crash or
an OOM kill would: no cleanup, no reply) when it next starts the named call, so the runtime sees
the real death path (``ActorDiedError`` on that call and on every later one).
"""

from __future__ import annotations

import os
from typing import Any

import ray
from torch import Tensor, nn

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.stage import CallTiming, StageWorker

# Stage actors mostly wait on each other; a fraction of a CPU lets stages x replicas actors share
# a small machine. Each runs torch with one intra-op thread (num_threads=1 below).
DEFAULT_STAGE_NUM_CPUS = 0.5

DEATH_POINTS = ("F", "B", "grads")
"""Calls ``die_at`` can name: a forward or backward (of one micro-batch), or the gradient exchange."""


class _StageActorWorker(StageWorker):
    """``StageWorker`` plus the test-only ``die_at`` fault injection."""

    _die_at: tuple[str, int | None] | None = None

    def die_at(self, call: str, microbatch: int | None = None) -> None:
        """TEST-ONLY: exit the process when ``call`` ('F' or 'B' of ``microbatch``, or 'grads') next starts."""
        if call not in DEATH_POINTS or (call != "grads" and microbatch is None):
            raise PlanError(f"die_at needs one of {list(DEATH_POINTS)} (and a micro-batch for F and B), "
                            f"got {call!r}, {microbatch!r}")
        self._die_at = (call, microbatch if call != "grads" else None)

    def _maybe_die(self, call: str, microbatch: int | None) -> None:
        if self._die_at == (call, microbatch):
            os._exit(1)

    def forward(self, microbatch: int, x: Tensor, target: Tensor | None = None,
                loss_scale: float = 1.0) -> tuple[Tensor | None, CallTiming]:
        self._maybe_die("F", microbatch)
        return super().forward(microbatch, x, target, loss_scale)

    def backward(self, microbatch: int, grad_output: Tensor | None = None) -> tuple[Tensor | None, CallTiming]:
        self._maybe_die("B", microbatch)
        return super().backward(microbatch, grad_output)

    def grads(self) -> list[Tensor]:
        self._maybe_die("grads", None)
        return super().grads()


StageActor = ray.remote(_StageActorWorker)


def stage_actor_name(prefix: str, stage: int, replica: int) -> str:
    return f"{prefix}-stage{stage}-replica{replica}"


def launch_stage(stage: int, replica: int, num_stages: int, module: nn.Module, *, name_prefix: str | None = None,
                 num_cpus: float = DEFAULT_STAGE_NUM_CPUS, num_threads: int = 1,
                 **worker_kwargs: Any) -> Any:
    """Start one stage actor (returns its handle); ``worker_kwargs`` go to ``StageWorker`` (loss_fn, lr,
    optimizer, speed, compute, per_sample_s)."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0}
    if name_prefix is not None:
        options["name"] = stage_actor_name(name_prefix, stage, replica)
    return StageActor.options(**options).remote(stage, replica, num_stages, module,
                                                num_threads=num_threads, **worker_kwargs)

