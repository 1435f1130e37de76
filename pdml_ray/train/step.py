"""One training step inside the context: the batch a worker trains (``StepBatch``) and the step block
(``StepScope``): it applies importance weights and the wrapper's loss scale, times the step's compute
(ending where DDP's last gradient bucket is ready), sleeps for an EMULATED slow worker, and hands the
finished step to its ``PDMLContext``, which reports it once its compute time is known.

Non-finite losses and gradients: ``nonfinite`` (the guard's rule, its counts and the gradient check);
the step block runs the guard (``_check_finite``, and the optimizer step pre-hook below).
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from pdml_ray.emulation import emulate_speed, sleep_compute
from pdml_ray.errors import NonFiniteError, UsageError
from pdml_ray.config import PDMLConfig
from pdml_ray.priority.selective_backprop import BackpropSelector
from pdml_ray.train.nonfinite import NonFiniteCounts, grads_nonfinite
from pdml_ray.train.timing import StepTimer
from pdml_ray.train.wrappers import GradientCombiner, nonfinite_flags

log = logging.getLogger(__name__)


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
    backprop_threshold: float | None = None  # selective-backprop: the cluster's percentile (None: this worker's)
    feedback: bool = True  # whether the sample table wants this step's per-sample losses (``SamplePlan.feedback``)
    uniform_weights: bool = False  # every sample weight is 1 (``SamplePlan.uniform``): the loss skips the product


_OPEN_SCOPES: "weakref.WeakSet[StepScope]" = weakref.WeakSet()  # step blocks being run in this process
_optimizer_guard_installed = False


def _before_optimizer_step(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
    """torch's global optimizer step pre-hook: an open step block checks its gradients first."""
    for scope in list(_OPEN_SCOPES):
        scope.before_optimizer_step()


def _install_optimizer_guard() -> None:
    """Once per process: every optimizer (the user's, whatever its class) runs the hook above. A global
    hook, because pdml-ray never sees the user's optimizer (there is no prepare_optimizer)."""
    global _optimizer_guard_installed
    if not _optimizer_guard_installed:
        register_optimizer_step_pre_hook(_before_optimizer_step)
        _optimizer_guard_installed = True


def _sequence_means(loss: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token losses (b, T) and the tokens that count (``mask`` (b, T), bool or 0/1; None: all): the
    masked losses (b, T), the counted tokens per sequence (b,), each sequence's mean over them (b,; 0
    for a sequence with none)."""
    if mask is not None and tuple(mask.shape) != tuple(loss.shape):
        raise UsageError(f"step.loss: the mask must have the per-token losses' shape {tuple(loss.shape)}, "
                         f"got {tuple(mask.shape)}")
    counted = (torch.ones_like(loss, dtype=torch.bool) if mask is None
               else mask.to(device=loss.device, dtype=torch.bool))
    masked = torch.where(counted, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))  # (b, T)
    tokens = counted.sum(dim=1)  # (b,) counted tokens per sequence
    return masked, tokens, masked.sum(dim=1) / tokens.clamp(min=1).to(masked.dtype)


class StepHost(Protocol):
    """What a step block needs of its worker's context (``PDMLContext`` is the one implementation): the run's
    config and rank, what ``prepare_model`` set up (the combiner, the trained parameters), the compute timer,
    and where a finished step goes. The underscored members are the context's scope-facing internals."""

    config: PDMLConfig
    rank: int
    world_size: int
    device: torch.device
    speed: float
    accelerator_type: str
    nonfinite: NonFiniteCounts
    overhead_s: float
    _combiner: GradientCombiner | None
    _params: list[torch.nn.Parameter]
    _timer: StepTimer
    _step_overhead: float
    _open_scope: "StepScope | None"
    backprop_selector: BackpropSelector | None

    def _finish_step(self, batch: StepBatch, wait_s: float, per_sample: torch.Tensor | None, launch_s: float,
                     sleep_s: float, forward_only: int = 0) -> None: ...

    def _report_timed(self, step: int, span_s: float) -> None: ...


