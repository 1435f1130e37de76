"""A network link model: bandwidth, latency and a per-message overhead, for the simulator and for
EMULATED bandwidth in the runtimes (the same code runs at a chosen bandwidth on one machine).

A message of ``n`` bytes handed to the link at ``now`` occupies it (the link serialises bytes, one
message after another) from ``start = max(now, busy_until)`` for ``overhead_s + n / bandwidth``
seconds, and arrives ``latency_s`` after that. Latency is pipelined (several messages can be in the
air at once); the per-message overhead (headers, a system call, a collective's launch) is not. So a
sender that keeps less than the bandwidth-delay product in flight leaves the link idle, and tiny
slices pay their overhead: the trade-off the ``auto`` setting (``pdml_ray.p3.auto``) balances.

``EmulatedLink`` turns the model into wall-clock time for a runtime: it tells when a message sent
now would have arrived over the modelled link, and sleeps until then. Every output that uses it must
say the bandwidth is EMULATED (``EMULATION_NOTE``, ``LinkModel.describe``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from pdml_ray.errors import ConfigError

EMULATION_NOTE = ("bandwidth is EMULATED: each message is delayed to arrive when it would over a link of the "
                  "stated bandwidth and latency; the gradients and the collectives themselves are real")


@dataclass(frozen=True, slots=True)
class LinkModel:
    """One direction of a link."""

    bandwidth_Bps: float  # bytes per second
    latency_s: float = 0.0  # one-way propagation delay, pipelined across messages
    overhead_s: float = 0.0  # fixed cost per message that occupies the link (not pipelined)

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth_Bps, (int, float)) and math.isfinite(self.bandwidth_Bps)
                and self.bandwidth_Bps > 0):
            raise ConfigError(f"link bandwidth must be > 0 bytes/s (10 Gb/s = 1.25e9), got {self.bandwidth_Bps!r}")
        for name in ("latency_s", "overhead_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"link {name} must be >= 0 seconds, got {value!r}")

    @classmethod
    def gbps(cls, gigabits_per_s: float, latency_s: float = 0.0, overhead_s: float = 0.0) -> "LinkModel":
        """A link of ``gigabits_per_s`` Gb/s (10 Gb/s Ethernet: ``LinkModel.gbps(10)``)."""
        return cls(gigabits_per_s * 1e9 / 8, latency_s, overhead_s)

    def occupancy_s(self, nbytes: int) -> float:
        """Seconds one message holds the link."""
        return self.overhead_s + nbytes / self.bandwidth_Bps

    def transfer_s(self, nbytes: int) -> float:
        """Seconds from sending one message on an idle link to its arrival."""
        return self.occupancy_s(nbytes) + self.latency_s

    @property
    def bandwidth_delay_bytes(self) -> float:
        """Bytes that must be in flight for the link never to idle between acknowledgements."""
        return self.bandwidth_Bps * self.latency_s

    def describe(self) -> str:
        return (f"EMULATED link: {self.bandwidth_Bps * 8 / 1e9:.3g} Gb/s, latency {self.latency_s * 1e6:.0f} us, "
                f"overhead {self.overhead_s * 1e6:.0f} us per message")


class Link:
    """A ``LinkModel`` with state: when the link is free again. Times are in seconds on any clock."""

    def __init__(self, model: LinkModel) -> None:
        self.model = model
        self.busy_until = 0.0
        self.bytes_sent = 0
        self.messages = 0

    def send(self, nbytes: int, now: float) -> tuple[float, float]:
        """Hand ``nbytes`` to the link at ``now``: (when it starts on the wire, when it arrives)."""
        start = max(now, self.busy_until)
        self.busy_until = start + self.model.occupancy_s(nbytes)
        self.bytes_sent += nbytes
        self.messages += 1
        return start, self.busy_until + self.model.latency_s

    def reset(self, now: float = 0.0) -> None:
        self.busy_until = now


class EmulatedLink:
    """Wall-clock emulation of a ``LinkModel`` for a runtime on one machine (``time.perf_counter``).

    The runtime sends for real (a local collective is far faster than the modelled link), asks
    ``send(nbytes)`` when the message would arrive, and ``wait_until(arrival)`` before using it.
    Messages are modelled in the order they are sent, as on one real link.
    """

    def __init__(self, model: LinkModel) -> None:
        self.link = Link(model)
        self.link.reset(time.perf_counter())
        self.slept_s = 0.0

    @property
    def model(self) -> LinkModel:
        return self.link.model

    def send(self, nbytes: int, at: float | None = None) -> float:
        """``time.perf_counter()`` at which a message of ``nbytes`` handed to the link now arrives.
        ``at`` (<= now): when the sender could have handed it over by the model (it was ready and the
        window had room), if its own thread woke up later than that; None: now."""
        now = time.perf_counter()
        return self.link.send(nbytes, now if at is None else min(at, now))[1]

    def wait_until(self, arrival: float) -> float:
        """Sleep until ``arrival``; returns the seconds slept (0 if it has arrived already)."""
        delay = arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
            self.slept_s += delay
            return delay
        return 0.0
