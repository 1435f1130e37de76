"""P3's config: the send policy, the slice size, the credit window, ``auto`` tuning, EMULATED bandwidth.

The policy name is validated against the one registry (``pdml_ray.p3.queue.QUEUES``), imported when
a config is checked (it imports nothing from here).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdml_ray.config.checks import MAX_ITEMS, MAX_REAL, check_range, require
from pdml_ray.errors import shown

P3_SLICE_ELEMENTS = 40_000
"""P3's reference implementation slices at 40,000 parameters (160 KB of float32). At 10 Gb/s such a
slice is ~130 us on the wire: a newly ready high-priority slice waits at most a credit window of such
slices, while the per-message cost (tens of us) stays a small fraction. ``auto`` re-derives it from
the measured link (larger on fast links, where the per-message cost would dominate)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class P3Config:
    """Priority-based parameter propagation: gradients cut into slices and sent in the order the next
    forward pass needs them (``pdml_ray.p3``; the all-reduce runtime is ``pdml_ray.train.p3_sync``)."""

    policy: str = "p3"
    """Send order, a name in ``pdml_ray.p3.queue.QUEUES``: ``p3`` (priority by layer in forward order,
    preemption at slice granularity), ``fifo`` (backward order), ``layer-fifo`` (backward order, one
    message per layer, no slicing: the P3 paper's baseline), ``bucketed`` (DDP-like buckets of
    ``bucket_bytes``, each sent, or all-reduced, as one message once all its slices are ready)."""
    slice_elements: int = P3_SLICE_ELEMENTS
    """Elements (parameters) per slice; a layer's last slice may be smaller. Slices never cross layers."""
    credit_bytes: int | None = None
    """Bytes in flight at most (the window that can no longer be overtaken). None: four slices' bytes."""
    bucket_bytes: int = 25 * 1024 * 1024
    """Bucket size of the ``bucketed`` baseline (DDP's ``bucket_cap_mb=25``)."""
    auto: bool = False
    """Let the run's scheduler (its ``p3`` axis, ``pdml_ray.priority.p3``) pick ``slice_elements`` and
    ``credit_bytes`` from the bandwidth and latency the runtime measured (or EMULATES), by the rule of
    ``pdml_ray.p3.auto``; the two fields above hold until it has, and ``pdml-ray status`` shows the choice."""
    emulated_bandwidth_gbps: float | None = None
    """EMULATE a link of this many Gb/s: every message is delayed to arrive when it would over it (one
    machine then shows what a slower network would do). None: the real network, unmodified."""
    emulated_latency_us: float = 0.0
    """One-way latency of the EMULATED link, microseconds (pipelined across messages)."""
    element_size: int = 4
    """Bytes per gradient element (4: float32)."""
    ps_transfer: str = "layer"
    """Parameter-server runtime only: when a worker's real push to the shards is made, ``layer`` (one
    Ray call per layer and shard once the layer's gradient exists; the EMULATED link still decides
    when each slice counts as arrived) or ``message`` (one call per message and shard, when it goes on
    the EMULATED link). See ``pdml_ray.p3.ps``."""

    def __post_init__(self) -> None:
        from pdml_ray.p3.queue import QUEUES

        require(isinstance(self.policy, str) and self.policy in QUEUES,
                f"p3.policy must be one of {sorted(QUEUES)}, got {shown(self.policy)}")
        check_range(self.slice_elements, "p3.slice_elements", 1, MAX_ITEMS, whole=True,
                    hint=f"P3 uses {P3_SLICE_ELEMENTS}")
        check_range(self.credit_bytes, "p3.credit_bytes", 1, MAX_ITEMS, whole=True, none_ok=True,
                    hint="bytes in flight, e.g. 640000; None: four slices")
        check_range(self.bucket_bytes, "p3.bucket_bytes", 1, MAX_ITEMS, whole=True, hint="DDP uses 26214400")
        require(isinstance(self.auto, bool), f"p3.auto must be true or false, got {shown(self.auto)}")
        check_range(self.emulated_bandwidth_gbps, "p3.emulated_bandwidth_gbps", 0.0, MAX_REAL, open_low=True,
                    none_ok=True, hint="e.g. 10; None: the real network")
        check_range(self.emulated_latency_us, "p3.emulated_latency_us", 0.0, MAX_REAL, hint="microseconds")
        require(self.emulated_latency_us == 0 or self.emulated_bandwidth_gbps is not None,
                "p3.emulated_latency_us needs p3.emulated_bandwidth_gbps (latency is part of the EMULATED link)")
        require(isinstance(self.ps_transfer, str) and self.ps_transfer in ("layer", "message"),
                f"p3.ps_transfer must be 'layer' or 'message', got {shown(self.ps_transfer)}")
        require(type(self.element_size) is int and self.element_size in (1, 2, 4, 8),
                f"p3.element_size must be 1, 2, 4 or 8 bytes, got {shown(self.element_size)}")

    @property
    def effective_credit_bytes(self) -> int:
        """The credit in force: ``credit_bytes``, or four slices."""
        return self.credit_bytes if self.credit_bytes is not None else 4 * self.slice_elements * self.element_size
