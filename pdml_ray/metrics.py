"""Priorities exported with ``ray.util.metrics``, so users watch them in the Ray dashboard/Prometheus.

The series are whatever a typed stats record says (``gauges()``: the scheduler's ``SchedulerStats``,
each deriver's stats record adding its own; the pipeline and straggler runtimes' run records,
``pdml_ray.pipeline.stats`` and ``pdml_ray.stragglers.stats``, exported from the driver): a new
priority axis or runtime brings its series with its stats record and nothing here changes.

Names follow Prometheus' conventions: a name ending in ``_total`` is a count, exported as a
``ray.util.metrics.Counter`` (the stats hold cumulative counts; each export adds what they grew by);
every other name is a ``Gauge`` whose name carries its unit (``_seconds``, ``_samples``,
``_samples_per_second``, ``_ratio``). docs/observability.md lists them all.

Every series is tagged with ``run``: the scheduler's name plus a short id of the scheduler actor
(``pdml-myrun-1a2b3c4d``), so two runs that share a name (the same ``RunConfig.name`` twice) never
share a series, while a restarted scheduler (same actor) continues its run's. Per-worker series also
carry ``worker`` and ``accelerator_type``. Ray Train's own labels come too, so the filters of Ray's
Train dashboard select pdml-ray's series as well: ``ray_train_run_name`` (the Ray Train run's name,
``RunConfig.name``; the scheduler's name where there is no Ray Train run) on every series, and
``ray_train_worker_world_rank`` (the worker's world rank, what ``worker`` says) on per-worker ones,
with Ray 2.60's names (``ray.train.v2._internal.metrics``).

Ray prefixes custom metrics with ``ray_`` on the Prometheus endpoint: ``pdml_batch_size_samples`` is
scraped as ``ray_pdml_batch_size_samples`` (``prometheus_name``). Metrics are created in the process
that exports them: the scheduler actor's, or the driver running a pipeline or straggler runtime.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pdml_ray.priority.base import GaugeValue

log = logging.getLogger(__name__)

COUNTER_SUFFIX = "_total"
SIGNIFICANT_DIGITS = 4
"""Gauges are exported rounded to this many significant digits, so jitter below that precision does
not set a series again (each ``Gauge.set`` costs CPU and, in Ray 2.5x/2.60, memory)."""


def is_counter(name: str) -> bool:
    """Whether the series ``name`` is a Prometheus counter (its name ends in ``_total``)."""
    return name.endswith(COUNTER_SUFFIX)


def prometheus_name(name: str) -> str:
    """The name a series is scraped under from Ray's metrics endpoint: Ray's ``ray_`` prefix added
    (a counter keeps its single ``_total``)."""
    return f"ray_{name}"


def _rounded(value: float) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, SIGNIFICANT_DIGITS - 1 - int(math.floor(math.log10(abs(value)))))


def _short_id() -> str:
    """8 hex digits unique to this scheduler: the random part of its Ray actor id (the same after the
    actor restarts), else a random id (the scheduler running outside an actor)."""
    try:
        import ray

        actor_id = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    except Exception:  # no Ray worker in this process
        actor_id = None
    return actor_id[:8] if actor_id else uuid.uuid4().hex[:8]


def ray_report_interval_s() -> float:
    """How often Ray's metric emitters export to the node's metrics agent (``metrics_report_interval_ms``,
    10 s by default; Ray floors it at 1 s)."""
    try:
        import ray

        return max(1.0, ray._config.metrics_report_interval_ms() / 1000.0)
    except Exception:  # no Ray worker in this process, or the config is not reachable
        return 10.0


Key = tuple[str, tuple[tuple[str, str], ...]]  # (metric name, tags besides run): one series

RUN_NAME_TAG = "ray_train_run_name"
WORLD_RANK_TAG = "ray_train_worker_world_rank"
"""Ray Train's run and rank label names (Ray 2.60: ``RUN_NAME_TAG_KEY``, ``WORKER_WORLD_RANK_TAG_KEY``)."""


