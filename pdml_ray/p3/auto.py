"""``auto``: slice size and credit from the measured link, and a report of what was chosen and why.

ByteScheduler tunes its partition and credit sizes online (Bayesian optimisation over measured
iteration times). Here the link model makes the trade-offs explicit, so the choice is a rule,
refined by the simulator when the model's layers are known:

- **slice size**: as small as possible (a high-priority slice waits behind at most the window ahead
  of it) while the per-message overhead stays under ``max_overhead_fraction`` of a slice's time on
  the wire: ``slice_bytes >= overhead_s x bandwidth / fraction``; never below ``min_slice_elements``
  and never above ``max_slice_elements``; rounded to a multiple of 1,024 elements.
- **credit** (bytes in flight): enough for the link never to idle while the sender waits for
  acknowledgements, the bandwidth-delay product plus one slice, and at least two slices; more only
  delays preemption.
- **search** (with a ``ModelProfile``): the simulator runs P3 for slice sizes of 1/4 to 4 times the
  rule's and credits of 1 to 4 times; the fastest wins (ties: the rule's choice), and the choice
  reports its predicted iteration time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdml_ray.errors import ConfigError
from pdml_ray.p3.link import LinkModel
from pdml_ray.p3.models import ModelProfile

MIN_SLICE_ELEMENTS = 4_096
MAX_SLICE_ELEMENTS = 4_194_304  # 16 MB of float32: beyond this, preemption is too coarse to matter


@dataclass(frozen=True, slots=True)
class AutoChoice:
    """What ``auto`` chose, from which measurements, and why."""

    slice_elements: int
    credit_bytes: float
    bandwidth_Bps: float
    latency_s: float
    overhead_s: float
    method: str  # "rule" or "search"
    predicted_iteration_s: float | None
    reason: str

    def describe(self) -> str:
        pred = f", predicted iteration {self.predicted_iteration_s * 1e3:.2f} ms" if self.predicted_iteration_s else ""
        return (f"P3 auto ({self.method}): slice {self.slice_elements:,d} elements, credit "
                f"{self.credit_bytes / 1e3:,.0f} KB for {self.bandwidth_Bps * 8 / 1e9:.3g} Gb/s, "
                f"latency {self.latency_s * 1e6:.0f} us, overhead {self.overhead_s * 1e6:.0f} us{pred}. {self.reason}")


def rule(link: LinkModel, element_size: int = 4, max_overhead_fraction: float = 0.02) -> tuple[int, float, str]:
    """(slice elements, credit bytes, why) from the link alone."""
    if not 0 < max_overhead_fraction < 1:
        raise ConfigError(f"max_overhead_fraction must be in (0, 1) (e.g. 0.02), got {max_overhead_fraction!r}")
    want = link.overhead_s * link.bandwidth_Bps / max_overhead_fraction / element_size
    elements = int(min(MAX_SLICE_ELEMENTS, max(MIN_SLICE_ELEMENTS, math.ceil(want / 1024) * 1024)))
    slice_bytes = elements * element_size
    credit_slices = max(2, math.ceil((link.bandwidth_delay_bytes + slice_bytes) / slice_bytes))
    why = (f"slice: per-message overhead <= {max_overhead_fraction:.0%} of a slice's wire time "
           f"(>= {want:,.0f} elements, clamped to [{MIN_SLICE_ELEMENTS:,d}, {MAX_SLICE_ELEMENTS:,d}]); "
           f"credit: {credit_slices} slices = bandwidth-delay product ({link.bandwidth_delay_bytes / 1e3:,.0f} KB) "
           "+ one slice, at least two")
    return elements, float(credit_slices * slice_bytes), why


def tune(link: LinkModel, profile: ModelProfile | None = None, max_overhead_fraction: float = 0.02,
         element_size: int = 4) -> AutoChoice:
    """Slice size and credit for ``link`` (measured bandwidth, latency, per-message overhead) and gradient
    elements of ``element_size`` bytes; with a ``profile`` (whose element size then counts) refined by
    simulating P3 over a small grid around the rule's choice."""
    element_size = profile.element_size if profile is not None else element_size
    elements, credit, why = rule(link, element_size, max_overhead_fraction)
    if profile is None:
        return AutoChoice(elements, credit, link.bandwidth_Bps, link.latency_s, link.overhead_s, "rule", None, why)
    from pdml_ray.p3.simulate import simulate_iteration

    credit_slices = round(credit / (elements * element_size))
    best: tuple[float, int, float] | None = None
    for factor in (1.0, 0.25, 0.5, 2.0, 4.0):  # the rule's choice first: it wins ties
        e = int(min(MAX_SLICE_ELEMENTS, max(MIN_SLICE_ELEMENTS, round(elements * factor / 1024) * 1024)))
        for mult in (1, 2, 4):
            c = float(max(2, math.ceil(credit_slices / factor)) * mult * e * element_size)
            t = simulate_iteration(profile, "p3", link, slice_elements=e, credit_bytes=c).iteration_s
            if best is None or t < best[0] * (1 - 1e-9):
                best = (t, e, c)
    assert best is not None
    t, e, c = best
    return AutoChoice(e, c, link.bandwidth_Bps, link.latency_s, link.overhead_s, "search", t,
                      f"searched slice x[1/4..4] and credit x[1..4] around the rule ({why}) with the simulator "
                      f"on {profile.name}")
