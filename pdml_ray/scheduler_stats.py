"""The scheduler's records: its stats, per-worker step times, and the bounded report log.

Plain data and numpy (no Ray). ``pdml_ray.scheduler.Scheduler`` fills them: ``SchedulerStats`` is what
it reports (``stats()``; re-exported by ``pdml_ray.scheduler`` and ``pdml_ray``), ``WorkerTimes`` the
per-worker step-time split inside it, and ``ReportLog`` the ring buffer of report rows it keeps for
summaries, so its memory stays flat however long a run goes.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdml_ray.priority.base import DeriverStats, GaugeValue

# Report log rows kept for summaries: (worker, step, samples, compute_s, wait_s, step_s, overhead_s, loss)
_LOG_COLUMNS = ("worker_id", "step", "samples", "compute_s", "wait_s", "step_s", "overhead_s", "loss")


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """What the scheduler knows: its own counters plus each enabled deriver's typed stats record."""

    versions: Mapping[str, int]
    """Newest published decision version per deriver."""
    reports_received: int
    reports_rejected: int
    last_step: int
    """Newest step any accepted report came from (-1 before any)."""
    ingest_s: float
    """Seconds spent inside ``report()``: the scheduler's own cost."""
    measurements: Mapping[str, float]
    derivers: Mapping[str, DeriverStats] = field(default_factory=dict)
    rejected_by_kind: Mapping[str, int] = field(default_factory=dict)
    """Rejected reports by the field at fault (``worker_id``, ``compute_s``, ``sample_indices``, ...)."""
    decide_errors: int = 0
    """Boundaries at which a deriver failed to decide (its axis kept its decision; the others went out)."""
    deriver_errors: Mapping[str, int] = field(default_factory=dict)
    """Contained deriver failures per axis (an exception in ingest, decide or stats, or a decision that
    failed its check): the axis kept its decision each time."""
    deriver_error_reasons: tuple[str, ...] = ()
    """The latest of those failures ("axis phase: error"), newest last."""
    emulation: str | None = None
    """What the run EMULATES (speeds, compute), in words; None when nothing is."""
    process_cpu_s: float | None = None
    """CPU seconds of the scheduler actor's process since it started (the actor shell sets it; None
    in-process). With ``ingest_s`` it is the scheduler's own cost."""
    process_cpu_marks: tuple[tuple[int, float], ...] = ()
    """(newest step reported, ``process_cpu_s``) after each batch of reports, the latest 2000: the
    scheduler's CPU per training step over any window (the actor shell sets them)."""
    restarts: int = 0
    """Times the scheduler actor died and Ray restarted it from its last snapshot (the actor shell sets
    it; the counters above then include what the snapshot held, not the reports since it was taken)."""
    decision_s: float = 0.0
    """Seconds spent inside ``bundle()`` (deriving the decisions of every boundary asked for)."""
    decision_requests: int = 0
    """``bundle()`` calls served: ``decision_s / decision_requests`` is the mean decision latency."""
    last_decision_s: float = float("nan")
    """Seconds the newest ``bundle()`` call took (nan before one)."""
    worker_times: tuple["WorkerTimes", ...] = ()
    """Per worker, its recent step, compute and wait seconds (mean over its newest reports): what
    shows a straggler. Empty before any report."""

    def summary_lines(self) -> list[str]:
        versions = ", ".join(f"{name} v{v}" for name, v in self.versions.items())
        lines = [f"decisions: {versions}; reports {self.reports_received} (rejected {self.reports_rejected}), "
                 f"last step {self.last_step}"]
        if self.rejected_by_kind:
            lines[0] += " [rejected: " + ", ".join(f"{k} {n}" for k, n in sorted(self.rejected_by_kind.items())) + "]"
        if self.decide_errors:
            lines[0] += f"; derivers failed to decide {self.decide_errors} times"
        if self.deriver_errors:
            lines.append("deriver errors (each axis kept its decision): "
                         + ", ".join(f"{axis} {n}" for axis, n in sorted(self.deriver_errors.items()))
                         + (f"; latest: {self.deriver_error_reasons[-1]}" if self.deriver_error_reasons else ""))
        if self.process_cpu_s is not None:
            lines[0] += f"; scheduler CPU {self.process_cpu_s:.2f} s"
        if self.restarts:
            lines[0] += f"; actor restarted {self.restarts}x from its snapshot"
        if self.emulation:
            lines.insert(0, self.emulation)
        for stats in self.derivers.values():
            lines += stats.summary_lines()
        return lines

    def gauges(self) -> list[GaugeValue]:
        """The scheduler's own series plus every deriver's. Prometheus conventions: a name ending in
        ``_total`` is a counter (exported as increments of the cumulative count); every other name is a
        gauge whose name carries its unit (``_seconds``, ``_samples``, ``_ratio``, ...)."""
        out = [GaugeValue("pdml_reports_received_total", "worker reports accepted by the scheduler",
                          self.reports_received),
               GaugeValue("pdml_scheduler_decide_errors_total",
                          "boundaries at which a deriver failed to decide (its axis kept its decision)",
                          self.decide_errors),
               GaugeValue("pdml_scheduler_ingest_seconds_total", "seconds the scheduler spent ingesting reports",
                          self.ingest_s),
               GaugeValue("pdml_scheduler_decision_requests_total",
                          "decision requests (bundles) the scheduler served", self.decision_requests),
               GaugeValue("pdml_scheduler_decision_seconds_total",
                          "seconds the scheduler spent deciding (rate over pdml_scheduler_decision_requests_total "
                          "rate: mean decision latency)", self.decision_s),
               GaugeValue("pdml_last_step", "newest training step any worker reported", self.last_step)]
        out += [GaugeValue("pdml_reports_rejected_total", "worker reports rejected, by the field at fault", n,
                           (("field", kind),)) for kind, n in sorted(self.rejected_by_kind.items())]
        out += [GaugeValue("pdml_scheduler_deriver_errors_total", "contained failures of a priority axis's deriver "
                           "(ingest, decide or stats; the axis kept its decision)", n, (("axis", axis),))
                for axis, n in sorted(self.deriver_errors.items())]
        if math.isfinite(self.last_decision_s):
            out.append(GaugeValue("pdml_scheduler_decision_latency_seconds",
                                  "seconds the scheduler took for its newest decision request", self.last_decision_s))
        if self.process_cpu_s is not None:
            out.append(GaugeValue("pdml_scheduler_cpu_seconds_total", "CPU seconds of the scheduler actor's process",
                                  self.process_cpu_s))
        out.append(GaugeValue("pdml_scheduler_restarts_total", "times Ray restarted the scheduler actor from its "
                              "last snapshot", self.restarts))
        out += [GaugeValue("pdml_decision_version", "version of the newest published decision of each priority axis",
                           v, (("axis", axis),)) for axis, v in sorted(self.versions.items())]
        node = self.derivers.get("node")
        types = getattr(node, "accelerator_types", ())
        for t in self.worker_times:
            tags = (("worker", str(t.worker)), ("accelerator_type", types[t.worker] if t.worker < len(types) else "CPU"))
            out.append(GaugeValue("pdml_worker_last_step", "newest step the worker reported", t.last_step, tags))
            if math.isfinite(t.step_s):
                out.append(GaugeValue("pdml_worker_step_seconds", "the worker's recent wall time per step "
                                      "(compute, waits and overhead; mean over its newest reports)", t.step_s, tags))
            out += [GaugeValue("pdml_worker_compute_seconds", "the worker's recent compute time per step "
                               "(forward and backward; mean over its newest reports)", t.compute_s, tags),
                    GaugeValue("pdml_worker_wait_seconds", "the worker's recent wait on collectives per step "
                               "(mean over its newest reports)", t.wait_s, tags)]
        for stats in self.derivers.values():
            out += stats.gauges()
        if self.emulation:  # the dashboard's help text says so too
            out = [dataclasses.replace(g, description=f"{g.description} [{self.emulation}]") for g in out]
        return out


