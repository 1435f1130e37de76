"""The P3 all-reduce runtime: P3 ordering for all-reduce users in the Ray Train path.

    model, p3 = p3_sync.prepare(ctx, model, torch.optim.SGD(model.parameters(), lr=0.1))
    for batch in ctx.epoch(epoch, n):
        with ctx.step(batch) as step:
            step.loss(loss_fn(model(x[batch.indices]), y[batch.indices])).backward()
        # no optimizer.step(): each layer's update is applied when its reduction is complete
    p3.finish()                                   # before evaluating, saving or leaving the loop

What happens (and why it is not DDP): DDP all-reduces buckets during backward and ``backward()``
returns only when every bucket is reduced: the end-of-backward barrier. Here

- every layer's gradient (a layer: a module with parameters of its own, in registration order =
  forward order for the usual models) is copied, weighted by ``b_i / B`` (node priorities), as soon as
  all its parameters have accumulated (``register_post_accumulate_grad_hook``), and cut into slices
  (``pdml_ray.p3.slicing``); each slice is one asynchronous SUM all-reduce;
- the slices are issued in a **fixed order, the same on every rank** (gloo and NCCL match collectives
  by their order). P3 reorders at run time by what is ready and what the link is doing, which would
  differ between ranks, so the order is fixed in advance: the ``WARMUP_STEPS`` first steps issue in
  backward order (FIFO) and measure when each layer's gradient becomes ready and the link's bandwidth
  (or use the EMULATED link); then the ranks agree on those measurements (one small all-reduce: the
  latest ready times, the lowest bandwidth) and every rank computes the same order by running the P3 priority queue over
  them (``pdml_ray.p3.simulate.send_order``: the order P3 would send in, preemptions included). A slice
  is issued once it is ready and every slice before it in that order has been issued; holding back a
  ready slice costs nothing while the link is busy with earlier ones, which is when P3 reorders;
- the next forward waits **per layer**: a forward pre-hook waits for that layer's slices only, then
  applies that layer's optimizer step (one optimizer per layer, split from yours), so layer 0 computes
  while later layers are still being reduced. The gain: the forward of the first layers overlaps the
  reduction of the rest; the reductions P3 moves forward are those still queued when backward ends.

Slice size and credit window come from the run's scheduler, its ``p3`` axis (``pdml_ray.priority.p3``),
through the context's client like every other decision: the config's own values (published as the
axis's first decision), or with ``P3Config.auto`` the rule of ``pdml_ray.p3.auto`` over the link this
runtime measured in its warm-up (rank 0 sends the agreed figures with ``ctx.observe``). A new decision
arrives with a boundary's bundle, every rank adopts it there, and at its effective step (``begin``)
every rank flushes the pending reductions, re-slices and re-plans its order: the same step on every
rank, never a wait on the scheduler inside a step.

Baselines (``P3Config.policy``): ``fifo`` keeps backward order, one all-reduce per slice; ``layer-fifo``
one all-reduce per layer, whole (the P3 paper's baseline); ``bucketed``
groups the slices as DDP groups parameters (``pdml_ray.p3.queue.ddp_buckets``: reverse order, buckets
of ``bucket_bytes``) and reduces each bucket with one all-reduce over a copy of its slices once all of
them are ready, in the order buckets complete. Both keep the per-layer waits of the next forward, so
the three differ only in what goes on the wire when (plain DDP would add its end-of-backward barrier).

Parameters after K steps equal FIFO's and single-process training's on the same global batches (the
order changes timing only); ``tests/ray/test_p3_allreduce_ray.py`` checks both to 1e-5.

Limits: only optimizers whose step is per parameter can be split per layer (``PER_PARAMETER_OPTIMIZERS``:
SGD, Adam, AdamW, ...); others (LBFGS, or anything coupling parameters) are refused. Learning-rate
schedulers on your optimizer do not reach the per-layer ones: use ``p3.set_lr``. No gradient
accumulation over several backward calls per step; buffers (BatchNorm statistics) are broadcast from
rank 0 once at the start, not every step. The order is planned from the warm-up's measurements (and
again with them when a new slice size or credit arrives). A resumed run runs the config's slicing until
the first bundle it asks for brings the scheduler's current one again (one decision interval), and
measures again. Compute time
excludes the forward's waits on the CPU; on a GPU the CUDA-event span still includes them (the node
priorities then see communication as compute).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from pdml_ray.config.p3 import P3Config
from pdml_ray.decisions import P3Decision
from pdml_ray.errors import UsageError
from pdml_ray.p3.link import EmulatedLink, LinkModel
from pdml_ray.p3.ps import model_layers
from pdml_ray.p3.queue import ddp_buckets, layer_groups
from pdml_ray.p3.simulate import send_order
from pdml_ray.p3.slicing import SlicePlan, plan_slices, unflatten_layer
from pdml_ray.train.wrappers import GradientCombiner, is_fsdp2

log = logging.getLogger(__name__)

PER_PARAMETER_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
    torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.Rprop, torch.optim.ASGD)
"""Optimizers whose update of a parameter reads only that parameter's gradient and state: one instance
per layer does exactly what one instance over the whole model does."""

WARMUP_STEPS = 3
"""Steps issued in backward order while measuring (step 0 pays one-off costs, so 1 and 2 are measured)."""


class AxisSource(Protocol):
    """Where ``P3AllReduce`` gets the scheduler's ``p3`` decisions and sends what it measured: the Ray
    Train context (``PDMLContext``), whose bundles every rank adopts at the same boundary."""

    global_step: int
    """The step being run (the scheduler stamps decisions with these steps; a resumed run's count on)."""

    def axis_decision(self, axis: str, step: int) -> Any:
        """The newest decision of ``axis`` adopted for a step <= ``step``, or None."""
        ...

    def observe(self, axis: str, step: int, rows: list[tuple]) -> None:
        """One step's telemetry for ``axis`` to the scheduler (rank 0 sends; fire-and-forget)."""
        ...


@dataclass(frozen=True, slots=True)
class IssuePlan:
    """The order every rank issues its slices' all-reduces in."""

    order: tuple[int, ...]  # slice indices (``SlicePlan.slices``)
    policy: str
    source: str  # how the order was made
    layer_ready_s: tuple[float, ...] = ()  # measured: seconds after the first layer was ready
    bandwidth_Bps: float | None = None
    messages: tuple[tuple[int, ...], ...] = ()  # slices reduced together (``bucketed``); empty: one per slice

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The collectives in issue order, each the slices it reduces."""
        return self.messages or tuple((i,) for i in self.order)


def check_per_parameter(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, PER_PARAMETER_OPTIMIZERS):
        names = ", ".join(c.__name__ for c in PER_PARAMETER_OPTIMIZERS)
        raise UsageError(f"P3 ordering applies the optimizer per layer as each reduction completes, which only "
                         f"optimizers whose step is per parameter allow ({names}); got {type(optimizer).__name__}. "
                         "Use one of those, or train with DDP (leave PDMLConfig.p3 unset)")


def split_optimizer(optimizer: torch.optim.Optimizer,
                    layers: Sequence[Sequence[nn.Parameter]]) -> list[torch.optim.Optimizer | None]:
    """One optimizer of the same class per layer, with each parameter's group hyper-parameters and
    state (None for a layer none of whose parameters the optimizer holds)."""
    check_per_parameter(optimizer)
    out: list[torch.optim.Optimizer | None] = []
    for params in layers:
        mine = {id(p) for p in params}
        groups = []
        for group in optimizer.param_groups:
            chosen = [p for p in group["params"] if id(p) in mine]
            if chosen:
                groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": chosen})
        if not groups:
            out.append(None)
            continue
        optimizer_class: Any = type(optimizer)  # its own defaults; each group carries its hyper-parameters
        layer_opt = optimizer_class(groups)
        for group in groups:
            for p in group["params"]:
                if p in optimizer.state:
                    layer_opt.state[p] = optimizer.state[p]
        out.append(layer_opt)
    return out


@dataclass(frozen=True, slots=True)
class _Pending:
    """One slice's reduction, issued and not yet applied."""

    step: int
    index: int  # slice
    work: Any  # the collective's handle (None on one rank)
    arrival: float | None  # EMULATED arrival (perf_counter)
    buffer: torch.Tensor | None  # a bucket's reduction buffer (None: the slice was reduced in place)
    offset: int  # the slice's first element in ``buffer``


@dataclass(slots=True)
class _Layer:
    name: str
    module: nn.Module
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer | None

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)