class GaugeSource(Protocol):
    """A typed stats record that says its figures as gauge values (``SchedulerStats``, a run record)."""

    def gauges(self) -> Sequence[GaugeValue]: ...


class PriorityGauges:
    """One ``ray.util.metrics`` Gauge or Counter per metric name, created when the name is first
    exported.

    Cost and liveness. Ray 2.60 sends a gauge to the node's metrics agent once per report interval
    I (``metrics_report_interval_ms``, 10 s by default), the value it was last set to, and only if it
    was set in that interval; the agent drops a series not refreshed within 2 I. Setting a gauge more
    often than Ray sends it is wasted (each ``Gauge.set`` costs CPU and, in Ray 2.60, memory), and a
    gauge not set again vanishes from Prometheus ~20 s later. So a gauge series is set

    - when its value (to 4 significant digits) changed, at most once every ``min_set_s`` (I/2): a
      change within that is held and set when it is due;
    - and again, unchanged, once it was last set ``refresh_s`` (3/4 I) ago,

    from ``export`` and from a daemon thread started by the first export (so the series stay while no
    call reaches the scheduler, e.g. while training hangs). At 256 workers that is at most ~3,000
    series per I/2 while everything changes, ~3,000 per 3/4 I in steady state. A counter is
    incremented by what its cumulative count grew, on every export (Ray keeps counters cumulative:
    no refresh needed).
    """

    def __init__(self, run_name: str, run_id: str | None = None, refresh_s: float | None = None,
                 min_set_s: float | None = None, source: Callable[[], GaugeSource] | None = None,
                 train_run_name: str | None = None):
        self.run_name = run_name
        self.train_run_name = train_run_name or run_name
        """The ``ray_train_run_name`` label of every series: the Ray Train run's name."""
        self.run = f"{run_name}-{run_id or _short_id()}"
        """The ``run`` tag of every series: unique per run."""
        interval = ray_report_interval_s() if refresh_s is None or min_set_s is None else 0.0
        self.refresh_s = refresh_s if refresh_s is not None else 0.75 * interval
        """An unchanged gauge series is set again once it was set this long ago (3/4 of Ray's report
        interval; with the thread waking every third of ``min_set_s``, every series is set within each
        interval, and Ray keeps a series for two)."""
        self.min_set_s = min_set_s if min_set_s is not None else min(self.refresh_s, 0.5 * interval)
        """A changed gauge series is set at most this often (half of Ray's report interval)."""
        self.source = source
        """Where the refresh thread gets fresh stats (the scheduler's ``stats``): with it, figures that
        changed after the last ``export`` (the run's last reports) are exported within ``refresh_s``
        even if no further call reaches the scheduler; without it the thread only sets gauges' held
        and unchanged values."""
        self._metrics: dict[str, Any] = {}
        self._last: dict[Key, float] = {}  # each series' newest value (a gauge's may be held, not set yet)
        self._set_at: dict[Key, float] = {}  # when each gauge series was last set
        self._held: set[Key] = set()  # gauge series whose newest value is not set yet
        self._exported_at = -math.inf
        self._lock = threading.Lock()
        self._refresher: threading.Thread | None = None
        self._stopped = threading.Event()

    def export(self, stats: GaugeSource) -> int:
        """Export what the stats records say: counters by what they grew, gauges as described above;
        returns how many series were set or incremented. A count that went down (a scheduler restored
        from an older checkpoint) only moves the counter's baseline."""
        from ray.util.metrics import Counter, Gauge

        touched = 0
        now = time.monotonic()
        with self._lock:
            self._exported_at = now
            for g in stats.gauges():
                key = (g.name, g.tags)
                counter = is_counter(g.name)
                value = float(g.value) if counter else _rounded(float(g.value))
                if value != value:  # nan: nothing to say
                    continue
                last = self._last.get(key)
                metric: Any = self._metrics.get(g.name)
                if metric is None:
                    tag_keys = tuple(self._tags(g.tags))
                    metric = self._metrics[g.name] = (
                        Counter(g.name[:-len(COUNTER_SUFFIX)], g.description, tag_keys) if counter
                        else Gauge(g.name, g.description, tag_keys))
                if counter:
                    self._last[key] = value
                    if last is None or value > last:
                        grown = value - (last or 0.0)
                        if grown > 0:
                            metric.inc(grown, self._tags(g.tags))
                            touched += 1
                    continue
                if value != last:
                    self._last[key] = value
                    self._held.add(key)
                age = now - self._set_at.get(key, -math.inf)
                if (key in self._held and age >= self.min_set_s) or age >= self.refresh_s:
                    touched += self._set(key, now)
        if self._refresher is None and self.refresh_s > 0 and not self._stopped.is_set():
            self._refresher = threading.Thread(target=self._refresh_loop, name="pdml-metrics-refresh", daemon=True)
            self._refresher.start()
            _open_with_thread().add(self)
        return touched

    def _set(self, key: Key, now: float) -> int:
        name, tags = key
        self._metrics[name].set(self._last[key], self._tags(tags))
        self._set_at[key] = now
        self._held.discard(key)
        return 1

    def _tags(self, tags: tuple[tuple[str, str], ...]) -> dict[str, str]:
        """A series' labels: ``run``, Ray Train's run name, its own tags, and a worker's world rank."""
        own = dict(tags)
        rank = {WORLD_RANK_TAG: own["worker"]} if "worker" in own else {}
        return {"run": self.run, RUN_NAME_TAG: self.train_run_name, **own, **rank}

    def refresh(self) -> int:
        """Set every gauge series that is due: a held change older than ``min_set_s`` since the last
        set, or an unchanged value set ``refresh_s`` ago; returns how many were set."""
        now = time.monotonic()
        touched = 0
        with self._lock:
            for key, at in list(self._set_at.items()):
                if now - at >= self.refresh_s or (key in self._held and now - at >= self.min_set_s):
                    touched += self._set(key, now)
        return touched

    def _refresh_loop(self) -> None:
        while not self._stopped.wait(max(0.05, min(self.min_set_s, self.refresh_s) / 3)):
            try:
                if self.source is not None and time.monotonic() - self._exported_at >= self.refresh_s:
                    self.export(self.source())
                else:
                    self.refresh()
            except Exception:  # never let the thread die on a metrics hiccup; the next export retries
                log.warning("refreshing pdml-ray's gauges failed", exc_info=True)

    def close(self) -> None:
        """Stop the refresh thread and wait for it (the series then age out of Ray's metrics agent).

        Waiting matters: a daemon thread still inside Ray's native ``Gauge.set`` when the process exits
        (or when ``ray.shutdown`` frees the core worker) can crash the process. Gauges never closed are
        closed at interpreter exit, before Ray's own exit handler shuts Ray down."""
        self._stopped.set()
        if self._refresher is not None:  # never the caller: the refresh thread does not close
            self._refresher.join(timeout=CLOSE_TIMEOUT_S)


CLOSE_TIMEOUT_S = 5.0
"""How long ``PriorityGauges.close`` waits for the refresh thread's current pass."""

_OPEN: weakref.WeakSet[PriorityGauges] | None = None


def _open_with_thread() -> weakref.WeakSet[PriorityGauges]:
    """The gauges whose refresh thread runs; the first call registers closing them at exit (registered
    after ``ray`` was imported, so it runs before Ray's ``atexit`` shutdown: handlers run last-in first)."""
    global _OPEN
    if _OPEN is None:
        _OPEN = weakref.WeakSet()
        atexit.register(_close_all)
    return _OPEN


def _close_all() -> None:
    for gauges in list(_OPEN or ()):
        gauges.close()


def export_or_warn(gauges: PriorityGauges | None, stats: GaugeSource) -> None:
    """Export from a training loop (the runtimes' drivers): a metrics failure is logged, never raised,
    so watching a run can never end it."""
    if gauges is None:
        return
    try:
        gauges.export(stats)
    except Exception:  # noqa: BLE001 - Ray's metrics agent gone, a bad tag: the run goes on
        log.warning("exporting pdml-ray's run metrics failed", exc_info=True)
