"""Weighted gradient all-reduce, bucketed and overlapped with the backward pass.

Each rank's gradient is multiplied by its weight ``w_i = b_i / B`` and SUM all-reduced, so every rank
ends with ``sum_i w_i g_i``: the mean gradient over the global batch. Parameters are grouped into
buckets of about ``bucket_bytes`` in reverse registration order (roughly the order backward produces
their gradients); a bucket's all-reduce starts asynchronously as soon as its last gradient is
accumulated (``register_post_accumulate_grad_hook``), while backward goes on with earlier layers.
Buckets launch strictly in index order on every rank, so collectives always match across ranks.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class WeightedGradSync:
    def __init__(self, params: list[torch.nn.Parameter], bucket_bytes: int = 4 << 20, overlap: bool = True):
        self.params = params
        self.distributed = dist.is_available() and dist.is_initialized()
        self.overlap = overlap and self.distributed
        self.buckets: list[list[torch.nn.Parameter]] = []
        current: list[torch.nn.Parameter] = []
        size = 0
        for p in reversed(params):
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self._bucket_of = {id(p): k for k, bucket in enumerate(self.buckets) for p in bucket}
        self._weight: float | None = None  # set while a step's backward runs
        self._pending = [0] * len(self.buckets)  # gradients still missing per bucket
        self._launched: list[tuple[torch.Tensor, object]] = []  # (flat buffer, async work) in bucket order
        self.launch_s = 0.0  # seconds spent this step flattening/scaling/launching inside backward
        if self.overlap:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad)

    def begin(self, weight: float) -> None:
        """Arm the hooks for one step's backward with this rank's weight."""
        self._weight = weight
        self._pending = [len(b) for b in self.buckets]
        self._launched = []
        self.launch_s = 0.0

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if self._weight is None:
            return  # a backward outside a pdml-ray step: not ours to combine
        k = self._bucket_of[id(p)]
        if self._pending[k] <= 0:
            raise RuntimeError("a parameter received a second gradient in one step (several backward passes "
                               "inside ctx.step?); accumulate outside the step or use overlap=False")
        self._pending[k] -= 1
        while len(self._launched) < len(self.buckets) and self._pending[len(self._launched)] == 0:
            self._launch(len(self._launched))

    def _launch(self, k: int) -> None:
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[k]]
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(self._weight)
        work = dist.all_reduce(flat, async_op=True) if self.distributed else None
        self._launched.append((flat, work))
        self.launch_s += time.perf_counter() - t0

    def abort(self) -> None:
        """Disarm after a failed step (its exception goes on to the caller)."""
        self._weight = None
        self._launched = []

    def finish(self, weight: float) -> None:
        """Wait for every bucket (launching those whose gradients never came) and write the result
        back into ``.grad``. Without overlap, this is where the one coalesced pass happens."""
        if self._weight is None:
            self.begin(weight)
        for k in range(len(self._launched), len(self.buckets)):
            self._launch(k)  # unused parameters, or overlap off: same order on every rank
        for (flat, work), bucket in zip(self._launched, self.buckets):
            if work is not None:
                work.wait()
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p)
                offset += n
        self._weight = None
        self._launched = []
