"""The scheduler as a named Ray actor: ``Scheduler`` plus naming, restart options, snapshots and metrics.
Workers reach it through ``pdml_ray.actors.scheduler_transport.RaySchedulerTransport``; its snapshots live
in ``pdml_ray.actors.snapshot_store.SnapshotStore``.

Restarts. The actor has ``max_restarts=-1``: if its process dies, Ray runs its constructor again with
the same arguments. So that a restarted scheduler does not start empty, a background thread saves a
snapshot of its state every ``SNAPSHOT_INTERVAL_S`` (when anything changed): ``Scheduler.state_dict()``
(estimates, decisions, the sample table, counters: reports received and rejected, last step) in the
same data format as a checkpoint's (``pdml_ray.state_format``: JSON plus arrays, never a pickle),
plus the restart count. The restarted constructor (``_reconstructed``) reads it,
checks every decision in it as a new one is checked, and loads it; a snapshot that does not read back
whole (damaged, foreign, a decision this run could not make) is refused with an error in the log, and
the actor starts empty. What was reported after the snapshot is
lost (workers count what they could not deliver in ``SchedulerClient.reports_dropped``); the decision
versions continue from the workers' (``Scheduler.bundle``).

Where the snapshot lives: Ray's GCS internal KV (``ray.experimental.internal_kv``), under the run's
name. It outlives the actor's process and its node: on a cluster Ray may restart the actor on another
node, where a file under the first node's session directory would not be; the object store is no
place either (an object dies with its owner, the actor). One KV value is bounded by Ray's gRPC
message size (512 MiB) and is held in the GCS's memory, so the snapshot is written in chunks of
``SNAPSHOT_CHUNK_BYTES`` and committed by a manifest written last (a restart never reads half a
snapshot), and one larger than ``SNAPSHOT_MAX_BYTES`` (a sample table of tens of millions of samples)
is not written, with a warning: such a scheduler restarts empty, as without snapshots. A scheduler
started afresh (not restarted) under a name deletes the snapshot an earlier run of that name left.
The cost is bounded: the state is copied under the lock (the node state of 256 workers: well under a
millisecond), encoded and written outside it, and the interval stretches so that snapshots take at most
``SNAPSHOT_MAX_FRACTION`` of the actor's time.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from pdml_ray.client import PackedReports
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, StepBundle, WorkerReport
from pdml_ray.errors import ConfigError, PDMLError, SchedulerUnavailableError, StateError
from pdml_ray.metrics import PriorityGauges, ray_report_interval_s
from pdml_ray.scheduler import Scheduler, SchedulerStats
from pdml_ray.actors.snapshot_store import SNAPSHOT_MAX_BYTES, SnapshotStore, kv_ready
from pdml_ray.state_format import check_scheduler_decisions, dumps, loads

log = logging.getLogger(__name__)


def _export_interval_s() -> float:
    """``PDML_METRICS_EXPORT_INTERVAL_S`` if set, else half of Ray's metrics collection interval
    (``metrics_report_interval_ms``, 10 s by default), at least 1 s."""
    value = os.environ.get("PDML_METRICS_EXPORT_INTERVAL_S")
    return max(float(value), 0.0) if value else max(ray_report_interval_s() / 2.0, 1.0)


EXPORT_INTERVAL_S = _export_interval_s()
"""Metrics are exported at most this often. Ray reads a gauge's value once per metrics collection
(``metrics_report_interval_ms``, 10 s by default) and exports only the last value set per series:
setting gauges more often (this was 1 s, and forced on every new decision) was work and memory for
nothing. Half the collection interval, so a value is at most ~1.5 intervals old on the dashboard;
``PDML_METRICS_EXPORT_INTERVAL_S`` (in the actor's environment) overrides it."""


SWITCH_INTERVAL_S = 0.001
"""The actor process's GIL switch interval (Python's default is 5 ms): how long a decision waiting for
the GIL may wait while the report, export or snapshot thread runs Python code
(``PDML_SCHEDULER_SWITCH_INTERVAL_S`` overrides it)."""

REPORT_CHUNK = 128
"""Reports ingested per hold of the state lock (about a millisecond's work)."""

SNAPSHOT_INTERVAL_S = 5.0
"""The scheduler's state is saved at most this often (and only when something changed)."""
SNAPSHOT_MAX_FRACTION = 0.05
"""Snapshots take at most this share of the actor's time (the interval stretches for a large state)."""
PROFILED_DECISIONS = 10_000
"""Decisions (and garbage collections) whose timings ``decision_profile`` keeps, the newest."""


def _in_actor() -> bool:
    """Whether this code runs inside a Ray actor (not a driver, a task or a test using the class directly)."""
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def _reconstructed() -> bool:
    """Whether this actor process is a restart (Ray re-ran the constructor after the actor died).

    The GCS actor table's restart count, looked up as Ray's ``was_current_actor_reconstructed`` does:
    in Ray 2.60 that property reads the deprecated ``RuntimeContext.actor_id`` and warns on every call
    (``RayDeprecationWarning: Use get_actor_id() instead``), so the lookup goes by ``get_actor_id()``."""
    from ray._private.state import actors

    if not _in_actor():  # the class used directly
        return False
    try:
        info = actors(actor_id=ray.get_runtime_context().get_actor_id())
    except Exception:  # noqa: BLE001 - the GCS did not answer: a fresh start is the safe reading
        return False
    return bool(info) and info.get("NumRestarts", 0) != 0


class MeteredScheduler(Scheduler):
    """The ``Scheduler`` as an actor: its stats exported to the Ray dashboard's metrics (at most every
    ``EXPORT_INTERVAL_S``), reports and decisions served on separate threads (Ray concurrency groups)
    so a decision never waits behind a queue of reports, one lock around the state, and a snapshot of
    the state a restarted actor starts from (module docstring)."""

    def __init__(self, config: PDMLConfig, num_workers: int, snapshots: bool = True, run_name: str | None = None):
        super().__init__(config, num_workers)
        sys.setswitchinterval(float(os.environ.get("PDML_SCHEDULER_SWITCH_INTERVAL_S", SWITCH_INTERVAL_S)))
        self._lock = threading.RLock()
        self.gauges = PriorityGauges(config.scheduler_name or "pdml-scheduler", source=self.stats,
                                     train_run_name=run_name)
        self.registered: set[int] = set()
        self._cpu0 = time.process_time()
        self._cpu_marks: deque[tuple[int, float]] = deque(maxlen=2000)  # (last step, process CPU s) per report
        self._exported_at = -float("inf")
        self._decision_waiting = False
        self._decision_parts: deque[tuple[float, float, float]] = deque(maxlen=PROFILED_DECISIONS)
        self._gc_pauses: deque[tuple[int, float]] = deque(maxlen=PROFILED_DECISIONS)
        self._gc_started = 0.0
        self.restarts = 0
        self.snapshots_saved = 0
        self.snapshot_s = 0.0  # seconds spent taking and writing snapshots
        self._generation = 0
        self._snapshot_mark: Any = None  # what the state looked like at the last snapshot
        self._snapshot_too_big = False
        self._store: SnapshotStore | None = None
        self._stop = threading.Event()
        self._snapshot_lock = threading.Lock()
        if snapshots and config.scheduler_name is not None and kv_ready():
            self._store = SnapshotStore(config.scheduler_name, config.namespace)
            if _reconstructed():
                self._restore()
            else:  # a fresh run under this name: an earlier run's snapshot must not leak into it
                self._store.clear()
            threading.Thread(target=self._snapshot_loop, name="pdml-scheduler-snapshot", daemon=True).start()
        if _in_actor():  # the actor's own process (tests build the class in theirs)
            gc.callbacks.append(self._gc_timed)
            if os.environ.get("PDML_SCHEDULER_GC_FREEZE", "1") != "0":
                # what the process holds by now (Ray's, numpy's and pdml-ray's modules, the state) lives
                # as long as the actor: frozen, the garbage collector's full collections no longer scan it
                gc.freeze()

    # -- snapshots ---------------------------------------------------------------------------------
    def _restore(self) -> None:
        """Load the last snapshot into this restarted actor (a bad one is logged; it starts empty)."""
        assert self._store is not None
        try:
            found = self._store.load()
            if found is None:
                log.warning("scheduler %s restarted without a snapshot: it starts empty", self.config.scheduler_name)
                self.restarts = 1
                return
            blob, generation = found
            source = f"the scheduler snapshot {self._store.prefix} (generation {generation}) in Ray's GCS KV"
            saved = loads(blob, source, "the restarted scheduler starts empty")
            if not (isinstance(saved, dict) and set(saved) == {"state", "registered", "restarts", "time"}
                    and isinstance(saved["registered"], list)
                    and all(type(w) is int and 0 <= w < self.num_workers for w in saved["registered"])  # noqa: E721
                    and type(saved["restarts"]) is int and saved["restarts"] >= 0  # noqa: E721
                    and isinstance(saved["time"], float)):
                raise StateError(f"{source} does not hold the state, registered workers, restart count and time "
                                 "a snapshot holds")
            try:
                check_scheduler_decisions(saved["state"], self.config, self.num_workers)
                self.load_state_dict(saved["state"])
            except PDMLError as e:  # a decision or deriver state this run refuses: the snapshot is bad
                raise StateError(f"{source} holds a state this scheduler refuses: {e}") from None
            self._generation = generation
            self.registered = set(saved["registered"])
            self.restarts = saved["restarts"] + 1
            self._snapshot_mark = self._mark()
            log.warning("scheduler %s restarted (%d times) from its snapshot of %.1f s ago: %d reports, step %d, "
                        "versions %s", self.config.scheduler_name, self.restarts, time.time() - saved["time"],
                        self.reports_received, self.last_step, self.versions)
        except StateError as e:
            Scheduler.__init__(self, self.config, self.num_workers)  # nothing half-loaded stays
            self.restarts = 1
            log.error("scheduler %s restarted but could not load its snapshot (%s): it starts empty",
                      self.config.scheduler_name, e)

    def _mark(self) -> tuple:
        return (self.reports_received, self.reports_rejected, self.last_step, tuple(self.versions.items()),
                self.num_samples, len(self.registered), len(self.measurements), self.decide_errors)

    def snapshot(self) -> float:
        """Save the state now if it changed since the last snapshot; returns the seconds it took (0: nothing
        to save). The background thread calls it; a test or an operator may too."""
        with self._snapshot_lock:  # one snapshot at a time (the thread's, or one asked for): generations in order
            return self._snapshot()

    def _snapshot(self) -> float:
        t0 = time.perf_counter()
        with self._lock:
            store, mark = self._store, self._mark()
            if store is None or mark == self._snapshot_mark:
                return 0.0
            payload = {"state": Scheduler.state_dict(self), "registered": sorted(self.registered),
                       "restarts": self.restarts, "time": time.time()}
        blob = dumps(payload)  # outside the lock: the state is a copy
        if len(blob) > SNAPSHOT_MAX_BYTES:
            if not self._snapshot_too_big:
                log.warning("scheduler %s: its snapshot is %.0f MiB, more than SNAPSHOT_MAX_BYTES (%.0f MiB); it is "
                            "not saved, and a restart of this actor starts empty", self.config.scheduler_name,
                            len(blob) / 2 ** 20, SNAPSHOT_MAX_BYTES / 2 ** 20)
                self._snapshot_too_big = True
        else:
            self._generation += 1
            store.save(blob, self._generation)
            self.snapshots_saved += 1
        self._snapshot_mark = mark
        dt = time.perf_counter() - t0
        self.snapshot_s += dt
        return dt

    def _snapshot_loop(self) -> None:
        wait = SNAPSHOT_INTERVAL_S
        while not self._stop.wait(wait):
            try:
                cost = self.snapshot()
            except Exception as e:  # noqa: BLE001 - a failed snapshot must not end the thread: try again later
                log.warning("scheduler snapshot failed (%s: %s); trying again in %.0f s", type(e).__name__, e, wait)
                cost = 0.0
            wait = max(SNAPSHOT_INTERVAL_S, cost / SNAPSHOT_MAX_FRACTION)

    def close(self) -> None:
        """The run is over: stop snapshotting and delete the snapshot (call before ``ray.kill``; a
        snapshot left behind is deleted by the next scheduler started under the same name)."""
        self._stop.set()
        self.gauges.close()
        if self._store is not None:
            with self._lock:
                self._store.clear()
                self._store = None

    def snapshot_info(self) -> dict[str, Any]:
        """Snapshots saved, their generation, seconds spent on them, and the restart count."""
        return {"saved": self.snapshots_saved, "generation": self._generation, "seconds": self.snapshot_s,
                "restarts": self.restarts, "interval_s": SNAPSHOT_INTERVAL_S}

    def resize(self, num_workers: int) -> None:
        with self._lock:  # an elastic restart: no report or bundle sees a half-resized scheduler
            super().resize(num_workers)
            self.registered = {w for w in self.registered if w < num_workers}

    def register(self, worker_id: int, accelerator_type: str) -> None:
        with self._lock:
            super().register(worker_id, accelerator_type)
            self.registered.add(worker_id)
        self._export(force=len(self.registered) == self.num_workers)

    @ray.method(concurrency_group="reports")
    def report(self, reports: list[WorkerReport] | PackedReports) -> None:  # type: ignore[override]  # ray.method's stub
        self._ingest(reports)

    def _ingest(self, reports: list[WorkerReport] | PackedReports) -> None:
        # in chunks, releasing the lock between them: a decision waits for one chunk at most, however
        # many reports a client coalesced into this call (each report is whole in one chunk)
        rows: Any = reports.rows if isinstance(reports, PackedReports) else reports
        if not isinstance(rows, (list, tuple)):
            rows = [rows]
        for start in range(0, len(rows), REPORT_CHUNK):
            while self._decision_waiting:  # a decision is waiting for the lock: let it go first
                time.sleep(0.0002)
            chunk = rows[start:start + REPORT_CHUNK]
            with self._lock:
                super().report(PackedReports(chunk) if isinstance(reports, PackedReports) else chunk)
        with self._lock:
            self._cpu_marks.append((self.last_step, time.process_time() - self._cpu0))
        self._export()

    @ray.method(concurrency_group="decisions")
    def bundle(self, boundary: Boundary, since: Mapping[str, int],  # type: ignore[override]
               reports: list[WorkerReport] | PackedReports | None = None) -> StepBundle:
        if reports is not None:  # the group's reports came with the request: ingested as a report call's
            self._ingest(reports)
        t0, cpu0 = time.perf_counter(), time.thread_time()
        self._decision_waiting = True  # the report thread yields the lock between chunks (Python's lock is not fair)
        with self._lock:
            self._decision_waiting = False
            t1 = time.perf_counter()
            bundle = super().bundle(boundary, since)
        self._decision_parts.append((t1 - t0, time.perf_counter() - t1, time.thread_time() - cpu0))
        # a new decision is exported by the report thread's next export (or the gauges' refresh thread)
        return bundle

    def stats(self) -> SchedulerStats:
        with self._lock:
            return dataclasses.replace(super().stats(), process_cpu_s=time.process_time() - self._cpu0,
                                       process_cpu_marks=tuple(self._cpu_marks), restarts=self.restarts)

    def record_measurement(self, name: str, value: float) -> None:
        with self._lock:
            super().record_measurement(name, value)

    def set_shape(self, axis: str, shape: Mapping[str, Any]) -> None:
        with self._lock:
            super().set_shape(axis, shape)

    @ray.method(concurrency_group="decisions")
    def observe(self, axis: str, step: int, rows: Any) -> bool:  # type: ignore[override]  # ray.method's stub
        # on the decisions thread: a runtime's observation and its next plan request run in the order sent
        with self._lock:
            taken = super().observe(axis, step, rows)
        self._export()
        return taken

    def set_dataset_size(self, num_samples: int) -> None:
        with self._lock:
            super().set_dataset_size(num_samples)

    def decision_history(self, name: str = "node") -> list[dict[str, Any]]:
        with self._lock:
            return super().decision_history(name)

    def telemetry(self) -> dict[str, Any]:
        with self._lock:
            return super().telemetry()

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            super().load_state_dict(state)

    def _export(self, force: bool = False) -> None:
        """Set the gauges from a snapshot of the stats (taken under the lock; the gauges are set
        outside it, so a decision never waits for them)."""
        # per-worker series are tagged by accelerator type: export once every worker has said its type
        # (or reports arrive, e.g. after a restart), so no series carries a placeholder type
        now = time.monotonic()
        if not force and now - self._exported_at < EXPORT_INTERVAL_S:
            return
        if len(self.registered) == self.num_workers or self.reports_received or self.last_step >= 0:
            self._exported_at = now
            self.gauges.export(self.stats())

    def __repr__(self) -> str:
        """The actor's name in the Ray dashboard's actor list: the run (its ``run`` metrics tag), the
        decision versions and how far training got. Ray reads it once, when the actor is created (the
        list shows the versions at creation, or at a restart, the restored ones); ``stats`` and the
        metrics are what change."""
        versions = ", ".join(f"{name} v{v}" for name, v in self.versions.items())
        return (f"PDMLScheduler(run={self.gauges.run}, workers={self.num_workers}, {versions}, "
                f"last_step={self.last_step}, reports={self.reports_received})")

    @ray.method(concurrency_group="decisions")
    def ping(self) -> bool:
        return True

    def _gc_timed(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks``: the length of each collection (every thread waits for it, a decision too)."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_pauses.append((info["generation"], time.perf_counter() - self._gc_started))

    def decision_profile(self) -> dict[str, Any]:
        """Where decisions' time went since the last call (``bench scheduler`` reads it): per ``bundle``
        call, the wait for the state lock, the time inside ``Scheduler.bundle`` and the decision thread's
        CPU time over both (seconds; their difference from a client's round trip is Ray's and the
        machine's); each garbage collection in the process as (generation, seconds); and the objects the
        collector leaves out (``gc.freeze``)."""
        parts, pauses = list(self._decision_parts), list(self._gc_pauses)
        self._decision_parts.clear()
        self._gc_pauses.clear()
        return {"lock_wait_s": [p[0] for p in parts], "bundle_s": [p[1] for p in parts],
                "thread_cpu_s": [p[2] for p in parts], "gc_pauses": pauses,
                "gc_frozen_objects": gc.get_freeze_count()}

    def memory_rss_mb(self) -> float:
        """Resident memory of the actor's process (MB; Linux /proc, else the peak from getrusage)."""
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# num_cpus=0: the scheduler must never take a CPU slot from a training worker.
# max_restarts=-1: if it dies, Ray restarts it; training goes on with the last decision meanwhile.
# Reports and decisions (bundles, pings) each have a thread; everything else shares the default one.
SchedulerActor = ray.remote(  # type: ignore[call-overload]  # the stub lacks concurrency_groups
    num_cpus=0, max_restarts=-1, max_task_retries=0, concurrency_groups={"reports": 1, "decisions": 1})(MeteredScheduler)


def create_scheduler(config: PDMLConfig, num_workers: int, run_name: str | None = None) -> Any:
    """Start the run's scheduler actor, named ``config.scheduler_name``; refuse a name already in use
    (another run's scheduler: sharing it would mix two runs' estimates, and either run's end would
    kill it). ``run_name``: the Ray Train run's name, a label of every metric series."""
    if config.scheduler_name is None:
        raise ConfigError("create_scheduler needs config.scheduler_name (PDMLTrainer.fit() sets it)")
    if find_scheduler(config.scheduler_name, config.namespace) is not None:
        raise ConfigError(f"a pdml-ray scheduler named {config.scheduler_name!r} is already running in namespace "
                          f"{config.namespace!r} (another run?); give this run another RunConfig(name=...) or "
                          "PDMLConfig(scheduler_name=...), or leave both unset for a unique name")
    return SchedulerActor.options(name=config.scheduler_name, namespace=config.namespace,
                                  runtime_env=_scheduler_runtime_env()).remote(config, num_workers, run_name=run_name)


SCHEDULER_ENV_VARS = {"MALLOC_ARENA_MAX": "2", "RAY_enable_open_telemetry": "0"}
"""Environment of the scheduler actor's process (a value the job's runtime env or the driver's
environment sets wins), both for flat memory under a steady load (256 simulated workers at 10 steps/s):

- ``MALLOC_ARENA_MAX=2``: glibc gives each thread that allocates its own malloc arena (up to 8 per
  core); the actor's threads (Ray's, the report, decision and snapshot threads) leave memory spread
  over many arenas that is not returned. With gauge export off the actor grew ~40 MB over 150 s and
  was still growing; with 2 arenas it levelled off within ~60 s (+12 MB).
- ``RAY_enable_open_telemetry=0``: Ray 2.60 records ``ray.util.metrics`` gauges through OpenTelemetry
  by default, and a process that sets gauges grows by ~4 KB per series every metrics collection (10
  s), however often the series are set (measured: 1,280 series set every 0.1, 1 or 5 s all grew ~0.5
  MB/s, without end in 150 s); through Ray's OpenCensus path the same process stays flat, and the
  gauges reach the metrics agent's Prometheus endpoint all the same (as ``ray_<name>``, with the run
  and worker tags; the OpenTelemetry-only labels ``WorkerId`` and ``otel_scope_*`` are absent)."""


def _scheduler_runtime_env() -> dict[str, Any]:
    """The job's env vars (kept: an actor's env_vars must not drop them) plus ``SCHEDULER_ENV_VARS``."""
    try:
        job_env = dict(ray.get_runtime_context().runtime_env.get("env_vars") or {})
    except Exception:  # noqa: BLE001 - no runtime env to read: only ours
        job_env = {}
    env = {k: v for k, v in SCHEDULER_ENV_VARS.items() if k not in os.environ}
    return {"env_vars": {**env, **job_env}}


def end_scheduler(handle: Any) -> None:
    """End a run's scheduler actor: its restart snapshot is deleted first (``close``), then the actor is
    killed; a scheduler already gone is no error."""
    try:
        ray.get(handle.close.remote(), timeout=10)
    except RayError:
        pass
    ray.kill(handle)


def find_scheduler(name: str, namespace: str = "pdml") -> Any:
    """Handle of a running scheduler actor, or None."""
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def list_schedulers(namespace: str = "pdml") -> list[str]:
    """Names of the scheduler actors alive in ``namespace`` (one per running pdml-ray run)."""
    from ray.util import list_named_actors

    return sorted(a["name"] for a in list_named_actors(all_namespaces=True) if a.get("namespace") == namespace)
