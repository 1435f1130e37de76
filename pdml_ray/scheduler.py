"""The scheduler: ingests worker reports, runs the enabled derivers, publishes versioned decisions.

A plain class (no Ray): ``pdml_ray.actors.scheduler`` wraps it in a named actor. Workers never wait
on it during a step: reports arrive fire-and-forget in batches, and rank 0 picks up the newest
decisions asynchronously at step boundaries.

What it owns, and no deriver does:
- validation of reports, where they enter (``WorkerReport.rejection`` plus a deriver's own
  ``report_rejection``, e.g. the sample table's index range): a malformed report moves no estimate, is
  counted by kind, and the rest of its batch is applied. Idle reports (0 samples) are logged only;
- the derivers the config enables (``pdml_ray.priority.registry``), run in registry order;
- stamping: every published decision gets the next version of its axis and the boundary's first
  step as ``effective_step``. A decision whose bundle reached the workers after its step (they
  never adopted it) is re-issued, with a new version, for the next boundary; so every decision a
  worker runs is in this history with the same version and effective step;
- containment: any exception a deriver raises in ``ingest``, ``observe``, ``decide`` or ``stats``, and any decision it
  makes that fails ``state_format.check_decision``, is caught here: that axis keeps its decision, the others
  go on, and the error is counted per axis, logged (the first, then every 1000th) and shown in
  ``stats()`` (``deriver_errors``), its gauges and ``pdml-ray status``. A deriver that raises in
  ``ingest`` takes none of that batch (each validates, then writes), the others all of it;
- the report log (telemetry columns), named one-off measurements, and checkpoint state, its counters
  included. Every history is bounded: decisions by rows and by numbers held (at 256 workers a
  decision is 768 numbers), rejection and error reasons to the latest 100 and 20 (plus counts by kind
  and axis), measurement names to 1,000. ``load_state_dict`` loads everything or changes nothing:
  it loads into copies of the derivers, checks every restored decision as a new one is checked
  (``state_format.check_decision``), and swaps them in only when all of it succeeded.

Its records (``SchedulerStats``, ``WorkerTimes``) and the report log's ring buffer (``ReportLog``) live
in ``pdml_ray.scheduler_stats``; ``SchedulerStats`` is re-exported here.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pdml_ray.client import PackedReports
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import MAX_STEP, Boundary, Decision, Rejection, StepBundle, WorkerReport
from pdml_ray.errors import ConfigError, PDMLError, PlanError, ReportError, StateError, shown
from pdml_ray.priority.base import Deriver
from pdml_ray.priority.registry import DERIVERS, make_derivers
from pdml_ray.scheduler_stats import (InputLog, _LOG_COLUMNS, _RECENT_ROWS_PER_WORKER, ReportLog, SchedulerStats,
                                      recent_worker_times)
from pdml_ray.state_format import check_decision

__all__ = ["Scheduler", "SchedulerStats"]

log = logging.getLogger(__name__)

_HISTORY_ROWS = 10_000  # decisions kept per axis (a run deciding every 5 steps: 50,000 steps) ...
_HISTORY_NUMBERS = 200_000  # ... and at most ~this many numbers per axis in memory (3 per worker; ~6 MB as Python floats)
_SAVED_HISTORY_NUMBERS = 100_000  # the newest decisions saved in the state: ~1 MB pickled at most
_REJECTION_REASONS = 100  # latest rejection reasons kept (counts by kind are kept for all)
_ERROR_REASONS = 20  # latest deriver errors kept (counts per axis are kept for all)
_LOG_EVERY = 1000  # the first of each kind of rejection or deriver error is logged, then every 1000th
_MESSAGE_CHARS = 300  # a kept or logged reason is cut to this many characters (a value can print huge)
_MEASUREMENTS = 1000  # named one-off measurements kept: a new name beyond is refused


def _history_rows(num_workers: int, numbers: int) -> int:
    """Decisions of ``num_workers`` workers (3 numbers each) that fit in ``numbers``, within [10, 10,000]."""
    return max(10, min(_HISTORY_ROWS, numbers // (3 * num_workers)))


class Scheduler:
    """Central state of one training run: derivers, versioned decisions, telemetry log."""

    def __init__(self, config: PDMLConfig, num_workers: int, max_log_rows: int = 200_000):
        if config.node_priority is not None:
            config.node_priority.check_workers(num_workers)
        self.config = config
        self.num_workers = num_workers
        self.derivers: dict[str, Deriver] = make_derivers(config, num_workers)
        if not self.derivers:
            raise ConfigError("this PDMLConfig enables no priority axis: set the section of each axis the run needs "
                              f"({', '.join(DERIVERS[n].config_field for n in DERIVERS)}); a Ray Train run needs "
                              "node_priority=NodePriorityConfig(global_batch_size=...)")
        for deriver in self.derivers.values():
            deriver.bind(self.derivers)
        self.versions: dict[str, int] = {}
        self.current: dict[str, Decision] = {}  # newest published decision per deriver
        self.history_rows = _history_rows(num_workers, _HISTORY_NUMBERS)
        self.history: dict[str, deque[Decision]] = {name: deque(maxlen=d.history_rows or self.history_rows)
                                                    for name, d in self.derivers.items()}
        self.num_samples: int | None = None
        self.reports_received = 0
        self.reports_rejected = 0
        self.rejected_by_kind: dict[str, int] = {}  # rejected reports by the field at fault
        self.rejections: deque[str] = deque(maxlen=_REJECTION_REASONS)  # the latest reasons, for logs and status
        self.decide_errors = 0
        self.deriver_errors: dict[str, int] = {}  # contained deriver failures per axis (ingest, decide, stats)
        self.deriver_error_reasons: deque[str] = deque(maxlen=_ERROR_REASONS)
        self.last_step = -1  # newest step any accepted report came from
        self.ingest_s = 0.0  # time spent inside report() (seconds): the scheduler's own cost
        self.decision_s = 0.0  # time spent inside bundle() (seconds)
        self.decision_requests = 0  # bundle() calls
        self.last_decision_s = float("nan")  # the newest bundle() call's time (seconds)
        self._log = ReportLog(max_log_rows)
        self.inputs: InputLog | None = InputLog(config.replay_log) if config.replay_log else None
        """What this scheduler took, in order, for ``pdml_ray.replay`` (``PDMLConfig.replay_log``; None: off)."""
        self.measurements: dict[str, float] = {}  # named one-off measurements from workers (e.g. comm_s)
        self.shapes: dict[str, Any] = {}  # the newest shape announced per axis (set_shape), kept across a resize
        for name, deriver in self.derivers.items():
            initial = deriver.initial()
            if initial is not None:
                self._publish(name, initial, 0)

    def resize(self, num_workers: int) -> None:
        """Ray Train restarted the run's workers with another count (``ScalingConfig(num_workers=(min,
        max))``, elastic). The node axis starts over for the new count: a fresh deriver, whose shares come
        from the accelerator prior (each worker registers its type again as it starts, and the first
        boundary after the restart re-derives them), its decision published at once with the next
        version (the numbering continues). Decisions for the old count leave the history, which holds
        only decisions this run could publish now (``load_state_dict`` checks them so). The shapes
        announced so far (a BatchNorm floor) are announced again. The other axes do not support a
        changing count and are refused in elastic runs (``PDMLTrainer``)."""
        if not (isinstance(num_workers, int) and not isinstance(num_workers, bool) and num_workers >= 1):
            raise ReportError(f"resize: num_workers must be an integer >= 1, got {shown(num_workers)}")
        if num_workers == self.num_workers:
            return
        if set(self.derivers) != {"node"}:
            raise ConfigError(f"elastic worker counts work with the node axis alone; this run enables "
                              f"{sorted(self.derivers)}: leave the other PDMLConfig sections unset, or fix num_workers")
        self.config.node.check_workers(num_workers)  # ConfigError naming the bound a new count breaks
        log.info("resize: %d -> %d workers; node shares start from the accelerator prior", self.num_workers,
                 num_workers)
        self.num_workers = num_workers
        self.derivers = make_derivers(self.config, num_workers)
        for deriver in self.derivers.values():
            deriver.bind(self.derivers)
        for axis, shape in self.shapes.items():
            self.derivers[axis].on_shape(shape)
        self.history_rows = _history_rows(num_workers, _HISTORY_NUMBERS)
        self.history = {name: deque(maxlen=d.history_rows or self.history_rows) for name, d in self.derivers.items()}
        for name, deriver in self.derivers.items():
            initial = deriver.initial()
            if initial is not None:
                self._publish(name, initial, max(self.last_step + 1, 0))

    # -- inputs ------------------------------------------------------------------------------------
    def register(self, worker_id: int, accelerator_type: str) -> None:
        """A worker announces its accelerator type (the node prior follows it at the next boundary)."""
        if not (isinstance(worker_id, int) and not isinstance(worker_id, bool) and 0 <= worker_id < self.num_workers):
            raise ReportError(f"register: unknown worker {shown(worker_id)} (this run has {self.num_workers} workers, "
                              f"ids 0..{self.num_workers - 1})")
        if not isinstance(accelerator_type, str):
            raise ReportError("register: accelerator_type must be a string such as 'A100', got "
                              f"{shown(accelerator_type)}")
        if self.inputs is not None:
            self.inputs.record("register", worker_id, accelerator_type)
        for deriver in self.derivers.values():
            deriver.on_register(worker_id, accelerator_type)

    def record_measurement(self, name: str, value: float) -> None:
        """Keep a named one-off measurement (a benchmark's comm_s, say) with the run's telemetry."""
        if not (isinstance(name, str) and isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value)):
            raise ReportError(f"record_measurement: give a name (str) and a finite number, got {shown(name, 60)}="
                              f"{shown(value, 60)}")
        if name not in self.measurements and len(self.measurements) >= _MEASUREMENTS:
            raise ReportError(f"record_measurement: {_MEASUREMENTS} measurement names are kept already; reuse a name "
                              f"instead of {shown(name, 60)}")
        self.measurements[name] = float(value)

    def set_dataset_size(self, num_samples: int) -> None:
        """Called once by rank 0; derivers that need it (the sample table) set themselves up."""
        if not (isinstance(num_samples, int) and not isinstance(num_samples, bool) and num_samples >= 1):
            raise ReportError(f"set_dataset_size: num_samples must be an integer >= 1 (the data set size), "
                              f"got {shown(num_samples)}")
        if self.num_samples == num_samples:
            return
        self.num_samples = num_samples
        if self.inputs is not None:
            self.inputs.record("dataset", num_samples)
        for deriver in self.derivers.values():
            deriver.on_dataset(num_samples)

    def set_shape(self, axis: str, shape: Mapping[str, Any]) -> None:
        """A runtime announces the shape axis ``axis`` plans for (the pipeline runtime: its stages,
        replicas per stage and micro-batches per step); ReportError if the axis is off or refuses it."""
        deriver = self._axis(axis)
        if self.inputs is not None:
            self.inputs.record("shape", axis, dict(shape) if isinstance(shape, Mapping) else shape)
        deriver.on_shape(shape)
        self.shapes[axis] = shape

    def observe(self, axis: str, step: int, rows: Sequence[Any]) -> bool:
        """One step's telemetry for axis ``axis`` beyond worker reports (the pipeline runtime: each action's
        latency, as (stage, replica, 'F' or 'B', microbatch, seconds) tuples). Checked whole first: a
        malformed observation is refused and counted like a malformed report (False), never half-used."""
        deriver = self._axis(axis)
        t0 = time.perf_counter()
        if self.inputs is not None:
            self.inputs.record("observe", axis, step, rows)
        try:
            rejection = deriver.observation_rejection(rows)
        except Exception as e:  # noqa: BLE001 - an observation no check can read is refused
            rejection = Rejection("axis", f"observe: the {axis} observation cannot be checked ({type(e).__name__})")
        if rejection is None and not (isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP):
            rejection = Rejection("step", f"observe: step must be an integer in [0, 2^62], got {shown(step, 40)}")
        if rejection is not None:
            self._reject(rejection)
            return False
        try:
            deriver.observe(step, rows)
        except Exception as e:  # noqa: BLE001 - contained per axis, like ingest
            self._deriver_failed(axis, "observe", e)
        self.last_step = max(self.last_step, step)
        self.ingest_s += time.perf_counter() - t0
        return True

    def _axis(self, axis: str) -> Deriver:
        deriver = self.derivers.get(axis) if isinstance(axis, str) else None
        if deriver is None:
            raise ReportError(f"axis {shown(axis, 40)} is not enabled in this run (enabled: {list(self.derivers)}); set its "
                              "PDMLConfig section")
        return deriver

    def report(self, reports: list[WorkerReport] | PackedReports) -> None:
        """Ingest a batch of reports (fire-and-forget from workers): a list of ``WorkerReport`` or the
        client's ``PackedReports`` (the same reports as plain tuples, cheaper to send).

        Each report is checked whole before anything of it is used; a malformed one is refused and
        counted by kind, and the rest of the batch is applied. Idle reports (0 samples) are logged.
        """
        t0 = time.perf_counter()
        if self.inputs is not None:
            self.inputs.record("report", list(reports.rows) if isinstance(reports, PackedReports) and
                               isinstance(reports.rows, (list, tuple)) else
                               PackedReports.pack(reports).rows if isinstance(reports, list) and
                               all(isinstance(r, WorkerReport) for r in reports) else reports)
        accepted, rows = [], []
        last_step, received = self.last_step, 0
        checks = self._deriver_checks
        items = reports if isinstance(reports, (list, tuple, PackedReports)) else [reports]
        if isinstance(items, PackedReports) and not isinstance(items.rows, (list, tuple)):
            self._reject(Rejection("type", f"packed reports must hold a list of rows, got {type(items.rows).__name__}"))
            return
        try:
            for r in items:
                rejection = self._rejection(r, checks)
                if rejection is not None:
                    self._reject(rejection)
                    continue
                assert isinstance(r, WorkerReport)
                step = int(r.step)
                if step > last_step:
                    last_step = step
                rows.append((r.worker_id, step, r.samples, r.compute_s, r.wait_s, r.step_s, r.overhead_s, r.loss))
                received += 1
                if r.samples != 0:  # not idle: a worker given no samples measured nothing
                    accepted.append(r)
        except Exception as e:  # noqa: BLE001 - a packed row that cannot even be described ends the batch there
            self._reject(Rejection("type", f"the rest of a report batch cannot be read ({type(e).__name__}: "
                                           f"{str(e)[:100]})"))
        # every report is checked by every deriver before any deriver takes it: what follows does not
        # refuse. A deriver that raises all the same (a bug) takes none of the batch and is counted.
        self.last_step = last_step
        self.reports_received += received
        self._log.extend(rows)
        if accepted:
            for name, deriver in self.derivers.items():
                try:
                    deriver.ingest(accepted)
                except Exception as e:  # noqa: BLE001 - contained per axis, whatever a deriver raises
                    self._deriver_failed(name, "ingest", e)
        self.ingest_s += time.perf_counter() - t0

    @property
    def _deriver_checks(self) -> list[Any]:
        """The derivers' own report checks (``report_rejection``), in registry order."""
        return [c for c in (getattr(d, "report_rejection", None) for d in self.derivers.values()) if c is not None]

    def _rejection(self, r: object, checks: list[Any] | None = None) -> Rejection | None:
        if not isinstance(r, WorkerReport):
            if isinstance(r, str):  # a packed row that does not make a report says why
                return Rejection("type", r)
            return Rejection("type", f"expected a WorkerReport, got {type(r).__name__}")
        try:
            rejection = r.rejection(self.num_workers, self.num_samples)
            if rejection is None and not r.idle:
                for check in self._deriver_checks if checks is None else checks:
                    rejection = check(r)
                    if rejection is not None:
                        break
        except Exception as e:  # noqa: BLE001 - a report no check can read (an int too long to print) is refused
            return Rejection("type", f"a report that cannot be checked ({type(e).__name__}: {str(e)[:100]})")
        return rejection

    def _reject(self, rejection: Rejection) -> None:
        self.reports_rejected += 1
        self.rejected_by_kind[rejection.field] = self.rejected_by_kind.get(rejection.field, 0) + 1
        self.rejections.append(rejection.message)
        # the first of each kind, then every 1000th: a worker sending garbage every step must not flood the log
        if self.rejected_by_kind[rejection.field] % 1000 == 1:
            log.warning("rejected report (%d of this kind so far): %.*s", self.rejected_by_kind[rejection.field],
                        _MESSAGE_CHARS, rejection.message)

    def _deriver_failed(self, name: str, phase: str, error: BaseException) -> None:
        """Count, keep and log (the first, then every 1000th per axis) a deriver's contained failure."""
        count = self.deriver_errors[name] = self.deriver_errors.get(name, 0) + 1
        reason = f"{name} {phase}: {type(error).__name__}: {error}"[:_MESSAGE_CHARS]
        self.deriver_error_reasons.append(reason)
        if count % _LOG_EVERY == 1:
            log.error("deriver failed (%d errors on the %r axis so far; it keeps its current decision): %s", count,
                      name, reason, exc_info=not isinstance(error, PDMLError))

    # -- outputs -----------------------------------------------------------------------------------
    def bundle(self, boundary: Boundary, since: Mapping[str, int],
               reports: list[WorkerReport] | PackedReports | None = None) -> StepBundle:
        """Decisions to adopt at ``boundary.first_step``: per deriver, a new one if it decides so, else
        its newest if newer than the version ``since[name]`` the workers run on. ``reports`` that came
        with the request (``report_via="boundary"``: the group's, gathered by rank 0) are ingested first,
        as ``report`` would, so the decision sees them.

        Derivers decide here, once per interval, on everything reported so far (deciding on every
        report batch published a version per worker flush, each on partly updated estimates). A
        malformed request is refused with ReportError; a deriver's failure never is (its axis keeps its
        decision and the failure is counted).
        """
        if reports is not None:
            self.report(reports)
        t0 = time.perf_counter()
        problem = _request_problem(boundary, since, self.num_workers)
        if problem is not None:
            raise ReportError(f"bundle: {problem}")
        out: dict[str, Decision] = {}
        for name, deriver in self.derivers.items():
            seen = since.get(name, -1)
            if seen > self.versions.get(name, -1):
                # this scheduler restarted and lost its state: continue the workers' numbering so its
                # next decision is newer than the one they run on (the current one is not re-sent)
                self.versions[name] = seen
                if name in self.current:
                    self.current[name] = dataclasses.replace(self.current[name], version=seen)  # type: ignore[type-var]
            try:
                new = deriver.decide(boundary, out)
                if new is not None:
                    self._check_decision(name, new)
            except Exception as e:  # noqa: BLE001 - this axis keeps its decision; the others still go out
                self.decide_errors += 1
                self._deriver_failed(name, f"decide at step {boundary.first_step}", e)
                new = None
            current = self.current.get(name)
            if new is not None:
                current = self._publish(name, new, boundary.first_step)
                log.info("%s", current)
            elif current is not None and current.version > seen and current.effective_step != boundary.first_step:
                # published for a step the workers passed without it (its bundle came late): re-issue it
                current = self._publish(name, current, boundary.first_step)
            if current is not None and current.version > seen:
                out[name] = current
        self.last_decision_s = time.perf_counter() - t0
        self.decision_s += self.last_decision_s
        self.decision_requests += 1
        if self.inputs is not None:
            self.inputs.record("bundle", boundary.first_step, boundary.num_steps, tuple(boundary.batch_sizes),
                               dict(since), {name: decision_data(d) for name, d in out.items()})
        return StepBundle(out)

    def _check_decision(self, name: str, decision: object) -> None:
        """PlanError unless ``decision`` is one axis ``name`` could publish in this run: of its axis's type
        and passing ``state_format.check_decision`` (the node axis: one integer size per worker within
        min/max summing to the global batch, weights the batch shares), a new one and a restored one alike."""
        current = self.current.get(name)
        if current is not None and type(decision) is not type(current):
            raise PlanError(f"the {name!r} axis publishes {type(current).__name__}s, got {type(decision).__name__}")
        check_decision(decision, self.config, self.num_workers)

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
        rows = self._log.rows()
        return {name: rows[:, i] for i, name in enumerate(_LOG_COLUMNS)}

    def stats(self) -> SchedulerStats:
        per_deriver = {}
        for name, d in self.derivers.items():
            try:
                per_deriver[name] = d.stats()
            except Exception as e:  # noqa: BLE001 - one axis's broken record must not hide the others
                self._deriver_failed(name, "stats", e)
        return SchedulerStats(versions=dict(self.versions), reports_received=self.reports_received,
                              reports_rejected=self.reports_rejected, last_step=self.last_step,
                              ingest_s=self.ingest_s, measurements=dict(self.measurements),
                              derivers={name: s for name, s in per_deriver.items() if s is not None},
                              rejected_by_kind=dict(self.rejected_by_kind), decide_errors=self.decide_errors,
                              deriver_errors=dict(self.deriver_errors),
                              deriver_error_reasons=tuple(self.deriver_error_reasons),
                              emulation=self.config.node_priority.emulation if self.config.node_priority else None,
                              decision_s=self.decision_s,
                              decision_requests=self.decision_requests, last_decision_s=self.last_decision_s,
                              worker_times=recent_worker_times(
                                  self._log.newest(_RECENT_ROWS_PER_WORKER * self.num_workers), self.num_workers))

    # -- checkpoint --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        kept = [name for name, d in self.derivers.items() if d.keep_history]
        saved_rows = _history_rows(self.num_workers, _SAVED_HISTORY_NUMBERS)
        return {"derivers": {name: d.state_dict() for name, d in self.derivers.items()},
                "versions": dict(self.versions),
                "current": {name: self.current[name] for name in kept if name in self.current},
                "history": {name: list(self.history[name])[-saved_rows:] for name in kept},
                "num_samples": self.num_samples,
                "counters": {"reports_received": self.reports_received, "reports_rejected": self.reports_rejected,
                             "last_step": self.last_step, "rejected_by_kind": dict(self.rejected_by_kind),
                             "rejections": list(self.rejections), "decide_errors": self.decide_errors,
                             "deriver_errors": dict(self.deriver_errors),
                             "deriver_error_reasons": list(self.deriver_error_reasons)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` whole, or raise StateError and change nothing: the derivers' states load
        into copies of the derivers, every restored decision (in force and in the history) must pass its
        axis's ``check_decision`` as a new one would, and only then is everything swapped in."""
        if not isinstance(state, dict) or not all(isinstance(state.get(k), dict)
                                                  for k in ("derivers", "versions", "current", "history")):
            raise StateError("saved scheduler state must be a dict with 'derivers', 'versions', 'current' and "
                             "'history' mappings, as Scheduler.state_dict() writes it")
        missing = sorted(set(state["derivers"]) ^ set(self.derivers))
        if missing:
            raise StateError(f"saved scheduler state has derivers {sorted(state['derivers'])}, this run enables "
                             f"{sorted(self.derivers)}; resume with the same PDMLConfig (sample_priority on or off)")
        versions = state["versions"]
        if not (set(versions) <= set(self.derivers)
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP for v in versions.values())):
            raise StateError(f"saved decision versions must be integers in [0, 2^62] per enabled axis, got "
                             f"{shown(versions, 200)}")
        counters = _checked_counters(state.get("counters", {}))
        num_samples = state.get("num_samples")
        if num_samples is not None and not (isinstance(num_samples, int) and not isinstance(num_samples, bool)
                                            and num_samples >= 1):
            raise StateError(f"saved num_samples must be an integer >= 1 (the data set size), got {shown(num_samples, 60)}")
        derivers = copy.deepcopy(self.derivers)  # one copy of them all: their bound peers are the copies too
        try:
            if num_samples is not None and num_samples != self.num_samples:
                for deriver in derivers.values():
                    deriver.on_dataset(num_samples)
            for name, deriver in derivers.items():
                deriver.load_state_dict(state["derivers"][name])
        except StateError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a malformed state makes a deriver raise, refused as one
            raise StateError(f"saved state of the derivers is malformed ({type(e).__name__}: {str(e)[:200]}); load a "
                             "state written by Scheduler.state_dict() of the same pdml-ray version") from None
        current = dict(state["current"])
        history = {}
        for name, decisions in state["history"].items():
            if name not in derivers or not isinstance(decisions, (list, tuple, deque)):
                raise StateError(f"saved decision history {shown(name, 40)} must be a list of decisions of an enabled axis")
            history[name] = deque(decisions, maxlen=self.history[name].maxlen)
        for name, decisions in [(n, [d]) for n, d in current.items()] + list(history.items()):
            if name not in derivers:
                raise StateError(f"saved decision for axis {shown(name, 40)}, which this run does not enable")
            for decision in decisions:
                try:
                    self._check_decision(name, decision)
                except Exception as e:  # noqa: BLE001 - a restored decision is checked as a new one is
                    raise StateError(f"saved {name} decision is not one this run could publish ({str(e)[:200]}); "
                                     "resume from a state of a run with the same config and workers") from None
        # everything loaded and checked: swap it in
        self.derivers = derivers
        if num_samples is not None:
            self.num_samples = num_samples
        self.versions = dict(versions)
        self.current.update(current)
        self.history.update(history)
        self.reports_received = counters.get("reports_received", self.reports_received)
        self.reports_rejected = counters.get("reports_rejected", self.reports_rejected)
        self.last_step = counters.get("last_step", self.last_step)
        self.decide_errors = counters.get("decide_errors", self.decide_errors)
        self.rejected_by_kind = dict(counters.get("rejected_by_kind", self.rejected_by_kind))
        self.rejections = deque(counters.get("rejections", self.rejections), maxlen=_REJECTION_REASONS)
        self.deriver_errors = dict(counters.get("deriver_errors", self.deriver_errors))
        self.deriver_error_reasons = deque(counters.get("deriver_error_reasons", self.deriver_error_reasons),
                                           maxlen=_ERROR_REASONS)


def _request_problem(boundary: object, since: object, num_workers: int) -> str | None:
    """Why a ``bundle`` request cannot be served (a confused or foreign client), or None."""
    def integer(x: object, low: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and low <= x <= MAX_STEP

    if not (isinstance(boundary, Boundary) and integer(boundary.first_step, 0) and integer(boundary.num_steps, 1)):
        return (f"the boundary must be a Boundary with integer first_step >= 0 and num_steps >= 1, got "
                f"{shown(boundary, 120)}")
    sizes = boundary.batch_sizes  # per worker on the Ray Train path; a runtime without node sizes sends ()
    if not (isinstance(sizes, (list, tuple)) and len(sizes) <= max(num_workers, 1) and all(integer(b, 0) for b in sizes)):
        return (f"the boundary's batch_sizes must be at most {max(num_workers, 1)} integers >= 0 (one per worker), "
                f"got {shown(sizes, 120)}")
    if not (isinstance(since, Mapping) and all(isinstance(k, str) and integer(v, -1) for k, v in since.items())):
        return ("since must map axis names to the decision versions the workers run on (integers >= -1), got "
                f"{shown(since, 120)}")
    return None


def _checked_counters(counters: Any) -> dict[str, Any]:
    """The saved counters (missing in states written before they were saved: then empty), checked."""
    def count(x: Any, low: int = 0) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= low

    ok = isinstance(counters, dict)
    if ok:
        for key in ("reports_received", "reports_rejected", "decide_errors"):
            ok = ok and (key not in counters or count(counters[key]))
        ok = ok and ("last_step" not in counters or count(counters["last_step"], -1))
        kinds = counters.get("rejected_by_kind", {})
        ok = ok and isinstance(kinds, dict) and all(isinstance(k, str) and count(n) for k, n in kinds.items())
        for key in ("rejections", "deriver_error_reasons"):
            reasons = counters.get(key, [])
            ok = ok and isinstance(reasons, (list, tuple)) and all(isinstance(r, str) for r in reasons)
        errors = counters.get("deriver_errors", {})
        ok = ok and isinstance(errors, dict) and all(isinstance(k, str) and count(n) for k, n in errors.items())
    if not ok:
        raise StateError(f"saved scheduler counters are malformed: {shown(counters, 200)}; counts must be integers >= 0 "
                         "(last_step >= -1), rejection reasons strings")
    return counters


def decision_data(decision: Decision) -> Any:
    """A published decision as plain data, to compare a replay against (``InputLog``)."""
    to_dict = getattr(decision, "to_dict", None)
    return to_dict() if to_dict is not None else repr(decision)
