"""Send queues: which ready slice goes on the wire next, and how many bytes may be in flight.

Four policies, one registry (``QUEUES``), all with the same four calls: ``push(slice)`` when a
slice's gradient (or updated parameter) is ready, ``pop()`` for the next ``Message`` the credit
allows, ``ack(message)`` when it has arrived, and ``in_flight_bytes``.

- ``p3``: a priority queue (layer priority in forward order, then offset). A slice that becomes ready
  overtakes every queued slice of lower priority: preemption at slice granularity (a slice on the wire
  is never interrupted). The **credit** caps the bytes in flight: what is not yet handed to the link
  can still be overtaken. A small credit preempts sooner; a credit below the link's bandwidth-delay
  product leaves it idle (``pdml_ray.p3.auto`` balances the two, as ByteScheduler's tuning does).
- ``fifo``: first in, first out, in the order gradients become ready (backward order: last layer
  first), one slice per message. MXNet's default push order.
- ``layer-fifo``: the baseline of the P3 paper (MXNet's parameter server without slicing): one
  message per layer, whole, in the order layers become ready (backward order). The slices still
  exist (the plan is shared) but travel together, so a layer is on the wire or waiting as one.
- ``bucketed``: DDP's scheme: slices grouped into buckets of about ``bucket_bytes`` (25 MB by
  default, DDP's ``bucket_cap_mb``) in reverse parameter order; a bucket goes as one message once all
  its slices are ready, in the order buckets complete.

A message bigger than the credit may go alone on an empty window, so nothing ever blocks forever.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.p3.slicing import Slice, SlicePlan

DDP_BUCKET_BYTES = 25 * 1024 * 1024  # torch DDP's default bucket_cap_mb=25


@dataclass(frozen=True, slots=True)
class Message:
    """Slices sent together (one slice, or a whole bucket)."""

    slices: tuple[Slice, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slices)

    @property
    def priority(self) -> int:
        return min(s.priority for s in self.slices)

    def __str__(self) -> str:
        first, last = self.slices[0], self.slices[-1]
        return f"Message(slices {first.index}..{last.index}, layers {first.layer}..{last.layer}, {self.nbytes} B)"


class SendQueue:
    """Ready slices waiting for the link, and the credit window (bytes handed over, not yet acked)."""

    name = "base"

    def __init__(self, plan: SlicePlan, credit_bytes: float | None = None) -> None:
        if credit_bytes is not None and not credit_bytes > 0:
            raise ConfigError(f"credit_bytes must be > 0 (or None for no window), got {credit_bytes!r}")
        self.plan = plan
        self.credit_bytes = credit_bytes
        self.in_flight_bytes = 0
        self.max_in_flight_bytes = 0
        self._pushed: set[int] = set()

    def push(self, item: Slice) -> None:
        """``item`` is ready to send."""
        if item.index in self._pushed:
            raise PlanError(f"slice {item.index} was pushed twice in one round")
        self._pushed.add(item.index)
        self._add(item)

    def pop(self) -> Message | None:
        """The next message if one is ready and the credit allows it (it is then in flight)."""
        message = self._peek()
        if message is None:
            return None
        if self.credit_bytes is not None and self.in_flight_bytes > 0 \
                and self.in_flight_bytes + message.nbytes > self.credit_bytes:
            return None
        self._take()
        self.in_flight_bytes += message.nbytes
        self.max_in_flight_bytes = max(self.max_in_flight_bytes, self.in_flight_bytes)
        return message

    def ack(self, message: Message) -> None:
        """``message`` has arrived: its bytes leave the window."""
        if message.nbytes > self.in_flight_bytes:
            raise PlanError(f"ack of {message} with only {self.in_flight_bytes} bytes in flight")
        self.in_flight_bytes -= message.nbytes

    def reset(self) -> None:
        """A new round (iteration): nothing queued, nothing in flight."""
        if self.pending:
            raise PlanError(f"{self.pending} slices still queued at the end of a round")
        self._pushed.clear()
        self.in_flight_bytes = 0

    @property
    def pending(self) -> int:
        raise NotImplementedError

    def _add(self, item: Slice) -> None:
        raise NotImplementedError

    def _peek(self) -> Message | None:
        raise NotImplementedError

    def _take(self) -> None:
        raise NotImplementedError


class PriorityQueue(SendQueue):
    """P3: the highest-priority ready slice first (layer in forward order, then offset)."""

    name = "p3"

    def __init__(self, plan: SlicePlan, credit_bytes: float | None = None) -> None:
        super().__init__(plan, credit_bytes)
        self._heap: list[tuple[int, int, Slice]] = []

    def _add(self, item: Slice) -> None:
        heapq.heappush(self._heap, (item.priority, item.index, item))

    def _peek(self) -> Message | None:
        return Message((self._heap[0][2],)) if self._heap else None

    def _take(self) -> None:
        heapq.heappop(self._heap)

    @property
    def pending(self) -> int:
        return len(self._heap)


class FifoQueue(SendQueue):
    """First ready, first sent: backward order, one slice per message."""

    name = "fifo"

    def __init__(self, plan: SlicePlan, credit_bytes: float | None = None) -> None:
        super().__init__(plan, credit_bytes)
        self._queue: deque[Slice] = deque()

    def _add(self, item: Slice) -> None:
        self._queue.append(item)

    def _peek(self) -> Message | None:
        return Message((self._queue[0],)) if self._queue else None

    def _take(self) -> None:
        self._queue.popleft()

    @property
    def pending(self) -> int:
        return len(self._queue)


def ddp_buckets(plan: SlicePlan, bucket_bytes: int = DDP_BUCKET_BYTES) -> list[tuple[Slice, ...]]:
    """Slices grouped as DDP groups parameters: reverse order, a new bucket once ``bucket_bytes`` is
    reached. Each bucket's slices are listed in plan order."""
    if bucket_bytes < 1:
        raise ConfigError(f"bucket_bytes must be >= 1 (DDP uses 25 MiB), got {bucket_bytes!r}")
    buckets: list[list[Slice]] = []
    size = bucket_bytes
    for item in reversed(plan.slices):
        if size >= bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(item)
        size += item.nbytes
    return [tuple(reversed(b)) for b in buckets]


