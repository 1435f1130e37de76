"""How workers and runtimes reach the run's scheduler actor: ``pdml_ray.client.SchedulerTransport`` over Ray."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from pdml_ray.actors.scheduler import create_scheduler, end_scheduler, find_scheduler
from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import PDMLConfig
from pdml_ray.errors import SchedulerUnavailableError
from pdml_ray.scheduler import Scheduler


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


class RunScheduler:
    """A runtime's scheduler for one run and the ``SchedulerClient`` that reaches it: the run's named
    actor (the default: ``pdml-ray status`` and the metrics show it), or an in-process ``Scheduler``
    where planning latency matters, on the same client path. ``close`` ends the actor."""

    def __init__(self, config: PDMLConfig, num_workers: int, *, in_process: bool, name_prefix: str) -> None:
        self.actor: Any = None
        self.scheduler: Scheduler | None = None
        transport: Any
        if in_process:
            self.scheduler = Scheduler(config, num_workers)
            transport = LocalSchedulerTransport(self.scheduler)
        else:
            name = config.scheduler_name or f"{name_prefix}-{uuid.uuid4().hex[:8]}"
            config = dataclasses.replace(config, scheduler_name=name)
            self.actor = create_scheduler(config, num_workers)
            transport = RaySchedulerTransport(name, config.namespace)
        self.config = config
        """The run's config, named after its actor (unchanged in-process)."""
        self.client = SchedulerClient(transport)

    @property
    def name(self) -> str | None:
        """The scheduler actor's name (``pdml-ray status --name``), None in-process."""
        return None if self.actor is None else self.config.scheduler_name

    def close(self) -> None:
        """End the run's scheduler actor (its snapshot deleted first); in-process there is nothing to end."""
        if self.actor is not None:
            end_scheduler(self.actor)
            self.actor = None
