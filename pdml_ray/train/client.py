"""Worker-side access to the scheduler actor that never blocks a training step.

Reports go fire-and-forget. Rank 0 keeps one bundle request in flight and polls it with a zero
timeout at step boundaries. If the actor is dead or restarting, calls fail quietly, the caller keeps
its last decision, and the handle is looked up again by name at a later boundary.
"""

from __future__ import annotations

import logging
import time

import ray
from ray.exceptions import RayError

from pdml_ray.scheduler import StepBundle
from pdml_ray.telemetry import WorkerReport

log = logging.getLogger(__name__)


class SchedulerClient:
    def __init__(self, name: str, namespace: str, lookup_timeout_s: float = 30.0):
        self.name = name
        self.namespace = namespace
        self._handle = None
        self._pending = None  # ObjectRef of the bundle request in flight (rank 0 only)
        self.failures = 0
        self._lookup(deadline_s=lookup_timeout_s)

    def _lookup(self, deadline_s: float = 0.0) -> bool:
        end = time.monotonic() + deadline_s
        while True:
            try:
                self._handle = ray.get_actor(self.name, namespace=self.namespace)
                return True
            except ValueError:
                if time.monotonic() >= end:
                    self._handle = None
                    return False
                time.sleep(0.2)

    @property
    def available(self) -> bool:
        return self._handle is not None or self._lookup()

    def _send(self, method: str, *args):
        """Fire-and-forget call: its ObjectRef, or None while the scheduler is unavailable."""
        if not self.available:
            return None
        try:
            return getattr(self._handle, method).remote(*args)
        except RayError:
            self._handle = None
            return None

    def _startup_call(self, method: str, *args, timeout_s: float = 60.0) -> None:
        """Start-up only (blocking); without a scheduler it is skipped and training keeps uniform shares."""
        ref = self._send(method, *args)
        if ref is not None:
            ray.get(ref, timeout=timeout_s)

    def register(self, worker_id: int, accelerator_type: str) -> None:
        """Tell the scheduler this worker's accelerator type (start-up, blocking)."""
        self._startup_call("register", worker_id, accelerator_type)

    def set_dataset_size(self, num_samples: int) -> None:
        self._startup_call("set_dataset_size", num_samples)

    def call(self, method: str, *args, timeout_s: float = 120.0):
        """A blocking call, for checkpoints and start-up only (never inside a training step)."""
        if not self.available:
            raise RuntimeError(f"scheduler {self.name!r} is not available")
        return ray.get(getattr(self._handle, method).remote(*args), timeout=timeout_s)

    def report(self, reports: list[WorkerReport]) -> None:
        """Fire-and-forget; a dead scheduler loses these reports, never the training step."""
        if reports:
            self._send("report", reports)

    def record_measurement(self, name: str, value: float) -> None:
        self._send("record_measurement", name, value)

    def request(self, since_version: int, first_step: int, num_steps: int, batch_sizes: tuple[int, ...]) -> None:
        """Put one bundle request in flight (at most one is pending)."""
        if self._pending is None:
            self._pending = self._send("bundle", since_version, first_step, num_steps, batch_sizes)

    def poll(self, block_s: float = 0.0) -> StepBundle | None:
        """The pending bundle if it is ready within ``block_s`` seconds, else None (keep going)."""
        if self._pending is None:
            return None
        ready, _ = ray.wait([self._pending], timeout=block_s)
        if not ready:
            return None
        ref, self._pending = self._pending, None
        try:
            return ray.get(ref)
        except RayError as e:  # actor died or restarted: keep the last decision, look it up again later
            self.failures += 1
            self._handle = None
            log.warning("scheduler unavailable (%s); training continues on the last decision", type(e).__name__)
            return None
