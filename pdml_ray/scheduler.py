"""The scheduler: ingests worker reports, runs the enabled derivers, publishes versioned decisions.

A plain class (no Ray): ``pdml_ray.actors.scheduler`` wraps it in a named actor. Workers never wait
on it during a step: reports arrive fire-and-forget in batches, and rank 0 picks up the newest
decisions asynchronously at step boundaries.

What it owns, and no deriver does:
- validation of reports (a malformed report moves no estimate and is counted);
- the derivers the config enables (``pdml_ray.priority.registry``), run in registry order;
- stamping: every published decision gets the next version of its axis and the boundary's first
  step as ``effective_step``. A decision whose bundle reached the workers after its step (they
  never adopted it) is re-issued, with a new version, for the next boundary; so every decision a
  worker runs is in this history with the same version and effective step;
- the report log (telemetry columns), named one-off measurements, and checkpoint state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, StepBundle, WorkerReport
from pdml_ray.errors import ReportError, StateError
from pdml_ray.priority.base import Deriver, DeriverStats, GaugeValue
from pdml_ray.priority.registry import make_derivers

log = logging.getLogger(__name__)

# Report log rows kept for summaries: (worker, step, samples, compute_s, wait_s, step_s, overhead_s, loss)
_LOG_COLUMNS = ("worker_id", "step", "samples", "compute_s", "wait_s", "step_s", "overhead_s", "loss")
_HISTORY_ROWS = 10_000  # decisions kept per axis (a run deciding every 5 steps: 50,000 steps)


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
    emulation: str | None = None
    """What the run EMULATES (speeds, compute), in words; None when nothing is."""
    process_cpu_s: float | None = None
    """CPU seconds of the scheduler actor's process since it started (the actor shell sets it; None
    in-process). With ``ingest_s`` it is the scheduler's own cost."""
    process_cpu_marks: tuple[tuple[int, float], ...] = ()
    """(newest step reported, ``process_cpu_s``) after each batch of reports, the latest 2000: the
    scheduler's CPU per training step over any window (the actor shell sets them)."""

    def summary_lines(self) -> list[str]:
        versions = ", ".join(f"{name} v{v}" for name, v in self.versions.items())
        lines = [f"decisions: {versions}; reports {self.reports_received} (rejected {self.reports_rejected}), "
                 f"last step {self.last_step}"]
        if self.process_cpu_s is not None:
            lines[0] += f"; scheduler CPU {self.process_cpu_s:.2f} s"
        if self.emulation:
            lines.insert(0, self.emulation)
        for stats in self.derivers.values():
            lines += stats.summary_lines()
        return lines

    def gauges(self) -> list[GaugeValue]:
        out = [GaugeValue("pdml_reports_rejected", "worker reports rejected so far", self.reports_rejected)]
        if "node" in self.versions:
            out.append(GaugeValue("pdml_decision_version", "version of the current node decision", self.versions["node"]))
        for stats in self.derivers.values():
            out += stats.gauges()
        if self.emulation:  # the dashboard's help text says so too
            out = [dataclasses.replace(g, description=f"{g.description} [{self.emulation}]") for g in out]
        return out