@dataclass(frozen=True, slots=True)
class WorkerTimes:
    """One worker's recent step-time split (seconds, means over its newest reports in the log)."""

    worker: int
    last_step: int
    step_s: float
    """nan when the reports did not carry a step time."""
    compute_s: float
    wait_s: float


_RECENT_ROWS_PER_WORKER = 8
"""Per-worker times are means over the newest ``8 x num_workers`` report rows (about 8 steps each)."""


def recent_worker_times(rows: np.ndarray, num_workers: int) -> tuple[WorkerTimes, ...]:
    """Per-worker means of step, compute and wait seconds over report-log ``rows`` (columns as
    ``_LOG_COLUMNS``), and each worker's newest step; workers without a row are left out."""
    if len(rows) == 0:
        return ()
    w = rows[:, 0].astype(np.int64)
    ok = (w >= 0) & (w < num_workers)
    rows, w = rows[ok], w[ok]
    count = np.bincount(w, minlength=num_workers)
    compute = np.bincount(w, rows[:, 3], minlength=num_workers)
    wait = np.bincount(w, rows[:, 4], minlength=num_workers)
    has_step = np.isfinite(rows[:, 5])
    step_n = np.bincount(w[has_step], minlength=num_workers)
    step = np.bincount(w[has_step], rows[has_step, 5], minlength=num_workers)
    last = np.full(num_workers, -1.0)
    np.maximum.at(last, w, rows[:, 1])
    return tuple(WorkerTimes(i, int(last[i]), float(step[i] / step_n[i]) if step_n[i] else float("nan"),
                             float(compute[i] / count[i]), float(wait[i] / count[i]))
                 for i in range(num_workers) if count[i])