class P3AllReduce(GradientCombiner):
    """Per-slice asynchronous all-reduces in one fixed priority order; per-layer waits and updates."""

    name = "p3"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, config: P3Config | None = None,
                 world_size: int | None = None, group: Any = None, record_timeline: bool = False,
                 axis: AxisSource | None = None) -> None:
        """``axis``: where the ``p3`` decisions come from (``prepare`` passes the context); without one the
        config's slice size and credit stay, and ``P3Config.auto`` is refused (it decides in the scheduler)."""
        if isinstance(model, nn.parallel.DistributedDataParallel) or is_fsdp2(model):
            raise UsageError("P3 ordering replaces DDP's and FSDP's own reduction: pass the plain module "
                             "(p3_sync.prepare(ctx, module, optimizer)), not a DDP or fully_shard model")
        self.config = config or P3Config()
        if self.config.auto and axis is None:
            raise UsageError("P3Config.auto is decided by the run's scheduler (its p3 axis): train through "
                             "p3_sync.prepare(ctx, ...) in a PDMLTrainer loop, or set slice_elements and credit_bytes "
                             "and auto=False")
        self.axis = axis
        self.decision: P3Decision | None = None
        """The scheduler's ``p3`` decision this runtime runs (None: the config's, no decision adopted yet)."""
        self.credit_bytes: float = self.config.effective_credit_bytes
        self.group = group
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = world_size if world_size is not None else (dist.get_world_size(group) if distributed else 1)
        if self.world_size > 1 and not distributed:
            raise UsageError("P3 all-reduce over several ranks needs an initialised torch.distributed process group")
        found = model_layers(model)
        if not found:
            raise UsageError("the model has no trainable parameters for P3 to synchronise")
        optimizers = split_optimizer(optimizer, [params for _, _, params in found])
        self.layers = [_Layer(n, m, ps, o) for (n, m, ps), o in zip(found, optimizers)]
        self.plan: SlicePlan = plan_slices([layer.numel for layer in self.layers], self.config.slice_elements,
                                           self.config.element_size)
        self.issue_plan = self._baseline_plan()
        self._warm_ready: list[list[float]] = []  # per warm-up step 1..: each layer's ready time
        self._measured: tuple[tuple[float, ...], LinkModel] | None = None  # agreed ready times and link
        bw = self.config.emulated_bandwidth_gbps
        self.link_model = LinkModel(bw * 1e9 / 8, self.config.emulated_latency_us * 1e-6) if bw else None
        self.link = EmulatedLink(self.link_model) if self.link_model else None
        # a ring all-reduce moves 2 (n - 1) / n of the data through each rank's link
        self.wire_factor = 2.0 * (self.world_size - 1) / self.world_size if self.world_size > 1 else 1.0
        self.record_timeline = record_timeline
        self.timeline: list[tuple[str, int, int, float]] = []  # (kind, step, layer or slice, perf_counter)
        self.weight = 1.0
        self.step = -1  # the step begun last
        self._layer_of = {id(p): i for i, layer in enumerate(self.layers) for p in layer.params}
        self._flats: list[torch.Tensor | None] = [None] * len(self.layers)
        self._inflight: list[list[_Pending]] = [[] for _ in self.layers]  # per layer: reductions not applied yet
        self._done_at: dict[tuple[int, int], float] = {}  # (step, slice) -> when the real reduction finished
        # per step (``_reset_step``)
        self._remaining: list[int] = []  # parameters of each layer still to accumulate
        self._ready: list[bool] = []  # per slice
        self._ready_s: list[float] = []  # per layer, seconds after the first layer was ready
        self._layers_ready, self._next = 0, 0  # layers ready; position in the issue order
        self._first_ready: float | None = None
        self._compute_end: float | None = None
        self._launch: float = 0.0
        self._launch_before_end: float | None = None
        self._forward_wait = 0.0
        self._first_issue: float | None = None
        self._last_done: float | None = None
        self._reset_step()
        if self.world_size > 1:  # every rank starts from rank 0's parameters and buffers, as DDP does
            with torch.no_grad():
                for t in list(model.parameters()) + list(model.buffers()):
                    dist.broadcast(t.data, 0, group=group)
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for layer in self.layers for p in layer.params]
        self._handles += [layer.module.register_forward_pre_hook(functools.partial(self._before_forward, i))
                          for i, layer in enumerate(self.layers)]

    # -- the step's lifecycle (GradientCombiner) ------------------------------------------------
    def begin(self, weight: float) -> None:
        self.weight = float(weight)
        if 1 <= self.step < WARMUP_STEPS:
            self._warm_ready.append(list(self._ready_s))  # the warm-up step that just ended (not step 0)
        self.step += 1
        if self.step == WARMUP_STEPS and (self.config.policy == "p3" or self.axis is not None):
            self._measure_warmup()  # a baseline without a scheduler needs no order and reports no link
        decision = self.axis.axis_decision("p3", self.axis.global_step) if self.axis is not None else None
        if isinstance(decision, P3Decision) and decision is not self.decision:
            self._adopt(decision)
        self._reset_step()

    def combined_nonfinite(self) -> bool:
        """False: P3 holds the gradients itself and applies them per layer as their slices arrive, so the
        step's end has no combined gradient to check (the guard's flags still exclude a rank's NaN loss)."""
        return False

    def compute_end(self) -> float | None:
        """When backward's compute ended; also issues what backward left (see ``end_backward``)."""
        self.end_backward()
        return self._compute_end

    @property
    def launch_s(self) -> float:
        """Seconds inside the step's timed span that are not compute: launching the reductions during
        backward and, in the forward, waiting for the previous step's reductions and applying their
        updates (under DDP both happen outside the span: the optimizer step comes after the block). On
        a GPU the step's CUDA-event span still includes the forward's waits (see the limits above)."""
        launch = self._launch_before_end if self._launch_before_end is not None else self._launch
        return launch + self._forward_wait

    def end_backward(self) -> None:
        """Backward is over: layers that got no gradient (unused this step) are reduced as zeros so that
        every rank issues the same collectives. ``ctx.step`` calls it; call it yourself without one."""
        for i in range(len(self.layers)):
            if self._remaining[i] > 0:
                self._remaining[i] = 0
                self._layer_ready(i, time.perf_counter())

    def finish(self) -> None:
        """Wait for every reduction and apply every pending update (end of training, evaluation on other
        code paths, checkpoints)."""
        for i in range(len(self.layers)):
            self._apply(i)

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every per-layer optimizer (a scheduler on yours does not reach them)."""
        for layer in self.layers:
            if layer.optimizer is not None:
                for group in layer.optimizer.param_groups:
                    group["lr"] = lr

    def remove(self) -> None:
        """Detach the hooks (after ``finish``)."""
        for h in self._handles:
            h.remove()

    # -- hooks ------------------------------------------------------------------------------------
    def _on_grad(self, param: torch.Tensor) -> None:
        t0 = time.perf_counter()
        i = self._layer_of[id(param)]
        self._remaining[i] -= 1
        if self._remaining[i] == 0:
            self._layer_ready(i, t0)
        self._launch += time.perf_counter() - t0

    def _layer_ready(self, i: int, now: float) -> None:
        layer = self.layers[i]
        if self._first_ready is None:
            self._first_ready = now
        with torch.no_grad():
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in layer.params]).mul_(self.weight)
        for p in layer.params:
            p.grad = None  # the next backward starts afresh; a user's zero_grad() cannot touch the buffer
        if self._inflight[i]:  # last step's update never ran (this layer's forward was skipped)
            self._apply(i)
        self._flats[i] = flat
        self._ready_s[i] = now - self._first_ready
        for s in self.plan.slices_of(i):
            self._ready[s.index] = True
        self._layers_ready += 1
        if self._layers_ready == len(self.layers):  # backward's compute is done (before the last launches)
            self._compute_end = now
            self._launch_before_end = self._launch
            if self.on_compute_end is not None:
                self.on_compute_end()
        self._issue()

    def _issue(self) -> None:
        groups = self.issue_plan.groups
        while self._next < len(groups) and all(self._ready[i] for i in groups[self._next]):
            items = [self.plan.slices[i] for i in groups[self._next]]
            views = []
            for s in items:
                flat = self._flats[s.layer]
                assert flat is not None
                views.append(flat[s.start:s.stop])
            # one slice: reduced in place; a bucket: one collective over a copy of its slices (as DDP's buffer)
            buffer = torch.cat(views) if len(items) > 1 else None
            work = None
            if self.world_size > 1:
                work = dist.all_reduce(buffer if buffer is not None else views[0], group=self.group, async_op=True)
                keys = [(self.step, s.index) for s in items]
                work.get_future().then(functools.partial(self._mark_done, keys))
            nbytes = sum(s.nbytes for s in items)
            arrival = self.link.send(int(nbytes * self.wire_factor)) if self.link is not None else None
            issued = time.perf_counter()
            offset = 0
            for s in items:
                self._inflight[s.layer].append(_Pending(self.step, s.index, work, arrival, buffer, offset))
                offset += s.numel
                if self.record_timeline:
                    self.timeline.append(("issue", self.step, s.index, issued))
            self._first_issue = issued if self._first_issue is None else self._first_issue
            self._next += 1

    def _mark_done(self, keys: list[tuple[int, int]], _future: Any) -> None:
        now = time.perf_counter()  # runs on the backend's thread: dict stores only
        for key in keys:
            self._done_at[key] = now

    def _before_forward(self, i: int, _module: nn.Module, _args: Any) -> None:
        t0 = time.perf_counter()
        self._apply(i)
        self._forward_wait += time.perf_counter() - t0
        if self.record_timeline:
            self.timeline.append(("forward", self.step, i, time.perf_counter()))

    def _apply(self, i: int) -> None:
        """Wait for layer ``i``'s slices, then step its optimizer on the reduced gradient."""
        entries = self._inflight[i]
        if not entries:
            return
        layer = self.layers[i]
        flat = self._flats[i]
        assert flat is not None
        for e in entries:
            if e.work is not None:
                e.work.wait()
            if e.arrival is not None and self.link is not None:
                self.link.wait_until(e.arrival)
            if e.buffer is not None:  # a bucket's slice: copy the reduced values back into the layer
                s = self.plan.slices[e.index]
                flat[s.start:s.stop].copy_(e.buffer[e.offset:e.offset + s.numel])
            done = max(self._done_at.pop((e.step, e.index), time.perf_counter()), e.arrival or 0.0)
            self._last_done = max(self._last_done or done, done)
            if self.record_timeline:
                self.timeline.append(("done", e.step, e.index, done))
        with torch.no_grad():
            for p, g in zip(layer.params, unflatten_layer(flat, layer.params)):
                p.grad = g
            if layer.optimizer is not None:
                layer.optimizer.step()
            for p in layer.params:
                p.grad = None
        self._inflight[i] = []

    # -- bookkeeping --------------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._remaining = [len(layer.params) for layer in self.layers]
        self._ready = [False] * len(self.plan.slices)
        self._ready_s = [0.0] * len(self.layers)
        self._layers_ready, self._next = 0, 0
        self._first_ready = None
        self._compute_end = None
        self._launch, self._launch_before_end = 0.0, None
        self._forward_wait = 0.0  # this step's forward: waiting for reductions, applying updates
        self._first_issue = None
        self._last_done = None  # the latest reduction of this step's slices applied so far

    def _baseline_plan(self) -> IssuePlan:
        """The issue plan of the current slicing before the P3 order is planned (and for the baselines
        always): backward order, last layer's slices first; DDP-like buckets; whole layers."""
        backward = tuple(s.index for layer in reversed(range(len(self.layers))) for s in self.plan.slices_of(layer))
        if self.config.policy == "bucketed":  # DDP's buckets, each one collective once all its slices are ready
            buckets = tuple(tuple(s.index for s in b) for b in ddp_buckets(self.plan, self.config.bucket_bytes))
            return IssuePlan(tuple(i for b in buckets for i in b), "bucketed",
                             f"DDP-like buckets of ~{self.config.bucket_bytes:,d} bytes in reverse parameter "
                             "order, one all-reduce each", messages=buckets)
        if self.config.policy == "layer-fifo":  # P3's paper baseline: each layer one collective, whole
            layers = tuple(tuple(s.index for s in g) for g in layer_groups(self.plan))
            return IssuePlan(backward, "layer-fifo", "backward order, one all-reduce per layer", messages=layers)
        return IssuePlan(backward, "fifo", "backward order (the warm-up measures; fifo keeps it)")

    def _adopt(self, decision: P3Decision) -> None:
        """The scheduler's slice size and credit, from this step on (every rank at the same step): the
        pending reductions are applied first, then the layers are re-sliced and the order re-planned."""
        decision.validate()
        self.decision = decision
        self.credit_bytes = decision.credit_bytes
        if decision.slice_elements != self.plan.slice_elements:
            self.finish()  # every reduction of the old slicing is applied before the new one is issued
            self.plan = plan_slices(self.plan.layer_numels, decision.slice_elements, self.config.element_size)
            self.issue_plan = self._baseline_plan()
        if self._measured is not None and self.config.policy == "p3":
            self._plan_p3()
        log.info("step %d: P3 runs %s", decision.effective_step, decision)

    def _measure_warmup(self) -> None:
        """Agree on the warm-up steps' measurements across ranks, send the link to the scheduler's ``p3``
        axis (rank 0), and derive the P3 order from them (see the module docstring). Every rank calls this
        at the same point (``begin`` of step WARMUP_STEPS). Ready times: per layer the least over warm-up
        steps 1.. (step 0 pays one-off costs; the least is the one least disturbed by other processes),
        then the latest over ranks."""
        first_issue = self._first_issue
        self.finish()  # the last warm-up step's updates (order irrelevant): its reductions are now measured
        nbytes = self.plan.total_bytes * self.wire_factor
        if self.link_model is not None:
            bandwidth = self.link_model.bandwidth_Bps
        else:
            # first issue to last completion: the link's rate (low when it idled waiting for gradients)
            span = (self._last_done - first_issue) if self._last_done and first_issue else 0.0
            bandwidth = nbytes / span if span > 0 else 1e12
        least = [min(step[i] for step in self._warm_ready) for i in range(len(self.layers))]
        measured = torch.tensor(least + [-bandwidth], dtype=torch.float64)
        if self.world_size > 1:
            dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=self.group)  # latest ready, lowest bandwidth
        ready = tuple(float(v) for v in measured[:-1])
        link = LinkModel(-float(measured[-1]) / self.wire_factor, self.config.emulated_latency_us * 1e-6)
        self._measured = (ready, link)
        if self.axis is not None:  # per-message overhead: not measured here (0, as the link model's default)
            self.axis.observe("p3", self.axis.global_step, [(link.bandwidth_Bps, link.latency_s, link.overhead_s)])
        if self.config.policy == "p3":
            self._plan_p3()
        log.info("P3 link measured in the warm-up: %s", link.describe() if self.link_model is not None else
                 f"{link.bandwidth_Bps * 8 / 1e9:.3g} Gb/s")

    def _plan_p3(self) -> None:
        """The P3 order of the current slicing and credit over the warm-up's ready times and link."""
        assert self._measured is not None
        ready, link = self._measured
        order = send_order(self.plan, "p3", ready, link, self.credit_bytes)
        self.issue_plan = IssuePlan(order, "p3", "the P3 queue over the warm-up's ready times and link (agreed by all ranks)",
                                    ready, link.bandwidth_Bps)


def prepare(ctx: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
            record_timeline: bool = False) -> tuple[nn.Module, P3AllReduce]:
    """Train ``model`` (a plain module) under P3 ordering in a ``PDMLTrainer`` loop: ``ctx`` is
    ``get_context()``, whose ``PDMLConfig.p3`` is the config (the scheduler's ``p3`` axis decides from
    it). Returns the model (on the context's device; the module itself, no wrapper) and the
    ``P3AllReduce`` driving it."""
    config = ctx.config.p3
    if config is None:
        raise UsageError("P3 ordering takes its slice size and credit from the run's scheduler, whose p3 axis "
                         "PDMLConfig.p3 enables: pass PDMLConfig(p3=P3Config(...)) to PDMLTrainer")
    model = model.to(ctx.device)
    sync = P3AllReduce(model, optimizer, config, world_size=ctx.world_size, record_timeline=record_timeline, axis=ctx)
    setattr(model, "pdml_combiner", sync)  # ctx.prepare_model (wrappers.combiner_for) takes the combiner a model brings
    try:
        model = ctx.prepare_model(model)
    finally:
        delattr(model, "pdml_combiner")
    return model, sync