def layer_groups(plan: SlicePlan) -> list[tuple[Slice, ...]]:
    """One group per layer, whole, last layer first (the order backward makes them ready)."""
    return [plan.slices_of(layer) for layer in reversed(range(plan.num_layers))]


class BucketedQueue(SendQueue):
    """DDP-like: a bucket goes as one message once all its slices are ready (``groups``: the buckets,
    default DDP's of ``bucket_bytes``)."""

    name = "bucketed"

    def __init__(self, plan: SlicePlan, credit_bytes: float | None = None,
                 bucket_bytes: int = DDP_BUCKET_BYTES, groups: list[tuple[Slice, ...]] | None = None) -> None:
        super().__init__(plan, credit_bytes)
        self.buckets = groups if groups is not None else ddp_buckets(plan, bucket_bytes)
        self._bucket_of = {s.index: b for b, bucket in enumerate(self.buckets) for s in bucket}
        self._missing = [len(b) for b in self.buckets]
        self._queued_slices = 0
        self._complete: deque[int] = deque()

    def _add(self, item: Slice) -> None:
        b = self._bucket_of[item.index]
        self._missing[b] -= 1
        self._queued_slices += 1
        if self._missing[b] == 0:
            self._complete.append(b)

    def _peek(self) -> Message | None:
        return Message(self.buckets[self._complete[0]]) if self._complete else None

    def _take(self) -> None:
        b = self._complete.popleft()
        self._queued_slices -= len(self.buckets[b])

    def reset(self) -> None:
        super().reset()
        self._missing = [len(b) for b in self.buckets]

    @property
    def pending(self) -> int:
        return self._queued_slices


class LayerFifoQueue(BucketedQueue):
    """Per-layer FIFO, P3's paper baseline: each layer one message, whole, once its gradient is ready."""

    name = "layer-fifo"

    def __init__(self, plan: SlicePlan, credit_bytes: float | None = None) -> None:
        super().__init__(plan, credit_bytes, groups=layer_groups(plan))


QUEUES: dict[str, type[SendQueue]] = {"p3": PriorityQueue, "fifo": FifoQueue, "layer-fifo": LayerFifoQueue,
                                      "bucketed": BucketedQueue}


def make_queue(policy: str, plan: SlicePlan, credit_bytes: float | None = None,
               bucket_bytes: int = DDP_BUCKET_BYTES) -> SendQueue:
    """The send queue of ``policy`` (a name in ``QUEUES``) over ``plan``."""
    if policy not in QUEUES:
        raise ConfigError(f"unknown P3 send policy {policy!r}; valid names: {sorted(QUEUES)}")
    if policy == "bucketed":
        return BucketedQueue(plan, credit_bytes, bucket_bytes)
    return QUEUES[policy](plan, credit_bytes)
