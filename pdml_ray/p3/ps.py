"""The P3 parameter-server runtime's core (``pdml_ray.runtime.p3_ps`` drives it), without Ray: P3 as
published, over a parameter server (Jayarajan et al., 2019).

The worker side; the shards' side is ``pdml_ray.p3.shard`` (``ShardState``, the ``ShardTransport`` to it,
and ``LocalShardTransport`` for one process). The Ray shells (``pdml_ray.actors.p3_ps``) wrap both, and
unit tests drive them in one process:

- ``P3PSWorker``: a worker with a model replica and its share of every global batch. Parameter hooks
  (``register_post_accumulate_grad_hook``) cut a layer's weighted gradient into slices as soon as
  backward has produced it and push them to the uplink's send queue (``pdml_ray.p3.queue``: ``p3``,
  ``fifo`` or ``bucketed``); a sender thread hands messages to the EMULATED uplink
  (``pdml_ray.p3.link.EmulatedLink``: the message arrives when it would over the modelled link).
  The gradients go to the shards through ``ShardTransport.push`` (one call per layer or message and
  shard, whose future is the updated slices: push and pull in one round trip). An updated slice goes
  through the worker's downlink the same way (a send queue of the same policy, then the EMULATED
  downlink). The next forward waits per layer,
  in a forward pre-hook, only for that layer's slices, then copies them into the layer's parameters:
  the first layers compute while the later ones are still on the wire.

**Real transfer and EMULATED link.** Every gradient slice really goes to its shard (a Ray actor call
in the runtime) and every updated slice really comes back; *when* it counts as arrived is the
EMULATED link's business: a slice is at the shard when the link model says its message has arrived,
and its update enters the downlink's send queue at that moment (the shard has applied it, in the
model); it has arrived when the downlink model says so *and* the shard's real answer is back,
whichever is later. Ray's transfer of the value happens during the modelled one, not after it: the
answer to a layer's push is one call that waits for every worker's push of that layer, which for
the large last layer took ~60 ms on a 2-core machine, and waiting for it before starting the modelled
download counted the transfer twice, on P3's critical path (the last layer is the last the next
forward needs). ``transfer`` says when the real push is made:

- ``layer`` (default): one call per layer and shard as soon as the layer's gradient exists. The real
  work is then the same for every send policy (one call per layer and shard), so the policies differ
  only in the order and timing of the modelled wire, which is what they are about. On a small machine
  a Ray call costs milliseconds of CPU (serialising, the object store, the actors' event loops), far
  more than a real network stack's per-message cost; one call per slice (``message``) made the
  per-message cost, not the order, decide the comparison (``pdml-ray bench p3``).
- ``message``: the real push starts when the message goes on the EMULATED uplink (Ray's own transfer
  hides inside the modelled one, as ``EmulatedLink`` intends): one call per message and shard.

Either way the Ray calls are made by the uplink's sender thread, never by backward's. A message is
handed to the link model at the time the model allows (its slices ready, room in the window:
``EmulatedLink.send(at=...)``), not when the sender thread next gets the CPU: on a busy machine a
late wake-up would otherwise idle the modelled link, an artefact of the emulation, not of the order.

**Credit window.** ``credit_bytes`` (``p3`` only, as in the simulator: the baselines' order cannot
change, so they hand every ready message to the link at once) caps the bytes handed to each EMULATED
link and not yet arrived. With one message at a time the link idles between an arrival and the next
hand-over (waking the sender thread, the Ray call of the next push: the runtime's per-message cost);
with a window of two or more slices the next message is already queued on the modelled wire, so that
cost hides behind the previous message, at the price of the window's bytes no longer being
overtakeable: a newly ready slice of higher priority overtakes everything queued beyond the window
(preemption at slice granularity). ``None``: one message at a time.
"""

from __future__ import annotations

