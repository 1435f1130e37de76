"""The deriver seam: what every priority axis implements, so a new axis is new files, not surgery.

A deriver turns worker reports into decisions (measure -> derive -> decide):

    ingest(reports)             fold accepted reports into its estimates (the scheduler has already
                                rejected malformed ones; see ``WorkerReport.problem``)
    decide(boundary, earlier)   at a decision boundary: a new decision, or None to keep the current
                                one; ``earlier`` holds what derivers before it in the registry
                                decided for this boundary (sample plans are sized by the node decision)
    stats()                     a frozen, typed record of what it knows (``DeriverStats``)
    state_dict / load_state_dict    for checkpoints

Decisions come back unstamped (``version`` and ``effective_step`` as placeholders): the scheduler
alone stamps them. Event hooks (``bind``, ``on_register``, ``on_dataset``) are no-ops unless overridden, like
Ray Train's callbacks. Derivers are pure: no Ray, no clocks that change decisions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, Rejection, WorkerReport
from pdml_ray.errors import ReportError


@dataclass(frozen=True, slots=True)
class GaugeValue:
    """One metric sample a stats record exports (``ray.util.metrics`` gauge ``name``)."""

    name: str
    description: str
    value: float
    tags: tuple[tuple[str, str], ...] = ()
    """(key, value) pairs besides the run name, e.g. (("worker", "0"), ("accelerator_type", "H100"))."""


class DeriverStats(Protocol):
    """A deriver's typed stats record: printable for ``pdml-ray status``, exportable as gauges."""

    def summary_lines(self) -> list[str]: ...

    def gauges(self) -> list[GaugeValue]: ...


class Deriver:
    """Base class of every priority axis; subclasses implement the four abstract methods."""

    name: ClassVar[str]
    keep_history: ClassVar[bool] = True
    """Whether the scheduler keeps every published decision (False for large ones, e.g. sample plans)."""
    history_rows: ClassVar[int | None] = None
    """Most decisions the scheduler keeps for this axis (None: its default bound by the number of workers)."""

    def __init__(self, config: PDMLConfig, num_workers: int) -> None:
        self.config = config
        self.num_workers = num_workers

    # -- events (no-ops by default) -----------------------------------------------------------------
    def bind(self, peers: Mapping[str, "Deriver"]) -> None:
        """The scheduler hands every deriver all enabled derivers by name, once, after building them
        (the gradient deriver reads the node deriver's rates and the sample deriver's table). Read-only
        use only: a deriver never changes a peer's state."""

    def on_register(self, worker_id: int, accelerator_type: str) -> None:
        """A worker announced its accelerator type (at start-up or after a restart)."""

    def on_dataset(self, num_samples: int) -> None:
        """Rank 0 announced the data set size."""

    def on_shape(self, shape: Mapping[str, Any]) -> None:
        """A runtime announced the shape this axis plans for (the pipeline's stages x replicas); an axis
        that takes no shape refuses one."""
        raise ReportError(f"the {self.name!r} axis takes no shape (set_shape is for the pipeline axis)")

    def observation_rejection(self, rows: object) -> Rejection | None:
        """Why one step's axis telemetry (``Scheduler.observe``) cannot be taken whole, or None."""
        return Rejection("axis", f"the {self.name!r} axis takes no telemetry besides worker reports")

    def observe(self, step: int, rows: Sequence[Any]) -> None:
        """Fold one step's axis telemetry in (checked first by ``observation_rejection``)."""

    def initial(self) -> Decision | None:
        """The decision in force before the first boundary (unstamped), if the axis has one."""
        return None

    # -- the protocol -------------------------------------------------------------------------------
    def ingest(self, reports: Sequence[WorkerReport]) -> None:
        raise NotImplementedError

    def decide(self, boundary: Boundary, earlier: Mapping[str, Decision]) -> Decision | None:
        raise NotImplementedError

    def stats(self) -> DeriverStats | None:
        """The typed stats record, or None while the axis has nothing to say (no data set yet)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError
