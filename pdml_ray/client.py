"""Worker-side access to the scheduler that never blocks a training step (no Ray here).

The logic: reports go fire-and-forget, with at most ``MAX_REPORT_CALLS_IN_FLIGHT`` calls pending: while
that many are, new reports wait in a bounded local buffer and travel with the next call (coalesced),
and beyond ``MAX_BUFFERED_REPORTS`` the oldest are dropped and counted, so a slow scheduler can never
pile up work or memory; rank 0 keeps at most one bundle request in flight and polls it with a zero
timeout at step boundaries; if the scheduler is dead or restarting, calls fail
quietly, the caller keeps its last decisions, and the scheduler is looked up again at a later
boundary. A blocking call (start-up, checkpoints) waits through a scheduler restart.

Reports travel packed (``PackedReports``: one plain tuple per report, no dataclass to pickle): about ten
times cheaper to serialise on the worker and three times cheaper to read back at the scheduler, which
reads them into ``WorkerReport``s and validates each as it would a ``WorkerReport`` sent as one.

How calls travel is a ``SchedulerTransport``: ``pdml_ray.actors.scheduler.RaySchedulerTransport`` (a named
Ray actor) in training, ``LocalSchedulerTransport`` (a ``Scheduler`` in this process) for a single process
and for tests that drive ``PDMLContext`` without Ray.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from pdml_ray.decisions import Boundary, MicroBatchPlan, StepBundle, WorkerReport
from pdml_ray.errors import ConfigError, ReportError, SchedulerUnavailableError
from pdml_ray.pipeline.prediction import replan_due

log = logging.getLogger(__name__)

MAX_REPORT_CALLS_IN_FLIGHT = 1
"""Report calls a worker may have pending at the scheduler before it holds new reports back: under
overload a worker's reports then travel in fewer, larger calls, and the scheduler's per-call cost (most
of its work: Ray's own cost per call is ~40x that of ingesting one report) stops growing with the load.
One rather than two: at saturation on two cores ``bench scheduler --quick`` sustained a median 32,900
reports/s with one against 19,200 with two (4 runs each, interleaved), as calls carried twice as many
reports; at a training pace (a call every ``decision_interval`` steps, answered in milliseconds) the
limit is never reached."""
MAX_BUFFERED_REPORTS = 10_000
"""Reports a worker holds back at most (the oldest beyond are dropped and counted in ``reports_dropped``)."""


RESTART_WAIT_S = 60.0
"""How long a blocking call (checkpoint, start-up) waits for a restarting scheduler at most."""

_FIELDS = ("worker_id", "step", "samples", "compute_s", "wait_s", "step_s", "overhead_s", "loss", "grad_norm",
           "accelerator_type", "sample_indices", "sample_losses", "forward_only")


class PackedReports:
    """A batch of ``WorkerReport``s on the wire: one plain tuple of the fields per report.

    Pickling a list of frozen slotted dataclasses runs Python code per report on both sides (~4 us to
    write, ~5 us to read); tuples of ints, floats and strings are written and read by pickle's C code
    (~0.4 us each way). The scheduler turns the rows back into ``WorkerReport``s (``reports()``), a row
    that does not make one into a refusal, and checks each report as if it had been sent whole.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: Sequence[tuple]) -> None:
        self.rows = rows

    @classmethod
    def pack(cls, reports: Sequence[WorkerReport]) -> PackedReports:
        return cls([(r.worker_id, r.step, r.samples, r.compute_s, r.wait_s, r.step_s, r.overhead_s, r.loss,
                     r.grad_norm, r.accelerator_type, r.sample_indices, r.sample_losses, r.forward_only)
                    for r in reports])

    def __reduce__(self) -> tuple[Any, tuple]:
        return (PackedReports, (self.rows,))

    def __len__(self) -> int:
        return len(self.rows)

    def reports(self) -> Iterator[WorkerReport | str]:
        """Each row as a ``WorkerReport``, or as a string saying why it does not make one. A row without
        the last field, ``forward_only`` (a replay log recorded before it), reads as forward_only = 0."""
        for row in self.rows:
            if type(row) is tuple and len(_FIELDS) - 1 <= len(row) <= len(_FIELDS):  # noqa: E721
                yield WorkerReport(*row)
            else:
                yield (f"a packed report must be a tuple of the {len(_FIELDS) - 1} WorkerReport fields, or "
                       f"{len(_FIELDS)} with forward_only, got {row!r:.80}")

    def __iter__(self) -> Iterator[WorkerReport | str]:
        return self.reports()


class SchedulerTransport(Protocol):
    """How calls reach the scheduler. Every method raises ``SchedulerUnavailableError`` (only) when
    the scheduler cannot be reached; the client turns that into "keep the last decision"."""

    def connect(self, timeout_s: float) -> bool:
        """Find the scheduler within ``timeout_s`` seconds (0: one try); False if it is not there."""
        ...

    def submit(self, method: str, *args: Any) -> Any:
        """Start ``scheduler.method(*args)`` without waiting; returns a pending handle."""
        ...

    def ready(self, pending: Any, timeout_s: float) -> bool:
        """Whether ``pending`` has finished within ``timeout_s`` seconds."""
        ...

    def result(self, pending: Any, timeout_s: float | None = None) -> Any:
        """The call's return value (raises the scheduler's error, or SchedulerUnavailableError)."""
        ...

    # Optional: ``flush(timeout_s)``, wait until the reports submitted so far have reached the scheduler
    # (a transport that gathers them on the way, a node relay's, has one; a direct one needs none).


class LocalSchedulerTransport:
    """Calls a ``Scheduler`` in this process synchronously: every call is ready at once."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def connect(self, timeout_s: float) -> bool:
        return True

    def submit(self, method: str, *args: Any) -> tuple[Any]:
        return (getattr(self.scheduler, method)(*args),)  # a 1-tuple: a call that returned None is still pending

    def ready(self, pending: tuple[Any], timeout_s: float) -> bool:
        return True

    def result(self, pending: tuple[Any], timeout_s: float | None = None) -> Any:
        return pending[0]


class SchedulerClient:
    def __init__(self, transport: SchedulerTransport, connect_timeout_s: float = 30.0) -> None:
        self.transport = transport
        self._connected = transport.connect(connect_timeout_s)
        self._pending: Any = None  # the bundle request in flight (rank 0 only)
        self._pending_reports = 0  # reports that ride in it (``request``'s ``reports``)
        self._report_calls: list[tuple[Any, int]] = []  # report calls in flight, with how many reports each carries
        self._held: list[tuple] = []  # packed reports held back while MAX_REPORT_CALLS_IN_FLIGHT are pending
        self.failures = 0
        self.reports_dropped = 0  # held back beyond MAX_BUFFERED_REPORTS, sent to an unreachable scheduler,
        # or in a call that failed (the scheduler died with it in flight: it restarts from its last snapshot)
        self.reports_coalesced = 0  # reports that waited for a later call (the scheduler was behind)
        self.report_calls_failed = 0  # report calls that failed (their reports are counted in reports_dropped)

    @property
    def available(self) -> bool:
        if not self._connected:
            self._connected = self.transport.connect(0.0)
        return self._connected

    def _send(self, method: str, *args: Any) -> Any:
        """Fire-and-forget call: its pending handle, or None while the scheduler is unavailable."""
        if not self.available:
            return None
        try:
            return self.transport.submit(method, *args)
        except SchedulerUnavailableError:
            self._connected = False
            return None

    def call(self, method: str, *args: Any, timeout_s: float = 120.0) -> Any:
        """A blocking call, for checkpoints and start-up only (never inside a training step).

        A call that fails while the scheduler restarts (it died with the call in flight) is sent again
        once it can be found, for up to ``RESTART_WAIT_S``; a scheduler that is gone for good (not
        found) or an error inside it raises ``SchedulerUnavailableError`` at once."""
        end = time.monotonic() + min(timeout_s, RESTART_WAIT_S)
        while True:
            pending = self._send(method, *args)
            if pending is None:
                raise SchedulerUnavailableError(f"the pdml-ray scheduler is not reachable for {method!r}; check "
                                                "that the training run's scheduler actor is alive (`pdml-ray status`)")
            try:
                return self.transport.result(pending, timeout_s)
            except SchedulerUnavailableError as e:
                self._connected = False
                if not _restarting(e) or time.monotonic() >= end:
                    raise
                log.warning("scheduler restarting (%s); %s is sent again", e, method)
                time.sleep(0.5)

    def _startup_call(self, method: str, *args: Any) -> Any:
        """Start-up only (blocking): what the call returned; without a scheduler it is skipped (None) and
        training keeps uniform shares."""
        try:
            return self.call(method, *args, timeout_s=60.0)
        except SchedulerUnavailableError as e:
            log.warning("%s skipped: %s", method, e)
            return None

    def register(self, worker_id: int, accelerator_type: str) -> None:
        """Tell the scheduler this worker's accelerator type (start-up, blocking)."""
        self._startup_call("register", worker_id, accelerator_type)

    def set_dataset_size(self, num_samples: int) -> None:
        self._startup_call("set_dataset_size", num_samples)

    def set_irreducible_losses(self, step: int, losses: Any) -> None:
        """rho-loss: every sample's irreducible loss to the sample axis (start-up, blocking; an observation,
        so a replay log keeps it). ReportError where the scheduler refuses them (``pdml-ray status`` shows
        why); without a scheduler they are skipped, as every start-up call is."""
        if self._startup_call("observe", "sample", step, [("irreducible", losses)]) is False:
            raise ReportError("the scheduler refused the irreducible losses; `pdml-ray status` shows why")

    def set_shape(self, axis: str, shape: Mapping[str, Any]) -> None:
        """Tell axis ``axis`` the shape it plans for (start-up, blocking), e.g. the node axis a model's
        batch floor."""
        self._startup_call("set_shape", axis, dict(shape))

    def report(self, reports: list[WorkerReport], flush: bool = False) -> None:
        """Fire-and-forget, bounded: a dead scheduler loses these reports (counted), never the training
        step. ``flush`` (the end of training, a checkpoint) waits up to 30 s for every report call,
        this one's included, so nothing is left behind when the worker ends, then asks the transport to
        deliver what it gathers (a node relay's round)."""
        self.report_rows(PackedReports.pack(reports).rows, flush)
        if not flush:
            return
        # the report calls must be in before a relay's flush, too: a threaded actor may run a caller's calls
        # out of order, and a flush that overtook the last report would leave it behind
        self.drain(30.0)
        deliver = getattr(self.transport, "flush", None)  # optional: a transport straight to the scheduler has none
        if deliver is not None:
            try:
                deliver(30.0)
            except SchedulerUnavailableError as e:
                log.warning("the final reports may not have reached the scheduler: %s", e)

    def report_rows(self, rows: Sequence[tuple], flush: bool = False) -> None:
        """``report`` for reports already packed (``PackedReports.rows``: a node relay forwards them
        as they came); an empty ``rows`` sends what is held back once a call slot is free."""
        self._held.extend(rows)
        if not self._held:
            return
        # one caller's calls to the actor finish in order: check from the oldest, stop at the first pending
        while self._report_calls and self._done(self._report_calls[0][0], 30.0 if flush else 0.0):
            self._finished(*self._report_calls.pop(0))
        if len(self._report_calls) >= MAX_REPORT_CALLS_IN_FLIGHT:
            self.reports_coalesced += len(rows)
            overflow = len(self._held) - MAX_BUFFERED_REPORTS
            if overflow > 0:
                del self._held[:overflow]
                self.reports_dropped += overflow
                log.warning("the pdml-ray scheduler is behind: %d reports dropped so far", self.reports_dropped)
            return
        held, self._held = self._held, []
        pending = self._send("report", PackedReports(held))
        if pending is None:
            self.reports_dropped += len(held)
        else:
            self._report_calls.append((pending, len(held)))

    @property
    def reports_held(self) -> int:
        """Reports held back for a later call (a call slot was not free)."""
        return len(self._held)

    def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for every report call in flight (a node relay's final round)."""
        end = time.monotonic() + timeout_s
        while self._report_calls and self._done(self._report_calls[0][0], max(end - time.monotonic(), 0.0)):
            self._finished(*self._report_calls.pop(0))

    def _done(self, pending: Any, timeout_s: float) -> bool:
        try:
            return self.transport.ready(pending, timeout_s)
        except SchedulerUnavailableError:
            return True

    def _finished(self, pending: Any, count: int) -> None:
        """A report call is done: if it failed (the scheduler died or restarted with it in flight), its
        reports are lost (some of them may have been ingested before the state the scheduler restarts
        from was saved): counted in ``reports_dropped``."""
        try:
            self.transport.result(pending, 0.0)
        except SchedulerUnavailableError as e:
            self.report_calls_failed += 1
            self.reports_dropped += count
            self._connected = False  # look the scheduler up again for the next call
            log.warning("a report call failed (%s): %d reports lost, %d so far", e, count, self.reports_dropped)

    def record_measurement(self, name: str, value: float) -> None:
        self._send("record_measurement", name, value)

    def observe(self, axis: str, step: int, rows: Sequence[tuple]) -> None:
        """Fire-and-forget: one step's telemetry for ``axis`` beyond worker reports (the pipeline's action
        latencies). Lost, and counted in ``reports_dropped``, while the scheduler is unreachable."""
        if self._send("observe", axis, step, rows) is None:
            self.reports_dropped += len(rows)

    @property
    def request_pending(self) -> bool:
        """A bundle request is in flight (its answer not yet taken by ``poll``)."""
        return self._pending is not None

    def request(self, boundary: Boundary, since: Mapping[str, int], reports: Sequence[tuple] = ()) -> bool:
        """Put one bundle request in flight (at most one is pending); False if it did not go out (one
        was pending, or the scheduler is unreachable). ``reports``: packed rows that travel in the same
        call (``report_via="boundary"``: the group's, gathered at the boundary); the scheduler ingests
        them before it decides. Where the request does not go out they go as a report call (held back
        or dropped and counted as any), and a failed request loses them (counted)."""
        if self._pending is None:
            args = (PackedReports(list(reports)),) if reports else ()
            self._pending = self._send("bundle", boundary, dict(since), *args)
            if self._pending is not None:
                self._pending_reports = len(reports)
                return True
        if reports:
            self.report_rows(reports)
        return False

    def poll_plan(self, block_s: float = 0.0) -> MicroBatchPlan | None:
        """The pending bundle's ``pipeline`` plan, validated, if the bundle is ready within ``block_s``
        seconds and holds one (the pipeline runtimes' fetch-ahead), else None."""
        bundle = self.poll(block_s)
        decision = bundle.get("pipeline") if bundle is not None else None
        if not isinstance(decision, MicroBatchPlan):
            return None
        decision.validate()
        return decision

    def poll(self, block_s: float = 0.0) -> StepBundle | None:
        """The pending bundle if it is ready within ``block_s`` seconds, else None (keep going)."""
        if self._pending is None:
            return None
        try:
            if not self.transport.ready(self._pending, block_s):
                return None
            pending, self._pending = self._pending, None
            return self.transport.result(pending)
        except SchedulerUnavailableError as e:  # died or restarted: keep the last decision, look it up later
            self._pending = None
            self.failures += 1
            if self._pending_reports:  # the reports that rode in it are lost with it
                self.report_calls_failed += 1
                self.reports_dropped += self._pending_reports
            self._connected = False
            log.warning("scheduler unavailable (%s); training continues on the last decision", e)
            return None


PLAN_TIMEOUT_S = 60.0
"""Longest a pipeline runtime waits for a step's plan before it runs the newest one again."""


class PlansAhead:
    """The ``pipeline`` axis's plans through ``client``, each asked for one step ahead: taking step t's
    (``take``) requests step t + 1's, which the scheduler derives while step t runs, so a plan rests on
    latencies through the step before last. ``observe(step, rows)`` sends a step's latency rows to the
    scheduler; where they ran further than ``replan_threshold`` from the plan's prediction
    (``pdml_ray.pipeline.prediction``; 0: never), the next step's plan is asked for again after them and
    that step waits for it (``replans``). ``before_request(step)`` runs just before each request (the
    step's micro-batch sizes go first). Both pipeline runtimes fetch through it: the Ray-actor runtime's
    ``ScheduledPlans`` and rank 0 of a Ray Train pipeline run (``ScheduledStagePlans``)."""

    def __init__(self, client: SchedulerClient, replan_threshold: float = 0.0,
                 before_request: Callable[[int], None] | None = None) -> None:
        self.client, self.replan_threshold, self.before_request = client, replan_threshold, before_request
        self.decision: MicroBatchPlan | None = None
        """The newest decision the scheduler sent."""
        self.fallbacks = 0
        """Steps whose plan did not come in time: the newest one runs again."""
        self.replans = 0
        """Steps whose plan was asked for again after the step before ran far from its prediction."""
        self._requested: int | None = None

    def take(self, step: int) -> MicroBatchPlan | None:
        """Step ``step``'s decision, or None where it did not come within ``PLAN_TIMEOUT_S`` (``decision``
        keeps the newest; a step without one is counted in ``fallbacks`` if there is one); then asks
        for step ``step + 1``'s."""
        if self._requested != step:  # the first step, a jump or a re-plan: nothing useful in flight
            self.client.poll(PLAN_TIMEOUT_S)
            self._request(step)
        decision = self.client.poll_plan(PLAN_TIMEOUT_S)
        if decision is not None:
            self.decision = decision
        elif self.decision is not None:
            self.fallbacks += 1
        self._request(step + 1)
        return decision

    def observe(self, step: int, rows: Sequence[tuple]) -> None:
        """Step ``step``'s latency rows (``(stage, replica, kind, microbatch, seconds)``) to the scheduler
        (fire-and-forget); where they ran far from the plan's prediction, the next step's plan is asked
        for again."""
        self.client.observe("pipeline", step, rows)
        d = self.decision
        if d is not None and replan_due(d.plan, d.record, rows, self.replan_threshold):
            self.replans += 1
            self._requested = None  # take(step + 1) asks again, after these latencies

    def _request(self, step: int) -> None:
        if self.before_request is not None:  # before the request: the scheduler takes one caller's calls in order
            self.before_request(step)
        since = {"pipeline": self.decision.version} if self.decision is not None else {}
        self.client.request(Boundary(step, 1, ()), since)
        self._requested = step


class ReportGather:
    """A node's report round: its ``members`` workers' report calls gathered into one scheduler call.

    Each worker's flush (every ``decision_interval`` steps, at the same step on every worker) adds its
    packed rows (``add``); when all ``members`` have added theirs, the round goes to the scheduler as
    one call through ``client`` (a ``SchedulerClient``: its bound on calls in flight, coalescing and
    drop counting apply to the node's calls as they did to a worker's); a round some member is late
    for goes when ``tick`` finds it ``wait_s`` old, so a slow or finished worker delays the others' reports
    by ``wait_s`` at most. Thread-safe (the relay actor's calls and its timer thread). ``wait_for_work``
    lets a timer sleep while no round is open and nothing is held back, rather than tick all along."""

    def __init__(self, client: SchedulerClient, members: int, wait_s: float) -> None:
        if members < 1 or not wait_s > 0:
            raise ConfigError(f"a report round needs members >= 1 and wait_s > 0, got {members} and {wait_s}")
        self.client, self.members, self.wait_s = client, members, wait_s
        self._lock = threading.Lock()
        self._rows: list[tuple] = []
        self._calls = 0  # members' calls in the open round
        self._opened = 0.0  # when the open round's first call came (time.monotonic)
        self.rounds = 0  # rounds sent
        self.rounds_late = 0  # of them, sent by ``tick`` before every member had added
        self._work = threading.Event()  # set: a round is open or reports are held back (``tick`` has work)

    def add(self, rows: Sequence[tuple]) -> None:
        with self._lock:
            if self._calls == 0:
                self._opened = time.monotonic()
            self._rows.extend(rows)
            self._calls += 1
            if self._calls >= self.members:
                self._send(flush=False)
            self._work.set()

    def wait_for_work(self, timeout_s: float | None = None) -> bool:
        """Block until ``tick`` may have something to do (a round is open, or reports are held back),
        at most ``timeout_s``; returns whether it has. The relay's timer waits here between flushes: at a
        training pace (a flush every few hundred ms) a timer ticking every 10 ms all along woke ~50 times
        a flush for nothing, about as much CPU as the relay's Ray threads cost idle."""
        return self._work.wait(timeout_s)

    def tick(self) -> None:
        """Send a round that is ``wait_s`` old, and what the client holds back once a call slot is free."""
        with self._lock:
            if self._calls and time.monotonic() - self._opened >= self.wait_s:
                self.rounds_late += 1
                self._send(flush=False)
            elif self.client.reports_held:
                self.client.report_rows([])
            if not self._calls and not self.client.reports_held:
                self._work.clear()  # under the lock: an add() after this sets it again

    def flush(self) -> None:
        """Send the open round now and wait (up to 30 s) for the node's calls in flight."""
        with self._lock:
            self._send(flush=True)
            self.client.drain(30.0)

    def _send(self, flush: bool) -> None:
        rows, self._rows, calls, self._calls = self._rows, [], self._calls, 0
        self.rounds += calls > 0
        self.client.report_rows(rows, flush=flush)


def _restarting(error: SchedulerUnavailableError) -> bool:
    """Whether the scheduler failed a call because it died and may be restarting (Ray's actor errors),
    rather than raising inside, timing out or being gone (then retrying would not help)."""
    return bool(getattr(error, "restarting", False))
