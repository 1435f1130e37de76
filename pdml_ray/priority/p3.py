"""The P3 axis: the slice size and credit window both P3 runtimes send gradients with.

One deriver serves the all-reduce runtime (``pdml_ray.train.p3_sync``, through the Ray Train context's
client) and the parameter-server runtime (``pdml_ray.runtime.p3_ps``, through its own
``SchedulerClient``), so a P3 run's choice has the same version stamps, history, replay, ``pdml-ray
status`` and metrics as every other axis:

    observe(step, rows)          what a runtime measured about its links, rows of (bandwidth bytes/s,
                                 one-way latency s, per-message overhead s), one per link, as plain
                                 tuples (the slowest link decides: every rank waits for it)
    decide(boundary, earlier)    with ``P3Config.auto``: the rule of ``pdml_ray.p3.auto.tune`` over the
                                 newest measured link, a ``P3Decision`` when its choice differs from the
                                 one in force; without it nothing (the config's choice stands)

Before any measurement, and always with ``auto`` off, the decision in force is the config's own
``slice_elements`` and ``effective_credit_bytes`` (``initial``), so ``pdml-ray status`` shows what runs.
The runtimes measure the link (the all-reduce runtime in its warm-up, the parameter server after each
segment of steps) and switch at the decision's effective step, all ranks or workers together. Pure: no
Ray, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, P3Decision, Rejection, WorkerReport
from pdml_ray.errors import StateError
from pdml_ray.p3.auto import tune
from pdml_ray.p3.link import LinkModel
from pdml_ray.priority.base import Deriver, GaugeValue

MAX_LINKS_PER_OBSERVATION = 4096
"""Most links one observation may describe (one per worker or rank)."""
MAX_BANDWIDTH_BPS = 1e13
"""Fastest link an observation may report, bytes/s (80 Tb/s): more is a unit error, not a measurement."""
MAX_LINK_S = 10.0
"""Longest one-way latency or per-message overhead an observation may report, seconds."""


@dataclass(frozen=True, slots=True)
class P3AxisStats:
    """What the P3 axis knows: the send policy, the slice size and credit it chose, the link behind them."""

    policy: str
    auto: bool
    slice_elements: int
    """The newest decision's slice size (elements)."""
    credit_bytes: int
    """The newest decision's credit window (bytes)."""
    element_size: int
    """Bytes per gradient element (``P3Config.element_size``)."""
    method: str
    """How the newest decision was made: ``config`` or ``rule``."""
    observations: int
    """Link observations taken."""
    decisions: int
    """Decisions the rule made (the config's initial one not counted)."""
    bandwidth_Bps: float
    """The newest observed link's bandwidth (bytes/s); NaN before any."""
    latency_s: float
    """Its one-way latency (seconds); NaN before any."""
    overhead_s: float
    """Its per-message overhead (seconds); NaN before any."""
    emulated_bandwidth_gbps: float | None
    """``P3Config.emulated_bandwidth_gbps``: the runtimes' link is EMULATED at this rate (None: real)."""

    def summary_lines(self) -> list[str]:
        line = (f"p3: policy {self.policy}, auto {'on' if self.auto else 'off'}: slice {self.slice_elements:,d} "
                f"elements, credit {self.credit_bytes:,d} bytes ({self.method})")
        if self.observations:
            emulated = ", bandwidth EMULATED" if self.emulated_bandwidth_gbps is not None else ""
            line += (f"; link {self.bandwidth_Bps * 8 / 1e9:.3g} Gb/s, latency {self.latency_s * 1e6:.0f} us, "
                     f"overhead {self.overhead_s * 1e6:.0f} us ({self.observations} observation"
                     f"{'s' if self.observations != 1 else ''}{emulated})")
        else:
            line += "; no link measured yet"
        return [line]

    def gauges(self) -> list[GaugeValue]:
        tags = (("policy", self.policy), ("method", self.method))
        return [GaugeValue("pdml_p3_slice_bytes", "bytes per P3 gradient slice in force (elements x element size)",
                           self.slice_elements * self.element_size, tags),
                GaugeValue("pdml_p3_credit_bytes", "bytes a P3 link may have in flight (the credit window) in force",
                           self.credit_bytes, tags),
                GaugeValue("pdml_p3_link_bandwidth_bytes_per_second", "bandwidth of the newest measured P3 link",
                           self.bandwidth_Bps, (("emulated", "bandwidth" if self.emulated_bandwidth_gbps else "none"),)),
                GaugeValue("pdml_p3_link_observations_total", "link measurements the P3 axis took",
                           self.observations, ()),
                GaugeValue("pdml_p3_decisions_total", "slice size and credit decisions the P3 rule made",
                           self.decisions, ())]


