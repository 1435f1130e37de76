"""Ray actor shell around ``StageWorker``: one actor per (stage, replica) of the pipeline runtime.

``forward`` and ``backward`` return ``(tensor, CallTiming)``; call them with
``.options(num_returns=2)`` so that the tensor stays in the object store as its own ObjectRef (it
goes straight into the next stage's call) while the driver only fetches the small timing.
"""

from __future__ import annotations

from typing import Any

import ray
from torch import nn

from pdml_ray.pipeline.stage import StageWorker

# Stage actors mostly wait on each other; a fraction of a CPU lets stages x replicas actors share
# a small machine. Each runs torch with one intra-op thread (num_threads=1 below).
DEFAULT_STAGE_NUM_CPUS = 0.5

StageActor = ray.remote(StageWorker)


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