import functools
import gc
import heapq
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from pdml_ray.errors import ConfigError, PlanError, UsageError
from pdml_ray.p3.link import EmulatedLink, LinkModel
from pdml_ray.p3.queue import DDP_BUCKET_BYTES, Message, SendQueue, make_queue
from pdml_ray.p3.shard import ShardTransport, shard_of
from pdml_ray.p3.slicing import Slice, SlicePlan, flatten_layer, plan_slices, unflatten_layer

LossFn = Callable[[Tensor, Tensor], Tensor]
TRANSFERS = ("layer", "message")


def model_layers(model: nn.Module) -> list[tuple[str, nn.Module, list[nn.Parameter]]]:
    """Modules with trainable parameters of their own, in registration order (= forward order for the
    usual models); a shared parameter belongs to the first module that registers it. Both P3 runtimes
    (this parameter server and ``pdml_ray.train.p3_sync``) cut layers by it."""
    seen: set[int] = set()
    out = []
    for name, module in model.named_modules():
        params = [p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        if params:
            seen |= {id(p) for p in params}
            out.append((name, module, params))
    return out


def layer_plan(model: nn.Module, slice_elements: int, element_size: int = 4) -> SlicePlan:
    """The slice plan of ``model``'s layers (``model_layers``)."""
    return plan_slices([sum(p.numel() for p in ps) for _, _, ps in model_layers(model)], slice_elements,
                       element_size)


@dataclass(slots=True)
class WorkerRun:
    """What a worker measured over one ``train`` call (seconds on ``time.perf_counter``)."""

    worker: int
    step_starts: list[float] = field(default_factory=list)  # when each step's forward began
    forward_wait_s: list[float] = field(default_factory=list)  # per step: the forward's waits for parameters
    losses: list[float] = field(default_factory=list)
    timeline: list[tuple[str, int, int, float]] = field(default_factory=list)
    """(kind, step, layer or slice, time): ``forward`` (a layer's forward starts), ``ready`` (a layer's
    gradient), ``pushed`` (a slice's real push to its shard was made), ``sent`` (a slice went on the
    EMULATED uplink), ``pulled`` (its shard's answer, the updated value, is back: real), ``arrived``
    (the updated slice is through the EMULATED downlink and its value is here)."""
    end: float = 0.0  # the last step's updates all applied

    @property
    def iteration_s(self) -> list[float]:
        """Per step: start of its forward to the start of the next (the last step: to ``end``)."""
        starts = self.step_starts + [self.end]
        return [b - a for a, b in zip(starts, starts[1:])]


class P3PSWorker:
    """Worker ``worker`` of a P3 parameter-server run (see the module docstring)."""

    def __init__(self, worker: int, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor,
                 batches: Sequence[tuple[int, int, float]], transport: ShardTransport, num_shards: int, *,
                 policy: str = "p3", slice_elements: int = 40_000, bucket_bytes: int = DDP_BUCKET_BYTES,
                 link: LinkModel | None = None, num_threads: int | None = None, wait_timeout_s: float = 120.0,
                 compute_sleep_s: Sequence[tuple[float, float]] | None = None,
                 credit_bytes: float | None = None, transfer: str = "layer") -> None:
        """``batches``: per step, (first row, rows, gradient weight b_i / B) of this worker's batch in
        (x, y). ``link``: the EMULATED link model of both directions (None: no emulation).
        ``credit_bytes``: the ``p3`` policy's window per link (None: one message at a time; see the
        module docstring); the baselines always hand over every ready message. ``transfer``: when the
        real push to the shards happens, ``layer`` or ``message`` (see the module docstring).
        ``compute_sleep_s``: per layer, (forward, backward) seconds of EMULATED compute slept on top of
        the real forward/backward (in the forward pre-hook after the wait, and before the layer's
        gradient is declared ready), so CPU contention does not decide the timing."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.worker, self.model, self.loss_fn, self.x, self.y = worker, model, loss_fn, x, y
        self.batches, self.transport, self.num_shards, self.policy = list(batches), transport, num_shards, policy
        self.bucket_bytes, self.wait_timeout_s = bucket_bytes, wait_timeout_s
        if transfer not in TRANSFERS:
            raise ConfigError(f"transfer must be one of {TRANSFERS}, got {transfer!r}")
        self.transfer = transfer
        if credit_bytes is not None and not credit_bytes > 0:
            raise ConfigError(f"credit_bytes must be > 0 (or None for one message at a time), got {credit_bytes!r}")
        # the queue's window: p3's credit (None = one message: the smallest positive window); baselines unbounded
        self.credit_bytes: float | None = (credit_bytes or 1.0) if policy == "p3" else None
        found = model_layers(model)
        if not found:
            raise UsageError("the model has no trainable parameters for P3 to synchronise")
        self.layer_params = [ps for _, _, ps in found]
        self.plan = plan_slices([sum(p.numel() for p in ps) for ps in self.layer_params], slice_elements)
        self.plan.validate()
        if compute_sleep_s is not None and len(compute_sleep_s) != len(self.layer_params):
            raise ConfigError(f"compute_sleep_s needs one (forward, backward) pair per layer ({len(self.layer_params)}), "
                              f"got {len(compute_sleep_s)}")
        self.compute_sleep_s = list(compute_sleep_s) if compute_sleep_s is not None else None
        self.link_model = link
        self.uplink = EmulatedLink(link) if link is not None else None
        self.downlink = EmulatedLink(link) if link is not None else None
        self._cond = threading.Condition()
        self._round = -1
        self._up: SendQueue = make_queue(policy, self.plan, self.credit_bytes, bucket_bytes)
        self._down: SendQueue = make_queue(policy, self.plan, self.credit_bytes, bucket_bytes)
        self._grads: dict[int, Tensor] = {}  # slice -> weighted gradient slice of the current round
        self._values: dict[int, Tensor] = {}  # slice -> updated value back from its shard
        self._unpulled: set[int] = set()  # slices through the EMULATED downlink whose real value is not back yet
        self._ready_at: dict[str, dict[int, float]] = {"up": {}, "down": {}}  # slice -> ready to send (perf_counter)
        self._freed_at = {"up": 0.0, "down": 0.0}  # the modelled arrival that last freed room in each window
        self._to_prepare: list[tuple[int, int, list[Tensor], float]] = []  # (step, layer, grads, weight) to cut
        self._arrived: set[int] = set()  # slices of the current round whose update has arrived
        self._applied: set[int] = set()  # layers whose update of the previous round is in the parameters
        self._remaining: list[int] = []
        self._wait_s = 0.0  # the current step's forward waits for parameters
        self._weight = 1.0  # the current step's gradient weight b_i / B
        self._error: BaseException | None = None
        self._stop = False
        self.run = WorkerRun(worker)
        self._layer_of = {id(p): i for i, ps in enumerate(self.layer_params) for p in ps}
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for ps in self.layer_params for p in ps]
        self._handles += [m.register_forward_pre_hook(functools.partial(self._before_forward, i))
                          for i, (_, m, _) in enumerate(found)]
        self._threads = [threading.Thread(target=self._pump, args=("up",), daemon=True),
                         threading.Thread(target=self._pump, args=("down",), daemon=True)]
        for t in self._threads:
            t.start()

    # ---- the training loop ------------------------------------------------------------------------
    def train(self, first_step: int = 0, stop_step: int | None = None, *, close: bool = True) -> WorkerRun:
        """Steps ``first_step`` .. ``stop_step - 1`` of ``batches`` (all of them by default); returns the
        measurements (of every step so far) once the last update is applied. ``close=False`` keeps the
        links and hooks for a later call: the runtime's decision boundaries, where ``replan`` may change
        the slicing in between.

        The objects alive at the start (Ray's and torch's modules, the model, the data set) are frozen
        out of Python's garbage collector for the run (``gc.freeze``), as Megatron-LM's manual GC does
        for the same reason: a full collection scanning them took 100-140 ms in a worker actor, a
        stall in one step of eight that the other worker, waiting at the shards, shared."""
        stop_step = len(self.batches) if stop_step is None else stop_step
        if not 0 <= first_step <= stop_step <= len(self.batches):
            raise UsageError(f"steps {first_step}..{stop_step} are not within the {len(self.batches)} batches")
        gc.collect()
        gc.freeze()  # what exists now (modules, model, data) is left out of later collections: see ``train``
        try:
            for step in range(first_step, stop_step):
                first, rows, weight = self.batches[step]
                self.run.step_starts.append(time.perf_counter())
                self._wait_s = 0.0
                self._weight = weight
                self.model.zero_grad(set_to_none=True)
                xb, yb = self.x[first:first + rows], self.y[first:first + rows]
                loss = self.loss_fn(self.model(xb), yb)  # pre-hooks: each layer waits for its own slices
                self._apply_all()  # a layer unused in forward still gets its update
                self.run.forward_wait_s.append(self._wait_s)
                self.run.losses.append(float(loss.detach()))
                self._begin_round(step)
                loss.backward()  # hooks: each layer's slices go to the send queue as soon as they exist
            self._apply_all()
            self.run.end = time.perf_counter()
            self._check()
            return self.run
        finally:
            gc.unfreeze()
            if close:
                self.close()

    def replan(self, slice_elements: int, credit_bytes: float | None) -> None:
        """Slice at ``slice_elements`` with window ``credit_bytes`` from the next ``train`` call on (between
        calls: every update applied, nothing queued). The shards must be re-sliced alike."""
        with self._cond:
            if self._up.pending or self._up.in_flight_bytes or self._down.pending or self._down.in_flight_bytes:
                raise PlanError(f"worker {self.worker}: replan with messages still queued (call it between train calls)")
            self.plan = plan_slices(self.plan.layer_numels, slice_elements)
            self.plan.validate()
            self.credit_bytes = (credit_bytes or 1.0) if self.policy == "p3" else None
            self._up = make_queue(self.policy, self.plan, self.credit_bytes, self.bucket_bytes)
            self._down = make_queue(self.policy, self.plan, self.credit_bytes, self.bucket_bytes)

    def link_measurement(self, first_step: int, stop_step: int) -> tuple[float, float, float] | None:
        """What this worker's link was over steps ``first_step`` .. ``stop_step - 1``, as the ``p3`` axis takes
        it: (bandwidth bytes/s, one-way latency s, per-message overhead s). With an EMULATED link, the
        link model's own figures; without one, the bandwidth its pushes and pulls achieved (a step's
        bytes over the median span from its first push to its last pulled answer: the shards' work and
        the other workers' pushes included, as this worker sees them), latency and overhead not
        measured (0). None when no step of the range moved any slice."""
        if self.link_model is not None:
            return (self.link_model.bandwidth_Bps, self.link_model.latency_s, self.link_model.overhead_s)
        spans = []
        for step in range(first_step, stop_step):
            pushed = [t for kind, s, _, t in self.run.timeline if kind == "pushed" and s == step]
            pulled = [t for kind, s, _, t in self.run.timeline if kind == "pulled" and s == step]
            if pushed and pulled and max(pulled) > min(pushed):
                spans.append(max(pulled) - min(pushed))
        if not spans:
            return None
        return (self.plan.total_bytes / statistics.median(spans), 0.0, 0.0)

    def parameters_vector(self) -> Tensor:
        return torch.cat([p.detach().reshape(-1) for ps in self.layer_params for p in ps])

    def close(self) -> None:
        """Stop and join the link threads (one left inside a tensor copy when the interpreter exits
        aborts the process) and remove the hooks."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=30.0)
        for h in self._handles:
            h.remove()
        self._handles = []

    # ---- backward side ----------------------------------------------------------------------------
    def _begin_round(self, step: int) -> None:
        with self._cond:
            if self._up.pending or self._up.in_flight_bytes or self._down.pending or self._down.in_flight_bytes:
                raise PlanError(f"worker {self.worker}: step {step} begins with messages of the last one still queued")
            self._round = step
            self._up = make_queue(self.policy, self.plan, self.credit_bytes, self.bucket_bytes)
            self._down = make_queue(self.policy, self.plan, self.credit_bytes, self.bucket_bytes)
            self._grads.clear()
            self._values.clear()
            self._unpulled.clear()
            self._ready_at = {"up": {}, "down": {}}
            self._arrived.clear()
            self._applied.clear()
            self._remaining = [len(ps) for ps in self.layer_params]

    def _on_grad(self, param: Tensor) -> None:
        layer = self._layer_of[id(param)]
        self._remaining[layer] -= 1
        if self._remaining[layer]:
            return
        if self.compute_sleep_s is not None:
            time.sleep(self.compute_sleep_s[layer][1])  # EMULATED backward of this layer
        now = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.layer_params[layer]]
        with self._cond:
            step = self._round
            self.run.timeline.append(("ready", step, layer, now))
            # the copies and the real push are the uplink thread's work (``_prepare``), not backward's
            self._to_prepare.append((step, layer, grads, self._weight))
            for s in self.plan.slices_of(layer):
                self._ready_at["up"][s.index] = now
                self._up.push(s)
            self._cond.notify_all()

    def _prepare(self, step: int, layer: int, grads: list[Tensor], weight: float) -> None:
        """A layer's weighted gradient cut into its slices (copies: a view would pickle the whole layer);
        with ``transfer="layer"`` pushed to the shards at once."""
        flat = flatten_layer(grads).mul_(weight)
        parts = {s.index: flat[s.start:s.stop].clone() for s in self.plan.slices_of(layer)}
        with self._cond:
            self._grads.update(parts)
        if self.transfer == "layer":
            self._deliver(step, list(self.plan.slices_of(layer)))

    # ---- the two links ----------------------------------------------------------------------------
    def _pump(self, direction: str) -> None:
        """Hand messages to one EMULATED link as the queue's window allows; acknowledge each when the
        link model says it has arrived (several may be on the modelled wire at once)."""
        link = self.uplink if direction == "up" else self.downlink
        up = direction == "up"
        in_flight: list[tuple[float, int, Message, int, SendQueue]] = []  # (arrival, seq, message, step, queue)
        seq = itertools.count()
        try:
            while True:
                send: tuple[Message, int, SendQueue, float] | None = None
                due: list[tuple[float, int, Message, int, SendQueue]] = []
                prepare: list[tuple[int, int, list[Tensor], float]] = []
                with self._cond:
                    while True:
                        if self._stop:
                            return
                        if up and self._to_prepare:
                            prepare, self._to_prepare = self._to_prepare, []
                            break
                        now = time.perf_counter()
                        while in_flight and in_flight[0][0] <= now:
                            due.append(heapq.heappop(in_flight))
                        if due:
                            break
                        queue = self._up if up else self._down
                        message = queue.pop()
                        if message is not None:
                            ready = max(self._ready_at[direction].get(s.index, now) for s in message.slices)
                            send = (message, self._round, queue, max(ready, self._freed_at[direction]))
                            break
                        self._cond.wait(timeout=in_flight[0][0] - now if in_flight else None)
                for step, layer, grads, weight in prepare:
                    self._prepare(step, layer, grads, weight)  # before any of its slices' messages is handed over
                if send is not None:
                    message, step, queue, could_send = send
                    # handed over when the model could have (ready, room in the window), not when this
                    # thread got the CPU: a late wake-up on a busy machine must not idle the modelled link
                    arrival = link.send(message.nbytes, at=could_send) if link is not None else 0.0
                    if up:
                        now = time.perf_counter()
                        with self._cond:
                            self.run.timeline += [("sent", step, s.index, now) for s in message.slices]
                        if self.transfer == "message":
                            self._deliver(step, list(message.slices))  # the real transfer during the EMULATED one
                    heapq.heappush(in_flight, (arrival, next(seq), message, step, queue))
                if due:
                    with self._cond:
                        now = time.perf_counter()
                        for arrival, _, message, step, queue in due:
                            queue.ack(message)
                            self._freed_at[direction] = max(self._freed_at[direction], arrival)
                            for s in message.slices:
                                if up:  # at the shard now: in the model its update goes down at once
                                    self._ready_at["down"][s.index] = arrival
                                    self._down.push(s)
                                elif s.index in self._values:
                                    self._arrived.add(s.index)
                                    self.run.timeline.append(("arrived", step, s.index, now))
                                else:  # the modelled download is over; arrived once the real value is back
                                    self._unpulled.add(s.index)
                        self._cond.notify_all()
        except BaseException as e:  # surfaced by the training loop, which would otherwise wait forever
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _deliver(self, step: int, items: list[Slice]) -> None:
        """The real transfer: push these gradient slices to their shards (one call per shard), ask for
        the updated ones."""
        by_shard: dict[int, list[Slice]] = {}
        for s in items:
            by_shard.setdefault(shard_of(s.index, self.num_shards), []).append(s)
        with self._cond:
            grads = {s.index: self._grads[s.index] for s in items}
            now = time.perf_counter()
            self.run.timeline += [("pushed", step, s.index, now) for s in items]
        for shard, slices in by_shard.items():
            ids = [s.index for s in slices]
            future = self.transport.push(shard, step, self.worker, ids, [grads[i] for i in ids])
            future.add_done_callback(functools.partial(self._pulled, step, slices))

    def _pulled(self, step: int, slices: list[Slice], fut: Future[list[Tensor]]) -> None:
        try:
            values = fut.result()
        except BaseException as e:
            with self._cond:
                self._error = e
                self._cond.notify_all()
            return
        with self._cond:
            if step != self._round:
                self._error = PlanError(f"worker {self.worker}: an update of step {step} came back in step {self._round}")
            now = time.perf_counter()
            for s, v in zip(slices, values):
                self._values[s.index] = v
                self.run.timeline.append(("pulled", step, s.index, now))
                if s.index in self._unpulled:  # its EMULATED download was over before the real value came
                    self._unpulled.discard(s.index)
                    self._arrived.add(s.index)
                    self.run.timeline.append(("arrived", step, s.index, now))
            self._cond.notify_all()

    # ---- forward side -----------------------------------------------------------------------------
    def _before_forward(self, layer: int, _module: nn.Module, _args: Any) -> None:
        self._apply(layer)
        self.run.timeline.append(("forward", self._round + 1, layer, time.perf_counter()))
        if self.compute_sleep_s is not None:
            time.sleep(self.compute_sleep_s[layer][0])  # EMULATED forward of this layer

    def _apply(self, layer: int) -> None:
        """Wait for ``layer``'s updated slices of the previous round, then copy them into its parameters."""
        if self._round < 0 or layer in self._applied:
            return
        slices = self.plan.slices_of(layer)
        t0 = time.perf_counter()
        with self._cond:
            while self._error is None and not all(s.index in self._arrived for s in slices):
                if not self._cond.wait(timeout=max(0.0, t0 + self.wait_timeout_s - time.perf_counter())):
                    self._error = PlanError(f"worker {self.worker}: layer {layer}'s update of step {self._round} did "
                                            f"not arrive within {self.wait_timeout_s:g} s (a shard or worker died?)")
            self._check()
            flat = torch.empty(self.plan.layer_numels[layer])
            for s in slices:
                flat[s.start:s.stop] = self._values[s.index]
        self._wait_s += time.perf_counter() - t0
        with torch.no_grad():
            for p, v in zip(self.layer_params[layer], unflatten_layer(flat, self.layer_params[layer])):
                p.copy_(v)
        self._applied.add(layer)

    def _apply_all(self) -> None:
        for layer in range(len(self.layer_params)):
            self._apply(layer)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error


def measure_compute(model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor,
                    batches: Sequence[tuple[int, int, float]], num_threads: int | None = None) -> list[float]:
    """Seconds of forward + backward per batch, no communication (what P3 tries to overlap with)."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    times = []
    for first, rows, _ in batches:
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        loss_fn(model(x[first:first + rows]), y[first:first + rows]).backward()
        times.append(time.perf_counter() - t0)
    return times
