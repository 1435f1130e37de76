"""The scheduler as a named Ray actor (``Scheduler`` plus naming, restart options and metrics), and
the ``RayTransport`` workers reach it through (``pdml_ray.client.SchedulerClient``'s transport)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import RayError

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, StepBundle, WorkerReport
from pdml_ray.errors import ConfigError, SchedulerUnavailableError
from pdml_ray.metrics import PriorityGauges
from pdml_ray.scheduler import Scheduler, SchedulerStats


EXPORT_INTERVAL_S = 1.0
"""Metrics are exported at most this often (setting ~25 gauges per worker costs milliseconds: doing it
on every call capped the actor at a few hundred calls per second)."""


REPORT_CHUNK = 128
"""Reports ingested per hold of the state lock (about a millisecond's work)."""


class MeteredScheduler(Scheduler):
    """The ``Scheduler`` as an actor: its stats exported to the Ray dashboard's metrics (at most every
    ``EXPORT_INTERVAL_S``), reports and decisions served on separate threads (Ray concurrency groups)
    so a decision never waits behind a queue of reports, and one lock around the state."""

    def __init__(self, config: PDMLConfig, num_workers: int):
        super().__init__(config, num_workers)
        self._lock = threading.RLock()
        self.gauges = PriorityGauges(config.scheduler_name or "pdml-scheduler")
        self.registered: set[int] = set()
        self._cpu0 = time.process_time()
        self._cpu_marks: deque[tuple[int, float]] = deque(maxlen=2000)  # (last step, process CPU s) per report
        self._exported_at = -float("inf")
        self._decision_waiting = False
        self._export_due = False  # a new decision since the last export

    def register(self, worker_id: int, accelerator_type: str) -> None:
        with self._lock:
            super().register(worker_id, accelerator_type)
            self.registered.add(worker_id)
        self._export(force=len(self.registered) == self.num_workers)

    @ray.method(concurrency_group="reports")
    def report(self, reports: list[WorkerReport]) -> None:  # type: ignore[override]  # ray.method's stub
        # in chunks, releasing the lock between them: a decision waits for one chunk at most, however
        # many reports a client coalesced into this call
        for start in range(0, len(reports), REPORT_CHUNK):
            while self._decision_waiting:  # a decision is waiting for the lock: let it go first
                time.sleep(0.0002)
            with self._lock:
                super().report(reports[start:start + REPORT_CHUNK])
        with self._lock:
            self._cpu_marks.append((self.last_step, time.process_time() - self._cpu0))
        self._export(force=self._export_due)

    @ray.method(concurrency_group="decisions")
    def bundle(self, boundary: Boundary, since: Mapping[str, int]) -> StepBundle:  # type: ignore[override]
        self._decision_waiting = True  # the report thread yields the lock between chunks (Python's lock is not fair)
        with self._lock:
            self._decision_waiting = False
            bundle = super().bundle(boundary, since)
        # a new decision is exported by the report thread right after: this thread only decides
        self._export_due = self._export_due or bool(bundle)
        return bundle

    def stats(self) -> SchedulerStats:
        with self._lock:
            return dataclasses.replace(super().stats(), process_cpu_s=time.process_time() - self._cpu0,
                                       process_cpu_marks=tuple(self._cpu_marks))

    def record_measurement(self, name: str, value: float) -> None:
        with self._lock:
            super().record_measurement(name, value)

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
        if len(self.registered) == self.num_workers or self.reports_received:
            self._exported_at, self._export_due = now, False
            self.gauges.export(self.stats())

    def __repr__(self) -> str:
        """What the Ray dashboard's actor list shows for this actor: the run, the newest decision
        versions and how far training got."""
        versions = ", ".join(f"{name} v{v}" for name, v in self.versions.items())
        return (f"PDMLScheduler(run={self.config.scheduler_name}, workers={self.num_workers}, {versions}, "
                f"last_step={self.last_step}, reports={self.reports_received})")

    @ray.method(concurrency_group="decisions")
    def ping(self) -> bool:
        return True

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


def create_scheduler(config: PDMLConfig, num_workers: int) -> Any:
    """Start the run's scheduler actor, named ``config.scheduler_name``; refuse a name already in use
    (another run's scheduler: sharing it would mix two runs' estimates, and either run's end would
    kill it)."""
    if config.scheduler_name is None:
        raise ConfigError("create_scheduler needs config.scheduler_name (PDMLTrainer.fit() sets it)")
    if find_scheduler(config.scheduler_name, config.namespace) is not None:
        raise ConfigError(f"a pdml-ray scheduler named {config.scheduler_name!r} is already running in namespace "
                          f"{config.namespace!r} (another run?); give this run another RunConfig(name=...) or "
                          "PDMLConfig(scheduler_name=...), or leave both unset for a unique name")
    return SchedulerActor.options(name=config.scheduler_name, namespace=config.namespace).remote(config, num_workers)


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


class RayTransport:
    """``pdml_ray.client.Transport`` over the named scheduler actor: ObjectRefs as pending calls.

    Every Ray failure (actor dead or restarting, a timeout, an error inside the scheduler) becomes
    ``SchedulerUnavailableError``: the client then keeps training on its last decision.
    """

    def __init__(self, name: str, namespace: str) -> None:
        self.name, self.namespace = name, namespace
        self._handle: Any = None

    def connect(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while True:
            self._handle = find_scheduler(self.name, self.namespace)
            if self._handle is not None or time.monotonic() >= end:
                return self._handle is not None
            time.sleep(0.2)

    def submit(self, method: str, *args: Any) -> ray.ObjectRef:
        if self._handle is None:
            raise SchedulerUnavailableError(f"scheduler {self.name!r} in namespace {self.namespace!r} not found")
        try:
            return getattr(self._handle, method).remote(*args)
        except RayError as e:
            self._handle = None
            raise SchedulerUnavailableError(f"scheduler {self.name!r}: {type(e).__name__}") from e

    def ready(self, pending: ray.ObjectRef, timeout_s: float) -> bool:
        ready, _ = ray.wait([pending], timeout=timeout_s)
        return bool(ready)

    def result(self, pending: ray.ObjectRef, timeout_s: float | None = None) -> Any:
        try:
            return ray.get(pending, timeout=timeout_s)
        except RayError as e:  # GetTimeoutError is one too
            self._handle = None
            raise SchedulerUnavailableError(f"scheduler {self.name!r}: {type(e).__name__}: {e}") from e
