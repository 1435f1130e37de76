"""Per-action latencies of this rank's stages on torch's pipeline runtime, for an adaptive schedule.

torch's ``_PipelineScheduleRuntime`` reports no timings. Each of its compute actions calls one method of
the action's ``PipelineStage`` with the micro-batch index, after it has waited for the action's receive:
``forward_one_chunk`` (F), ``backward_one_chunk`` (B with ``full_backward``, else I) and
``backward_weight_one_chunk`` (W). Timing those calls gives each action's compute seconds, transfers
excluded, which is what osprey's estimates take from the Ray-actor runtime too. On a GPU the stream is
synchronized before each reading (kernels run asynchronously), which costs the overlap of one action's
kernels with the next action's launch. Ray-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

LatencyRow = tuple[int, str, int, float]
"""(stage, kind 'F', 'B', 'I' or 'W', micro-batch, seconds)."""


class ActionTimer:
    """Times every compute action torch's runtime runs on ``stages`` (this rank's ``PipelineStage``s)."""

    def __init__(self, stages: Sequence[Any]) -> None:
        self.rows: list[LatencyRow] = []
        """This step's actions so far, in the order they ran."""
        for stage in stages:
            self._wrap(stage)

    def _wrap(self, stage: Any) -> None:
        k = stage.stage_index
        cuda = torch.device(stage.device).type == "cuda"

        def timed(method: Callable[..., Any], kind: Callable[[dict[str, Any]], str]) -> Callable[..., Any]:
            def call(chunk: int, *args: Any, **kwargs: Any) -> Any:
                if cuda:
                    torch.cuda.synchronize(stage.device)
                t0 = time.perf_counter()
                out = method(chunk, *args, **kwargs)
                if cuda:
                    torch.cuda.synchronize(stage.device)
                self.rows.append((k, kind(kwargs), int(chunk), time.perf_counter() - t0))
                return out
            return call

        # torch's runtime passes full_backward by keyword (torch 2.13, pinned with the rest in torch_orders)
        stage.forward_one_chunk = timed(stage.forward_one_chunk, lambda kw: "F")
        stage.backward_one_chunk = timed(stage.backward_one_chunk,
                                         lambda kw: "B" if kw.get("full_backward", True) else "I")
        stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk, lambda kw: "W")

    def take(self) -> list[LatencyRow]:
        """The rows timed since the last call (one step's), and start afresh."""
        rows, self.rows = self.rows, []
        return rows


def stage_latencies(per_rank: Sequence[Sequence[LatencyRow]]) -> list[tuple[int, int, str, int, float]]:
    """One step's rows from every rank as the scheduler's ``pipeline`` observation of a single-replica
    plan: per (stage, kind, micro-batch) the slowest replica's seconds (a step ends when its slowest
    replica's pipeline does: the stage's gradient all-reduce waits for it), as (stage, 0, kind,
    micro-batch, seconds)."""
    slowest: dict[tuple[int, str, int], float] = {}
    for rows in per_rank:
        for k, kind, mb, seconds in rows:
            key = (k, kind, mb)
            slowest[key] = max(slowest.get(key, 0.0), seconds)
    return [(k, 0, kind, mb, s) for (k, kind, mb), s in sorted(slowest.items())]
