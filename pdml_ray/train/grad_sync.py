"""Weighted gradient all-reduce, bucketed, in place, and overlapped with the backward pass.

Each rank's gradient is multiplied by its weight ``w_i = b_i / B`` and SUM all-reduced, so every rank
ends with ``sum_i w_i g_i``: the mean gradient over the global batch.

Parameters are grouped into buckets of about ``bucket_bytes`` in reverse registration order (roughly
the order backward produces their gradients). Each bucket owns one flat buffer and, at the start of a
step, every parameter's ``.grad`` becomes a view into it (like DDP's ``gradient_as_bucket_view``):
backward accumulates straight into the buffer, so there is no per-step allocation and no flatten
copy. A bucket's all-reduce starts asynchronously as soon as its last gradient has been accumulated
(``register_post_accumulate_grad_hook``) while backward goes on with earlier layers. Buckets launch
strictly in index order on every rank, so collectives always match across ranks.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from pdml_ray.errors import UsageError


class WeightedGradSync:
    def __init__(self, params: list[torch.nn.Parameter], bucket_bytes: int = 4 << 20, overlap: bool = True):
        self.params = params
        self.distributed = dist.is_available() and dist.is_initialized()
        self.overlap = overlap and self.distributed
        self.buckets: list[list[torch.nn.Parameter]] = []
        current: list[torch.nn.Parameter] = []
        size = 0
        for p in reversed(params):
            if current and (p.dtype != current[0].dtype or p.device != current[0].device):
                self.buckets.append(current)  # one dtype and device per flat buffer
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.buffers = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                        for b in self.buckets]
        self._views: dict[int, torch.Tensor] = {}
        for bucket, buffer in zip(self.buckets, self.buffers):
            offset = 0
            for p in bucket:
                self._views[id(p)] = buffer[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self._bucket_of = {id(p): k for k, bucket in enumerate(self.buckets) for p in bucket}
        self._weight: float | None = None  # set while a step's backward runs
        self._pending = [0] * len(self.buckets)  # gradients still missing per bucket
        self._works: list[Any] = []  # async all-reduce handles (dist.Work or None), in bucket order
        self.launch_s = 0.0  # seconds this step spent scaling/launching inside backward
        if self.overlap:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad)

    def begin(self, weight: float) -> None:
        """Arm the hooks for one step's backward with this rank's weight; point grads at the buffers."""
        self._weight = weight
        self._pending = [len(b) for b in self.buckets]
        self._works = []
        self.launch_s = 0.0
        for buffer in self.buffers:
            buffer.zero_()
        for p in self.params:
            p.grad = self._views[id(p)]

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if self._weight is None:
            return  # a backward outside a pdml-ray step: not ours to combine
        k = self._bucket_of[id(p)]
        if self._pending[k] <= 0:
            raise UsageError("a parameter received a second gradient in one step (several backward passes "
                               "inside ctx.step?); accumulate outside the step or use overlap=False")
        self._pending[k] -= 1
        while len(self._works) < len(self.buckets) and self._pending[len(self._works)] == 0:
            self._launch(len(self._works))

    def _launch(self, k: int) -> None:
        t0 = time.perf_counter()
        for p in self.buckets[k]:
            view = self._views[id(p)]
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():  # replaced (or never set) by the user
                view.copy_(p.grad) if p.grad is not None else view.zero_()
                p.grad = view
        assert self._weight is not None  # launched only between begin() and finish()
        buffer = self.buffers[k].mul_(self._weight)
        self._works.append(dist.all_reduce(buffer, async_op=True) if self.distributed else None)
        self.launch_s += time.perf_counter() - t0

    def abort(self) -> None:
        """Disarm after a failed step (its exception goes on to the caller)."""
        self._weight = None
        self._works = []

    def finish(self) -> None:
        """Launch what backward did not (unused parameters, or overlap off: same order on every rank)
        and wait for all buckets; ``.grad`` then holds the combined gradient."""
        if self._weight is None:
            raise UsageError("finish() without begin(): the step's gradients were never pointed at the buckets")
        for k in range(len(self._works), len(self.buckets)):
            self._launch(k)
        for work in self._works:
            if work is not None:
                work.wait()
        self._weight = None
        self._works = []