class ReportLog:
    """The newest ``capacity`` report rows in a ring buffer allocated once (``capacity x 8`` float64:
    12.8 MB at the default 200,000 rows), so the scheduler's memory stays flat however long it runs."""

    def __init__(self, capacity: int) -> None:
        self._rows = np.empty((max(1, capacity), len(_LOG_COLUMNS)))
        self._rows.fill(0.0)  # touch every page now: the memory is taken at start, not while the run goes
        self._next = 0  # rows ever appended; the newest lives at (_next - 1) % capacity

    def append(self, row: tuple) -> None:
        self._rows[self._next % len(self._rows)] = row
        self._next += 1

    def extend(self, rows: list[tuple]) -> None:
        """Append many rows with one conversion (a batch of reports: ~5x cheaper than row by row)."""
        if not rows:
            return
        block = np.array(rows, dtype=np.float64).reshape(len(rows), -1)
        cap = len(self._rows)
        if len(block) > cap:
            self._next += len(block) - cap
            block = block[-cap:]
        start = self._next % cap
        first = min(len(block), cap - start)
        self._rows[start:start + first] = block[:first]
        self._rows[:len(block) - first] = block[first:]
        self._next += len(block)

    def __len__(self) -> int:
        return min(self._next, len(self._rows))

    def newest(self, n: int) -> np.ndarray:
        """A copy of the newest ``n`` rows (fewer when fewer are kept), oldest first; O(n)."""
        n = min(n, len(self))
        idx = (np.arange(self._next - n, self._next)) % len(self._rows)
        return self._rows[idx]

    def rows(self) -> np.ndarray:
        """A copy of the kept rows, oldest first."""
        n, cap = self._next, len(self._rows)
        return self._rows[:n].copy() if n <= cap else np.roll(self._rows, -(n % cap), axis=0)


class InputLog:
    """The scheduler's inputs in the order it took them, for a deterministic replay (``pdml_ray.replay``).

    Each event is ``(kind, args...)``: ``("register", worker, type)``, ``("dataset", n)``, ``("shape", axis,
    shape)``, ``("report", rows)`` (packed report rows, as sent), ``("observe", axis, step, rows)`` and
    ``("bundle", first_step, num_steps, batch_sizes, since, decided)`` with ``decided`` the decisions
    the request returned, as dicts, to compare a replay against. Bounded: past ``maxlen`` events the
    oldest go, and ``dropped`` says how many (a replay then cannot start from the beginning)."""

    def __init__(self, maxlen: int) -> None:
        self.events: deque[tuple] = deque(maxlen=maxlen)
        self.dropped = 0

    def record(self, *event: Any) -> None:
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append(event)
