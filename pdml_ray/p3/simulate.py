"""A discrete-event simulation of one data-parallel iteration with a parameter server, per send policy.

One worker's view of a symmetric cluster (every worker is alike, so the server holds a slice's
aggregate when this worker's push of it arrives):

1. backward produces gradients layer by layer, last layer first (``backward_s`` each); a layer's
   slices are pushed to the uplink's send queue when its backward ends;
2. the send queue (``p3`` / ``fifo`` / ``layer-fifo`` / ``bucketed``, ``pdml_ray.p3.queue``) hands messages to the
   uplink (``pdml_ray.p3.link``); an arrival frees credit;
3. the server updates a slice on arrival and sends the updated parameters back (the pull) through a
   send queue of the same policy on the downlink;
4. the next forward runs layer by layer, each layer waiting only for its own parameters.

The iteration time is the end of that forward, counted from the start of backward: the steady state
of back-to-back iterations (the forward cannot end before every pull has arrived, so nothing carries
over). It can never beat ``bound_s = max(compute, communication)`` (communication: all bytes through
the uplink at its bandwidth). Baselines (``fifo``, ``layer-fifo``, ``bucketed``) have no window (their order cannot
change, a window would only idle the link); ``credit_bytes`` applies to ``p3``.

Run ``python -m pdml_ray.p3.sweep`` for the table of P3 / FIFO / per-layer FIFO / bucketed iteration times of
VGG-19, ResNet-50 and a GPT-style stack at several comm/compute ratios (bandwidth EMULATED, compute
MODELLED from FLOPs).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from pdml_ray.errors import PlanError

from pdml_ray.p3.link import Link, LinkModel
from pdml_ray.p3.models import ModelProfile
from pdml_ray.p3.queue import DDP_BUCKET_BYTES, Message, make_queue
from pdml_ray.p3.slicing import SlicePlan, plan_slices

P3_SLICE_ELEMENTS = 40_000  # P3's own slice size (parameters per slice)


@dataclass(frozen=True, slots=True)
class IterationResult:
    """One simulated iteration (seconds)."""

    policy: str
    iteration_s: float
    compute_s: float  # forward + backward, no waiting
    comm_s: float  # all bytes through the uplink at its bandwidth
    bound_s: float  # max(compute_s, comm_s): no policy can beat it
    forward_wait_s: float  # the next forward's total wait for parameters
    messages: int  # uplink messages
    max_in_flight_bytes: int  # uplink, the most bytes ever in flight
    slice_elements: int
    credit_bytes: float | None

    @property
    def efficiency(self) -> float:
        """bound / iteration time: 1.0 = perfect overlap."""
        return self.bound_s / self.iteration_s


def simulate_iteration(profile: ModelProfile, policy: str, uplink: LinkModel, downlink: LinkModel | None = None,
                       slice_elements: int = P3_SLICE_ELEMENTS, credit_bytes: float | None = None,
                       bucket_bytes: int = DDP_BUCKET_BYTES, allreduce: bool = False) -> IterationResult:
    """One iteration of ``profile`` under send ``policy`` (``QUEUES`` name) over the given links
    (the downlink defaults to the uplink's model: a full-duplex link).

    ``allreduce``: no server and no pull; a message's arrival is its reduction's completion (give the
    uplink the all-reduce's effective rate, e.g. bandwidth / (2 (n - 1) / n) for a ring). This is the
    upper bound of the all-reduce runtime (``pdml_ray.train.p3_sync``), which fixes the order in advance."""
    plan = plan_slices(profile.numels, slice_elements, profile.element_size)
    plan.validate()
    credit = credit_bytes if policy == "p3" else None
    queues = {"up": make_queue(policy, plan, credit, bucket_bytes), "down": make_queue(policy, plan, credit, bucket_bytes)}
    links = {"up": Link(uplink), "down": Link(downlink or uplink)}
    events: list[tuple[float, int, str, object]] = []  # (time, sequence, kind, payload)
    seq = 0

    def at(t: float, kind: str, payload: object) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    def pump(direction: str, now: float) -> None:
        while (message := queues[direction].pop()) is not None:
            _, arrival = links[direction].send(message.nbytes, now)
            at(arrival, direction, message)

    t = 0.0
    for layer in reversed(range(len(profile.layers))):  # backward: last layer first
        t += profile.layers[layer].backward_s
        at(t, "ready", layer)
    backward_end = t
    arrived = [0.0] * len(profile.layers)  # when each layer's updated parameters are all back
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "ready":
            assert isinstance(payload, int)
            for s in plan.slices_of(payload):
                queues["up"].push(s)
            pump("up", now)
        elif kind == "up":
            assert isinstance(payload, Message)
            queues["up"].ack(payload)
            pump("up", now)
            for s in payload.slices:
                if allreduce:
                    arrived[s.layer] = max(arrived[s.layer], now)
                else:
                    queues["down"].push(s)
            pump("down", now)
        else:
            assert isinstance(payload, Message)
            queues["down"].ack(payload)
            for s in payload.slices:
                arrived[s.layer] = max(arrived[s.layer], now)
            pump("down", now)
    t, wait = backward_end, 0.0
    for layer, prof in enumerate(profile.layers):  # the next forward, each layer waiting for its own
        start = max(t, arrived[layer])
        wait += start - t
        t = start + prof.forward_s
    comm = profile.total_bytes / uplink.bandwidth_Bps
    return IterationResult(policy, t, profile.compute_s, comm, max(profile.compute_s, comm), wait,
                           links["up"].messages, queues["up"].max_in_flight_bytes, slice_elements, credit)


def send_order(plan: SlicePlan, policy: str, layer_ready_s: Sequence[float], link: LinkModel,
               credit_bytes: float | None = None, bucket_bytes: int = DDP_BUCKET_BYTES) -> tuple[int, ...]:
    """Slice indices in the order ``policy``'s queue hands them to ``link``, given when each layer's
    gradient is ready (seconds; ties in backward order). A collective all-reduce cannot reorder at run
    time (every rank must issue the same sequence), so ``pdml_ray.train.p3_sync`` fixes this order in
    advance from measured ready times and issues it identically on every rank."""
    if len(layer_ready_s) != plan.num_layers:
        raise PlanError(f"need one ready time per layer ({plan.num_layers}), got {len(layer_ready_s)}")
    queue = make_queue(policy, plan, credit_bytes if policy == "p3" else None, bucket_bytes)
    wire = Link(link)
    events: list[tuple[float, int, int, Message | None]] = []  # (time, kind 0=ready/1=ack, sequence, message)
    for layer in sorted(range(plan.num_layers), key=lambda i: (layer_ready_s[i], -i)):
        heapq.heappush(events, (float(layer_ready_s[layer]), 0, len(events), None))
    ready_layers = sorted(range(plan.num_layers), key=lambda i: (layer_ready_s[i], -i))
    order: list[int] = []
    seq, next_ready = len(events), 0
    while events:
        now, kind, _, message = heapq.heappop(events)
        if kind == 0:
            for s in plan.slices_of(ready_layers[next_ready]):
                queue.push(s)
            next_ready += 1
        else:
            assert message is not None
            queue.ack(message)
        while (out := queue.pop()) is not None:
            order += [s.index for s in out.slices]
            heapq.heappush(events, (wire.send(out.nbytes, now)[1], 1, seq, out))
            seq += 1
    return tuple(order)


def bandwidth_for_ratio(profile: ModelProfile, ratio: float) -> float:
    """Bytes/s at which sending the whole model takes ``ratio`` x the compute time."""
    return profile.total_bytes / (ratio * profile.compute_s)
