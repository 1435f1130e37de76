"""How workers and runtimes reach the run's scheduler actor: ``pdml_ray.client.SchedulerTransport`` over Ray."""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from pdml_ray.actors.scheduler import find_scheduler
from pdml_ray.errors import SchedulerUnavailableError


class RaySchedulerTransport:
    """``pdml_ray.client.SchedulerTransport`` over the named scheduler actor: ObjectRefs as pending calls.

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
            error = SchedulerUnavailableError(f"scheduler {self.name!r}: {type(e).__name__}: {e}")
            # the actor died (Ray restarts it: max_restarts=-1) or is briefly unreachable, as opposed to
            # an error raised inside it or a timeout: a blocking call may be sent again (client.call)
            error.restarting = isinstance(e, RayActorError)  # type: ignore[attr-defined]
            raise error from e