class StepScope:
    """Times one step's compute, applies importance weights, combines gradients on exit."""

    def __init__(self, ctx: StepHost, batch: StepBatch):
        self.ctx = ctx
        self.batch = batch
        self._per_sample: torch.Tensor | None = None
        self._ended, self._sleep_s = False, 0.0
        self._timed: list[tuple[int, float]] = []
        self._guard: str | None = None  # "hook" (DDP: flags inside backward) or "sync" (in loss())
        self._flags: torch.Tensor | None = None
        self._flag_s = 0.0  # host seconds in loss()'s flag all-reduce (not compute)
        self.excluded: tuple[int, ...] = ()
        """Ranks whose contribution to this step was excluded (their loss was NaN or infinite)."""
        self.dropped = False
        """Whether this step's gradients were dropped (every rank excluded, or the combined gradient not
        finite): ``optimizer.step()`` (in the block after backward, or after the block) changes nothing."""
        self._checked = False  # the guard's check has run (at an optimizer step inside the block)
        self._loss_given = False  # step.loss was called in this block
        self._rows: torch.Tensor | None = None  # selective-backprop: the rows backprop_rows chose (k,) int64
        self.forward_only = 0
        """Samples of this step forwarded and not backpropagated (``backprop_rows``), the report's ``forward_only``."""
        self._stop_due: tuple[int | None, int] | None = None  # what that check found for ``_stop``

    def loss(self, loss: torch.Tensor, mask: torch.Tensor | None = None,
             reduction: str = "sequence", rows: torch.Tensor | None = None) -> torch.Tensor:
        """The loss this rank backpropagates, from the losses as the model gives them:

        - per sample, shape (b_i,) (``reduction="none"``): their importance-weighted mean;
        - per token, shape (b_i, T), with an optional ``mask`` (b_i, T) of the tokens that count (bool or
          0/1; a Hugging Face ``labels == -100`` position is False). ``reduction="sequence"`` (the default):
          each sequence's mean over its counted tokens is its sample's loss (0 for a sequence with none),
          then as above: the per-sequence mean over the global batch, exact under the ``b_i / B`` gradient
          weights with no communication. ``reduction="token"``: the mean over every counted token of the
          global batch, what one process computes on it (Hugging Face's loss with ``num_items_in_batch``):
          under ``b_i / B`` weighting it needs the global token count, so it costs one all-reduce of one
          number per step; refused with sample priorities (their weights are per sample);
        - already reduced, 0-d (``out.loss``): this rank's mean over its own samples. With the ``b_i / B``
          weights the ranks' means give the global mean exactly when each sample counts alike (a mean over
          samples, or over tokens when every sequence has the same number of counted tokens; with padding,
          pass the per-token losses and the mask). Refused with sample priorities, which need a loss per
          sample.

        ``rows`` (selective-backprop, after ``backprop_rows``): ``loss`` holds only the chosen rows' losses,
        (k,) or (k, T) in the order of ``rows``, and only they are backpropagated.

        A zero-size batch gives a zero loss. Under FSDP2 the result also carries the factor
        ``w_i * world_size`` (see ``wrappers``)."""
        b = len(self.batch.indices)
        w = self.batch.sample_weights
        if reduction not in ("sequence", "token"):
            raise UsageError(f"step.loss: reduction must be 'sequence' or 'token', got {reduction!r}")
        if rows is not None or self._rows is not None:
            return self._chosen_loss(loss, mask, reduction, rows)
        self._loss_given = True
        if loss.dim() == 0:
            if w is not None:
                raise UsageError("step.loss got a reduced (0-d) loss, but sample priorities are on: they weight "
                                 f"and score each sample, so pass one loss per sample, shape ({b},), or per token, "
                                 f"shape ({b}, T) (with reduction='none' in the loss function)")
            if mask is not None:
                raise UsageError("step.loss: a mask goes with per-token losses (b, T), not with a reduced loss")
            if b == 0:  # the mean of no samples is NaN: a zero loss through the parameters instead
                self._per_sample = loss.detach().new_zeros(0)
                return self._zero_loss()
            self._per_sample = loss.detach().reshape(1)  # its mean is the loss reported for the step
            return self._weighted(loss, 1)  # already a mean over this rank's b_i samples
        if loss.dim() == 2 and loss.shape[0] == b:
            masked, tokens, per_sequence = _sequence_means(loss, mask)
            if reduction == "sequence":
                return self._per_sample_loss(per_sequence)
            if w is not None:
                raise UsageError("step.loss: reduction='token' weighs tokens, sample priorities weigh samples; "
                                 "use reduction='sequence' with sample priorities")
            self._per_sample = per_sequence.detach()
            return self._weighted(masked.sum() * self._token_factor(tokens.sum(), b), b)
        if loss.dim() > 1 or loss.numel() != b:
            raise UsageError(f"step.loss needs one loss per sample of this step's batch, shape ({b},), one per "
                             f"token, shape ({b}, T), or this rank's mean (0-d); got shape {tuple(loss.shape)}. "
                             "Compute the loss with reduction='none' on exactly the samples of batch.indices")
        if mask is not None:
            raise UsageError("step.loss: a mask goes with per-token losses (b, T), not with per-sample ones")
        return self._per_sample_loss(loss)

    def _per_sample_loss(self, per_sample_loss: torch.Tensor) -> torch.Tensor:
        """Importance-weighted sum of per-sample losses (b_i,), as a mean (``_weighted``). Under
        selective-backprop (this masked form) only the chosen high-loss share counts: the mean over it
        (every sample forwarded is still reported and scored). The others' gradient is zero, but backward
        still runs over the whole batch (its graph was built over it: 1.02x a full step's time, measured
        on an MLP on the CPU), so they cost a trained sample's time and the report's ``forward_only``
        stays 0. ``backprop_rows`` with ``loss(..., rows=rows)`` gives the same gradient and saves that
        backward."""
        b = len(self.batch.indices)
        self._per_sample = per_sample_loss.detach()
        w = self.batch.sample_weights
        selector = self.ctx.backprop_selector
        if selector is not None and b:
            chosen = torch.as_tensor(selector.select(self._per_sample.float().cpu().numpy(),
                                                     self.batch.backprop_threshold),
                                     device=per_sample_loss.device)  # (b_i,) bool
            # the chosen mean as a mean over b_i (``_weighted`` divides by b_i): scale by b_i / chosen
            scale = b / max(int(chosen.sum()), 1)
            per_sample_loss = torch.where(chosen, per_sample_loss * scale, torch.zeros_like(per_sample_loss))
        # float(): half-precision losses meet float32 weights as the product used to promote them; a
        # uniform plan's weights are ones: the float32 sum, without copying them to the device
        total = (per_sample_loss.sum() if w is None
                 else per_sample_loss.float().sum() if self.batch.uniform_weights
                 else per_sample_loss.float() @ torch.as_tensor(w, device=per_sample_loss.device))
        return self._weighted(total, b)

    def backprop_rows(self, scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Selective-backprop that saves the backward: which rows of the batch to backpropagate, as
        positions (k,) int64 on the scores' device, ascending. ``scores``: the whole batch's losses from a
        forward without gradients (``torch.no_grad()``), per sample (b_i,) or per token (b_i, T) with
        ``mask`` as in ``loss``. The rows are the high-loss share by the mode's percentile (this worker's
        own, or the cluster's from the plan; ``BackpropSelector``), and every score goes back as this
        step's feedback. Forward the chosen rows again with gradients and pass their losses to
        ``loss(losses, rows=rows)``: the gradient is the masked form's, and the other ``b_i - k`` samples
        are reported as forward-only (``WorkerReport.forward_only``)."""
        selector, b = self.ctx.backprop_selector, len(self.batch.indices)
        if selector is None:
            raise UsageError("step.backprop_rows needs sample_priority.mode='selective-backprop'; in other modes "
                             "pass every sample's loss to step.loss(losses)")
        if self._rows is not None:
            raise UsageError("step.backprop_rows was already called in this step: call it once per step")
        if scores.requires_grad:
            raise UsageError("step.backprop_rows: score the batch under torch.no_grad() (its graph over the whole "
                             "batch is the backward selective-backprop saves); then forward the chosen rows again")
        if scores.dim() == 2 and scores.shape[0] == b:
            scores = _sequence_means(scores, mask)[2]
        elif scores.dim() != 1 or scores.numel() != b or mask is not None:
            raise UsageError(f"step.backprop_rows needs the whole batch's losses, shape ({b},), or per token "
                             f"({b}, T) with an optional mask of that shape; got {tuple(scores.shape)}")
        self._per_sample = scores.detach()  # the feedback: every sample forwarded
        chosen = selector.rows(self._per_sample.float().cpu().numpy(), self.batch.backprop_threshold)
        self._rows = torch.as_tensor(chosen, device=scores.device)
        self.forward_only = b - len(chosen)
        return self._rows

    def _chosen_loss(self, loss: torch.Tensor, mask: torch.Tensor | None, reduction: str,
                     rows: torch.Tensor | None) -> torch.Tensor:
        """``loss(..., rows=rows)``: the chosen rows' losses (k,) or (k, T), reduced as the masked form
        reduces them, the importance-weighted sum over the chosen rows scaled by ``b_i / k``, as a mean
        over ``b_i`` (``_weighted``): the chosen rows' mean, the masked form's loss and gradient."""
        chosen = self._rows
        if rows is None:
            raise UsageError("step.backprop_rows chose this step's rows: pass only their losses, as "
                             "step.loss(losses, rows=rows)")
        if chosen is None:
            raise UsageError("step.loss(..., rows=rows) takes the rows step.backprop_rows(scores) returned in this "
                             "step: call it first, on the whole batch's losses under torch.no_grad()")
        k, b = chosen.numel(), len(self.batch.indices)
        if rows.shape != chosen.shape or not torch.equal(rows.to(chosen.device), chosen):
            raise UsageError("step.loss(..., rows=rows): rows must be what step.backprop_rows returned in this step")
        if loss.dim() == 2 and loss.shape[0] == k and reduction == "sequence":
            loss = _sequence_means(loss, mask)[2]
        elif loss.dim() != 1 or loss.numel() != k or mask is not None:
            raise UsageError(f"step.loss(..., rows=rows) needs the {k} chosen rows' losses, shape ({k},), or per "
                             f"token ({k}, T) with reduction='sequence'; got {tuple(loss.shape)}")
        self._loss_given = True
        w = self.batch.sample_weights
        scale = b / max(k, 1)  # the chosen mean as a mean over b_i (``_weighted`` divides by b_i)
        total = (loss.sum() * scale if w is None else
                 loss.float() @ torch.as_tensor(w, device=loss.device)[chosen.to(loss.device)] * scale)
        return self._weighted(total, b)

    def _token_factor(self, tokens: torch.Tensor, b: int) -> float:
        """For the global token mean: this rank's token sum times this factor, weighted by ``b_i / B`` in
        the all-reduce, is the global token sum over the global token count: ``b_i / (w_i T)``, with
        ``w_i = b_i / B`` its sample share and T the global batch's counted tokens (one all-reduce)."""
        ctx = self.ctx
        count = tokens.detach().to(device=ctx.device, dtype=torch.float64).reshape(1)
        if ctx.world_size > 1 and dist.is_available() and dist.is_initialized():
            t0 = time.perf_counter()
            dist.all_reduce(count)  # every rank calls loss() once per step: the same collective everywhere
            self._flag_s += time.perf_counter() - t0  # communication, not compute
        total_tokens = float(count.item())
        weight = self.batch.grad_weight
        return b / (weight * total_tokens) if weight > 0 and total_tokens > 0 else 0.0

    def _weighted(self, total: torch.Tensor, b: int) -> torch.Tensor:
        """``total / b`` (a mean over this rank's samples) with the non-finite guard and the wrapper's scale."""
        combiner, weight = self.ctx._combiner, self.batch.grad_weight
        if combiner is not None and self.ctx.config.node.check_nonfinite and self._guard is None:
            weight, surrogate = self._guard_loss(weight)
            if surrogate is not None:
                return surrogate
        scale = combiner.loss_scale(weight) if combiner is not None else 1.0
        return total * (scale / max(b, 1))

    def _zero_loss(self) -> torch.Tensor:
        """A zero loss whose gradient reaches every trained parameter (as zeros), never the activations."""
        ctx = self.ctx
        return sum((p.sum() * 0.0 for p in ctx._params), torch.zeros((), device=ctx.device))

    def _guard_loss(self, weight: float) -> tuple[float, torch.Tensor | None]:
        """Is this rank's loss finite? DDP's hook takes it from here inside backward; otherwise the ranks
        agree now (one all-reduce), this rank's weight is renormalised over the finite ranks, and an
        excluded rank gets a loss whose gradient is zero (or, under FSDP2, its reduce-scatter input is)."""
        ctx, combiner = self.ctx, self.ctx._combiner
        assert combiner is not None and self._per_sample is not None
        ok = torch.isfinite(self._per_sample).all()  # a 0-d bool on the loss's device (True when empty)
        if combiner.guard(ok, ctx.rank, ctx.world_size):
            self._guard = "hook"
            return weight, None
        self._guard = "sync"
        n = ctx.world_size
        good = bool(ok)
        flags = nonfinite_flags(ok, ctx.rank, n, weight, ctx.device)
        if n > 1 and dist.is_available() and dist.is_initialized():
            t0 = time.perf_counter()
            dist.all_reduce(flags)  # the same collective on every rank: nobody skips one
            self._flag_s += time.perf_counter() - t0
        self._flags = flags
        good_w, total_w = float(flags[n:2 * n].sum()), float(flags[2 * n:].sum())
        renormalised = weight * (total_w / good_w) if good and good_w > 0 else 0.0
        if good and good_w == total_w:
            renormalised = weight  # nobody excluded: exactly the weight, bit for bit
        combiner.reweight(renormalised, not good)
        if good or combiner.name == "fsdp":  # FSDP2: its backward must run (the reduce-scatter is zeroed)
            return renormalised, None
        return renormalised, self._zero_loss()  # never through the non-finite activations

    def __enter__(self) -> "StepScope":
        if self.ctx._combiner is None:
            raise UsageError("call ctx.prepare_model(model) before the first ctx.step(batch)")
        self.ctx._combiner.begin(self.batch.grad_weight)
        self.ctx._combiner.excluded = False
        self.ctx._timer.begin(self.batch.step)
        self.ctx._open_scope = self
        self._ended, self._sleep_s, self._timed = False, 0.0, []
        self._guard, self._flags, self._flag_s, self.excluded, self.dropped = None, None, 0.0, (), False
        self._checked, self._stop_due, self._loss_given = False, None, False
        self._rows, self.forward_only = None, 0
        _install_optimizer_guard()
        _OPEN_SCOPES.add(self)
        return self

    def before_optimizer_step(self) -> None:
        """An optimizer steps inside this block: run the non-finite check now (once), so a step to be
        dropped loses its gradients before the optimizer reads them. P3 is left alone: its per-layer
        optimizers step during backward, before the gradients are complete."""
        combiner = self.ctx._combiner
        if self._guard is None or self._checked or combiner is None or combiner.name == "p3":
            return
        self._stop_due = self._check_finite()

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
        per_sample_s = ctx.config.node.emulated_per_sample_s
        if per_sample_s is not None:  # sleep compute mode: the sleep is the (emulated) compute
            self._sleep_s = sleep_compute(len(self.batch.indices), per_sample_s, ctx.speed)
        elif ctx.speed < 1.0:  # waits only for this step's own compute (never a collective: it comes later)
            self._timed = timer.collect(block=True)
            mine = [span for step, span in self._timed if step == self.batch.step]
            if mine:
                launch_s = 0.0 if ctx.device.type == "cuda" else ctx._combiner.launch_s  # type: ignore[union-attr]
                launch_s += 0.0 if ctx.device.type == "cuda" else self._flag_s  # loss()'s flag all-reduce
                self._sleep_s = emulate_speed(mine[0] - launch_s, ctx.speed)  # counts as compute

    def __exit__(self, exc_type, exc, tb) -> None:
        """Compute ended when the last gradient bucket became ready (DDP's hook ends the timer there:
        ``backward()`` itself returns only once every bucket is reduced), else now. The compute time is
        that of the compute stream (CUDA events, ``timing.py``; no synchronize, which would wait for the
        collectives too) and arrives a step late on a GPU; the step's report waits for it."""
        ctx, combiner, timer = self.ctx, self.ctx._combiner, self.ctx._timer
        assert combiner is not None  # checked in __enter__
        ctx._open_scope = None
        _OPEN_SCOPES.discard(self)
        if exc_type is not None:
            timer.abort()  # the exception propagates to the user
            return
        if not self._loss_given and (self.batch.sample_weights is not None
                                     or combiner.loss_scale(self.batch.grad_weight) != 1.0):
            timer.abort()
            why = ("sample priorities weight and score each sample" if self.batch.sample_weights is not None
                   else f"the {combiner.name} wrapper's gradient weight is a loss scale")
            raise UsageError(f"step {self.batch.step} ended without step.loss(...): {why}, so the loss must go "
                             "through it. Inside `with ctx.step(...) as step:` call step.loss(losses).backward() "
                             "with per-sample (b,) or per-token (b, T) losses")
        self.compute_ended()
        # Launching the all-reduce from inside backward (flatten, scale) is communication, not compute:
        # it costs the same at any batch size, and counting it would skew the throughput shares. On a GPU
        # the host's launch time overlaps the kernels, so the event span needs no correction.
        launch_s = 0.0 if ctx.device.type == "cuda" else combiner.launch_s + self._flag_s
        now = time.perf_counter()
        end = combiner.compute_end() or now
        timed = self._timed + timer.collect()
        wait_s = launch_s + max(0.0, now - end - self._sleep_s)  # backward's wait for the all-reduce
        stop = self._check_finite() if self._guard is not None and not self._checked else self._stop_due
        ctx._finish_step(self.batch, wait_s, self._per_sample, launch_s, self._sleep_s, self.forward_only)
        for step, span_s in timed:
            ctx._report_timed(step, span_s)
        if stop is not None:
            self._stop(*stop)

    def _check_finite(self) -> tuple[int | None, int] | None:
        """After backward: who was excluded (the flags, the same on every rank), whether the combined
        gradient is finite; drop the step's gradients if nothing finite is left to apply, and count.
        Returns what ``_stop`` needs when a limit is reached."""
        ctx, combiner = self.ctx, self.ctx._combiner
        assert combiner is not None
        t0 = time.perf_counter()
        flags = self._flags if self._guard == "sync" else combiner.flags()
        if flags is None:  # DDP: no bucket was reduced (no backward in the block yet): nothing to check
            return None
        self._checked = True
        n = ctx.world_size
        overflow = combiner.combined_nonfinite()  # DDP's hook knows from the norms; P3 has nothing to check
        if overflow is None:  # FSDP2: check the gradients, read with the flags (one wait for the device)
            found = grads_nonfinite(ctx._params, combiner.name == "fsdp", flags.device)
            flags = torch.cat([flags, found.to(flags.dtype)])
        host = flags.tolist()  # the step's wait for the device
        bad = tuple(j for j in range(n) if host[j] > 0.5) if max(host[:n]) > 0.5 else ()
        overflow = host[3 * n] > 0.0 if overflow is None else overflow
        # every rank excluded (or only empty batches left), or the combined gradient is not finite
        dropped = (bool(bad) and sum(host[n:2 * n]) <= 0.0) or overflow
        if dropped:
            for p in ctx._params:
                p.grad = None  # optimizer.step() skips parameters without a gradient: state untouched
        if ctx.rank in bad:
            self._per_sample = None  # NaN must not reach the report (nor the sample priorities)
        self.excluded, self.dropped = bad, dropped
        if (bad or dropped) and ctx.rank == 0:
            log.warning("step %d: %s%s", self.batch.step,
                        f"excluded worker(s) {list(bad)} (loss NaN or infinite), weights renormalised over the "
                        "others" if bad else "", ("; " if bad else "") + "gradients dropped (nothing finite to apply)"
                        if dropped else "")
        stop = ctx.nonfinite.record(self.batch.step, bad, dropped)
        dt = time.perf_counter() - t0
        ctx._step_overhead += dt
        ctx.overhead_s += dt
        return stop

    def _stop(self, rank: int | None, count: int) -> None:
        """Every rank raises the same error (they all hold the same flags): the run ends, nobody hangs."""
        ctx = self.ctx
        limit = ctx.config.node.max_consecutive_nonfinite
        step = self.batch.step
        if rank is None:
            raise NonFiniteError(
                f"the combined gradient was NaN or infinite in {count} consecutive steps (the last: step {step}) "
                "while every worker's loss was finite (an overflow inside backward, or parameters already "
                "non-finite); each time the step's gradients were dropped. Lower the learning rate, clip or "
                f"scale the gradients, or raise node_priority.max_consecutive_nonfinite (now {limit})")
        types = [ctx.accelerator_type] * ctx.world_size
        if ctx.world_size > 1 and dist.is_available() and dist.is_initialized():
            gathered: list[object] = [None] * ctx.world_size
            dist.all_gather_object(gathered, ctx.accelerator_type)  # every rank is here (same flags)
            types = [str(t) for t in gathered]
        total = ctx.nonfinite.excluded[rank]
        raise NonFiniteError(
            f"worker rank {rank} ({types[rank]}) had a NaN or infinite loss in {count} consecutive steps, the "
            f"last at step {step}; its contribution to each was excluded ({total} steps excluded in all) and "
            f"the run stops at step {step} after node_priority.max_consecutive_nonfinite={limit}. Check that "
            "worker's data and device (a NaN in its inputs, an overflow in its forward), or raise the limit")


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
    grad_norm: torch.Tensor | None = None
    """This rank's local gradient norm (0-d, on the device; ``GradientCombiner.local_grad_norm``)."""
    forward_only: int = 0
    """Samples forwarded and not backpropagated (``StepScope.backprop_rows``)."""
