"""One training step inside the context: the batch a worker trains (``StepBatch``) and the step block
(``StepScope``): it applies importance weights and the wrapper's loss scale, times the step's compute
(ending where DDP's last gradient bucket is ready), sleeps for an EMULATED slow worker, and hands the
finished step to its ``PDMLContext``, which reports it once its compute time is known.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pdml_ray.emulation import emulate_speed, sleep_compute
from pdml_ray.errors import UsageError

if TYPE_CHECKING:
    from pdml_ray.train.context import PDMLContext


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One worker's share of one global step."""

    step: int
    epoch: int
    indices: np.ndarray  # int64 (b_i,): positions in the data set
    grad_weight: float  # b_i / (samples in this global step)
    decision_version: int
    sample_weights: np.ndarray | None = None  # float32 (b_i,) importance weights; None = uniform
    end_offset: int = 0  # position in the epoch once this step is done (a checkpoint resumes there)


class StepScope:
    """Times one step's compute, applies importance weights, combines gradients on exit."""

    def __init__(self, ctx: "PDMLContext", batch: StepBatch):
        self.ctx = ctx
        self.batch = batch
        self._per_sample: torch.Tensor | None = None
        self._ended, self._sleep_s = False, 0.0
        self._timed: list[tuple[int, float]] = []

    def loss(self, per_sample_loss: torch.Tensor) -> torch.Tensor:
        """Weighted mean of per-sample losses (shape (b_i,)); a zero-size batch gives a zero loss.

        Under FSDP2 the result also carries the factor ``w_i * world_size`` (see ``wrappers``)."""
        b = len(self.batch.indices)
        if per_sample_loss.dim() > 1 or per_sample_loss.numel() != b:
            raise UsageError(f"step.loss needs one loss per sample of this step's batch, shape ({b},); got shape "
                             f"{tuple(per_sample_loss.shape)}. Compute the loss with reduction='none' on exactly "
                             "the samples of batch.indices (a loss that is already a mean would be divided again)")
        self._per_sample = per_sample_loss.detach()
        w = self.batch.sample_weights
        # float(): half-precision losses meet float32 weights as the product used to promote them
        total = (per_sample_loss.sum() if w is None
                 else per_sample_loss.float() @ torch.as_tensor(w, device=per_sample_loss.device))
        scale = self.ctx._combiner.loss_scale(self.batch.grad_weight) if self.ctx._combiner is not None else 1.0
        return total * (scale / max(b, 1))

    def __enter__(self) -> "StepScope":
        if self.ctx._combiner is None:
            raise UsageError("call ctx.prepare_model(model) before the first ctx.step(batch)")
        self.ctx._combiner.begin(self.batch.grad_weight)
        self.ctx._timer.begin(self.batch.step)
        self.ctx._open_scope = self
        self._ended, self._sleep_s, self._timed = False, 0.0, []
        return self

    def compute_ended(self) -> None:
        """Backward's compute is done: DDP's last bucket calls this before launching that bucket's
        all-reduce, otherwise the end of the block does. An EMULATED slow worker sleeps here, before its
        last gradients go out, as a slower device would deliver them later (sleeping after the
        all-reduce would add the sleep to every rank's step instead of overlapping it). In the sleep
        compute mode every worker sleeps its batch's emulated compute time here."""
        if self._ended:
            return
        self._ended = True
        ctx, timer = self.ctx, self.ctx._timer
        timer.end()
        per_sample_s = ctx.config.node_priority.emulated_per_sample_s
        if per_sample_s is not None:  # sleep compute mode: the sleep is the (emulated) compute
            self._sleep_s = sleep_compute(len(self.batch.indices), per_sample_s, ctx.speed)
        elif ctx.speed < 1.0:  # waits only for this step's own compute (never a collective: it comes later)
            self._timed = timer.collect(block=True)
            mine = [span for step, span in self._timed if step == self.batch.step]
            if mine:
                launch_s = 0.0 if ctx.device.type == "cuda" else ctx._combiner.launch_s  # type: ignore[union-attr]
                self._sleep_s = emulate_speed(mine[0] - launch_s, ctx.speed)  # counts as compute

    def __exit__(self, exc_type, exc, tb) -> None:
        """Compute ended when the last gradient bucket became ready (DDP's hook ends the timer there:
        ``backward()`` itself returns only once every bucket is reduced), else now. The compute time is
        that of the compute stream (CUDA events, ``timing.py``; no synchronize, which would wait for the
        collectives too) and arrives a step late on a GPU; the step's report waits for it."""
        ctx, combiner, timer = self.ctx, self.ctx._combiner, self.ctx._timer
        assert combiner is not None  # checked in __enter__
        ctx._open_scope = None
        if exc_type is not None:
            timer.abort()  # the exception propagates to the user
            return
        self.compute_ended()
        # Launching the all-reduce from inside backward (flatten, scale) is communication, not compute:
        # it costs the same at any batch size, and counting it would skew the throughput shares. On a GPU
        # the host's launch time overlaps the kernels, so the event span needs no correction.
        launch_s = 0.0 if ctx.device.type == "cuda" else combiner.launch_s
        now = time.perf_counter()
        end = combiner.compute_end() or now
        timed = self._timed + timer.collect()
        wait_s = launch_s + max(0.0, now - end - self._sleep_s)  # backward's wait for the all-reduce
        ctx._finish_step(self.batch, wait_s, self._per_sample, launch_s, self._sleep_s)
        for step, span_s in timed:
            ctx._report_timed(step, span_s)


@dataclass(slots=True)
class _Untimed:
    """A finished step waiting for its compute time (a step late on a GPU) before it is reported."""

    batch: StepBatch
    wait_s: float
    step_s: float
    overhead_s: float
    per_sample: torch.Tensor | None
    launch_s: float
    sleep_s: float