class P3Deriver(Deriver):
    """The slice size and credit of both P3 runtimes: the config's, or the rule's over the measured link."""

    name = "p3"

    def __init__(self, config: PDMLConfig, num_workers: int) -> None:
        super().__init__(config, num_workers)
        assert config.p3 is not None
        self.p3 = config.p3
        self.link: tuple[float, float, float] | None = None  # newest observation's slowest link
        self.observations = 0
        self.decisions = 0
        self.unused = False  # an observation arrived since the last decide
        self.choice = (self.p3.slice_elements, self.p3.effective_credit_bytes)  # (slice elements, credit bytes) in force
        self.method = "config"

    def initial(self) -> P3Decision:
        """The config's slice size and credit: what runs until the rule decides (always, with auto off)."""
        why = ("P3Config's slice_elements and credit (auto off)" if not self.p3.auto else
               "P3Config's slice_elements and credit until the runtime has measured its link (auto)")
        return P3Decision(version=-1, effective_step=-1, slice_elements=self.p3.slice_elements,
                          credit_bytes=self.p3.effective_credit_bytes, method="config", reason=why)

    # -- telemetry ----------------------------------------------------------------------------------
    def observation_rejection(self, rows: object) -> Rejection | None:
        """Why one link observation cannot be taken whole, or None."""
        if not isinstance(rows, (list, tuple)) or not 1 <= len(rows) <= MAX_LINKS_PER_OBSERVATION:
            return Rejection("p3", f"a P3 link observation must be a list of 1 to {MAX_LINKS_PER_OBSERVATION} rows, "
                                   f"got {type(rows).__name__}")
        for row in rows:
            ok = type(row) is tuple and len(row) == 3 and all(  # noqa: E721
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in row)
            if ok:
                bandwidth, latency, overhead = row
                ok = 0 < bandwidth <= MAX_BANDWIDTH_BPS and 0 <= latency <= MAX_LINK_S and 0 <= overhead <= MAX_LINK_S
            if not ok:
                return Rejection("p3", f"a P3 link row must be (bandwidth bytes/s in (0, {MAX_BANDWIDTH_BPS:g}], "
                                       f"latency s and overhead s in [0, {MAX_LINK_S:g}]), got {row!r:.120}")
        return None

    def observe(self, step: int, rows: Sequence[tuple]) -> None:
        """The slowest of the observed links (lowest bandwidth, highest latency and overhead): every rank
        of an all-reduce, and every worker of a parameter-server step, waits for it."""
        self.link = (float(min(r[0] for r in rows)), float(max(r[1] for r in rows)), float(max(r[2] for r in rows)))
        self.observations += 1
        self.unused = True

    # -- the protocol -------------------------------------------------------------------------------
    def ingest(self, reports: Sequence[WorkerReport]) -> None:
        """Worker reports carry nothing for this axis (its telemetry is ``observe``'s)."""

    def decide(self, boundary: Boundary, earlier: Mapping[str, Decision]) -> P3Decision | None:
        if not (self.p3.auto and self.unused and self.link is not None):
            return None
        self.unused = False
        bandwidth, latency, overhead = self.link
        choice = tune(LinkModel(bandwidth, latency, overhead), element_size=self.p3.element_size)
        new = (choice.slice_elements, int(round(choice.credit_bytes)))
        if new == self.choice:
            return None  # the same slicing: a switch would only cost the runtimes a flush
        self.choice, self.method = new, "rule"
        self.decisions += 1
        return P3Decision(version=-1, effective_step=-1, slice_elements=new[0], credit_bytes=new[1], method="rule",
                          bandwidth_Bps=bandwidth, latency_s=latency, overhead_s=overhead, reason=choice.reason)

    def stats(self) -> P3AxisStats:
        nan = float("nan")
        bandwidth, latency, overhead = self.link if self.link is not None else (nan, nan, nan)
        return P3AxisStats(policy=self.p3.policy, auto=self.p3.auto, slice_elements=self.choice[0],
                           credit_bytes=self.choice[1], element_size=self.p3.element_size, method=self.method,
                           observations=self.observations, decisions=self.decisions, bandwidth_Bps=bandwidth,
                           latency_s=latency, overhead_s=overhead,
                           emulated_bandwidth_gbps=self.p3.emulated_bandwidth_gbps)

    def state_dict(self) -> dict[str, Any]:
        return {"link": self.link, "observations": self.observations, "decisions": self.decisions,
                "unused": self.unused, "choice": self.choice, "method": self.method}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not (isinstance(state, dict) and set(state) == {"link", "observations", "decisions", "unused", "choice",
                                                            "method"}):
            raise StateError("saved P3 axis state must hold link, observations, decisions, unused, choice and method, "
                             "as P3Deriver.state_dict() writes it")
        link, choice = state["link"], state["choice"]
        if link is not None and self.observation_rejection([link]) is not None:
            raise StateError(f"saved P3 link {link!r:.120} is not a link an observation could give")
        probe = P3Decision(version=0, effective_step=0, slice_elements=choice[0] if isinstance(choice, tuple) else -1,
                           credit_bytes=choice[1] if isinstance(choice, tuple) and len(choice) == 2 else -1,
                           method=state["method"], bandwidth_Bps=link[0] if link else float("nan"),
                           latency_s=link[1] if link else float("nan"), overhead_s=link[2] if link else float("nan"))
        try:
            probe.validate()
        except Exception as e:  # noqa: BLE001 - whatever is malformed, refused as a state error
            raise StateError(f"saved P3 axis choice is malformed: {e}") from None
        counts = (state["observations"], state["decisions"])
        if not (all(type(c) is int and c >= 0 for c in counts) and isinstance(state["unused"], bool)):  # noqa: E721
            raise StateError(f"saved P3 axis counts must be integers >= 0, got {counts!r:.80}")
        self.link = tuple(float(v) for v in link) if link is not None else None  # type: ignore[assignment]
        self.observations, self.decisions = counts
        self.unused, self.choice, self.method = state["unused"], (int(choice[0]), int(choice[1])), state["method"]