class Scheduler:
    """Central state of one training run: derivers, versioned decisions, telemetry log."""

    def __init__(self, config: PDMLConfig, num_workers: int, max_log_rows: int = 200_000):
        config.node_priority.check_workers(num_workers)
        self.config = config
        self.num_workers = num_workers
        self.derivers: dict[str, Deriver] = make_derivers(config, num_workers)
        for deriver in self.derivers.values():
            deriver.bind(self.derivers)
        self.versions: dict[str, int] = {}
        self.current: dict[str, Decision] = {}  # newest published decision per deriver
        self.history: dict[str, deque[Decision]] = {name: deque(maxlen=_HISTORY_ROWS) for name in self.derivers}
        self.num_samples: int | None = None
        self.reports_received = 0
        self.reports_rejected = 0
        self.rejections: deque[str] = deque(maxlen=100)  # the latest reasons, for logs and status
        self.last_step = -1  # newest step any accepted report came from
        self.ingest_s = 0.0  # time spent inside report() (seconds): the scheduler's own cost
        self._log: deque[tuple] = deque(maxlen=max_log_rows)
        self.measurements: dict[str, float] = {}  # named one-off measurements from workers (e.g. comm_s)
        for name, deriver in self.derivers.items():
            initial = deriver.initial()
            if initial is not None:
                self._publish(name, initial, 0)

    # -- inputs ------------------------------------------------------------------------------------
    def register(self, worker_id: int, accelerator_type: str) -> None:
        """A worker announces its accelerator type (the node prior follows it at the next boundary)."""
        if not (isinstance(worker_id, int) and 0 <= worker_id < self.num_workers):
            raise ReportError(f"register: unknown worker {worker_id!r} (this run has {self.num_workers} workers, "
                              f"ids 0..{self.num_workers - 1})")
        for deriver in self.derivers.values():
            deriver.on_register(worker_id, accelerator_type)

    def record_measurement(self, name: str, value: float) -> None:
        """Keep a named one-off measurement (a benchmark's comm_s, say) with the run's telemetry."""
        self.measurements[name] = float(value)

    def set_dataset_size(self, num_samples: int) -> None:
        """Called once by rank 0; derivers that need it (the sample table) set themselves up."""
        if self.num_samples == num_samples:
            return
        self.num_samples = num_samples
        for deriver in self.derivers.values():
            deriver.on_dataset(num_samples)

    def report(self, reports: list[WorkerReport]) -> None:
        """Ingest a batch of reports (fire-and-forget from workers); malformed ones are counted, not used."""
        t0 = time.perf_counter()
        accepted = []
        for r in reports:
            problem = r.problem(self.num_workers)
            if problem is not None:
                self.reports_rejected += 1
                self.rejections.append(problem)
                log.warning("rejected report: %s", problem)
                continue
            accepted.append(r)
            self.last_step = max(self.last_step, r.step)
            self._log.append((r.worker_id, r.step, r.samples, r.compute_s, r.wait_s, r.step_s, r.overhead_s, r.loss))
        self.reports_received += len(accepted)
        if accepted:
            for deriver in self.derivers.values():
                deriver.ingest(accepted)
        self.ingest_s += time.perf_counter() - t0

    # -- outputs -----------------------------------------------------------------------------------
    def bundle(self, boundary: Boundary, since: Mapping[str, int]) -> StepBundle:
        """Decisions to adopt at ``boundary.first_step``: per deriver, a new one if it decides so, else
        its newest if newer than the version ``since[name]`` the workers run on.

        Derivers decide here, once per interval, on everything reported so far (deciding on every
        report batch published a version per worker flush, each on partly updated estimates).
        """
        out: dict[str, Decision] = {}
        for name, deriver in self.derivers.items():
            seen = since.get(name, -1)
            if seen > self.versions.get(name, -1):
                # this scheduler restarted and lost its state: continue the workers' numbering so its
                # next decision is newer than the one they run on (the current one is not re-sent)
                self.versions[name] = seen
                if name in self.current:
                    self.current[name] = dataclasses.replace(self.current[name], version=seen)  # type: ignore[type-var]
            new = deriver.decide(boundary, out)
            current = self.current.get(name)
            if new is not None:
                current = self._publish(name, new, boundary.first_step)
                log.info("%s", current)
            elif current is not None and current.version > seen and current.effective_step != boundary.first_step:
                # published for a step the workers passed without it (its bundle came late): re-issue it
                current = self._publish(name, current, boundary.first_step)
            if current is not None and current.version > seen:
                out[name] = current
        return StepBundle(out)

    def _publish(self, name: str, decision: Decision, step: int) -> Decision:
        """Stamp ``decision`` with the next version of its axis, effective from ``step``."""
        version = self.versions.get(name, -1) + 1
        self.versions[name] = version
        stamped = dataclasses.replace(decision, version=version, effective_step=step)  # type: ignore[type-var]
        self.current[name] = stamped
        if self.derivers[name].keep_history:
            self.history[name].append(stamped)
        return stamped

    def decision(self, name: str = "node") -> Decision | None:
        """The newest published decision of deriver ``name``."""
        return self.current.get(name)

    def decision_history(self, name: str = "node") -> list[dict[str, Any]]:
        """Every kept decision of deriver ``name`` as plain dicts, oldest first."""
        return [d.to_dict() for d in self.history.get(name, ())]  # type: ignore[attr-defined]

    def telemetry(self) -> dict[str, np.ndarray]:
        """The report log as columns (numpy arrays), for summaries and benchmarks."""
        rows = np.array(self._log, dtype=np.float64) if self._log else np.zeros((0, len(_LOG_COLUMNS)))
        return {name: rows[:, i] for i, name in enumerate(_LOG_COLUMNS)}

    def stats(self) -> SchedulerStats:
        per_deriver = {name: d.stats() for name, d in self.derivers.items()}
        return SchedulerStats(versions=dict(self.versions), reports_received=self.reports_received,
                              reports_rejected=self.reports_rejected, last_step=self.last_step,
                              ingest_s=self.ingest_s, measurements=dict(self.measurements),
                              derivers={name: s for name, s in per_deriver.items() if s is not None},
                              emulation=self.config.node_priority.emulation)

    # -- checkpoint --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        kept = [name for name, d in self.derivers.items() if d.keep_history]
        return {"derivers": {name: d.state_dict() for name, d in self.derivers.items()},
                "versions": dict(self.versions),
                "current": {name: self.current[name] for name in kept if name in self.current},
                "history": {name: list(self.history[name]) for name in kept},
                "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = sorted(set(state["derivers"]) ^ set(self.derivers))
        if missing:
            raise StateError(f"saved scheduler state has derivers {sorted(state['derivers'])}, this run enables "
                             f"{sorted(self.derivers)}; resume with the same PDMLConfig (sample_priority on or off)")
        if state.get("num_samples") is not None:
            self.set_dataset_size(state["num_samples"])
        for name, deriver in self.derivers.items():
            deriver.load_state_dict(state["derivers"][name])
        self.versions = dict(state["versions"])
        self.current.update(state["current"])
        for name, decisions in state["history"].items():
            self.history[name] = deque(decisions, maxlen=_HISTORY_ROWS)
