"""The scheduler as a named Ray actor: ``Scheduler`` plus naming, restart options and metrics."""

from __future__ import annotations

import ray

from pdml_ray.config import PDMLConfig
from pdml_ray.metrics import PriorityGauges
from pdml_ray.scheduler import Scheduler
from pdml_ray.telemetry import WorkerReport


class MeteredScheduler(Scheduler):
    """Scheduler whose every state change is exported to the Ray dashboard's metrics."""

    def __init__(self, config: PDMLConfig, num_workers: int):
        super().__init__(config, num_workers)
        self.gauges = PriorityGauges(config.scheduler_name)
        self.registered: set[int] = set()

    def register(self, worker_id: int, accelerator_type: str):
        decision = super().register(worker_id, accelerator_type)
        self.registered.add(worker_id)
        self._export()
        return decision

    def report(self, reports: list[WorkerReport]) -> None:
        super().report(reports)
        self._export()

    def bundle(self, since_version: int, first_step: int, num_steps: int, batch_sizes: tuple[int, ...]):
        bundle = super().bundle(since_version, first_step, num_steps, batch_sizes)
        if bundle.decision is not None:
            self._export()
        return bundle

    def _export(self) -> None:
        # per-worker series are tagged by accelerator type: export once every worker has said its type
        # (or reports arrive, e.g. after a restart), so no series carries a placeholder type
        if len(self.registered) == self.num_workers or self.reports_received:
            self.gauges.export(self.stats())

    def ping(self) -> bool:
        return True


# num_cpus=0: the scheduler must never take a CPU slot from a training worker.
# max_restarts=-1: if it dies, Ray restarts it; training goes on with the last decision meanwhile.
SchedulerActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(MeteredScheduler)


def get_or_create_scheduler(config: PDMLConfig, num_workers: int):
    """The run's scheduler actor: the living one of that name and namespace, or a new one."""
    return SchedulerActor.options(name=config.scheduler_name, namespace=config.namespace,
                                  get_if_exists=True).remote(config, num_workers)


def find_scheduler(name: str = "pdml-scheduler", namespace: str = "pdml"):
    """Handle of a running scheduler actor, or None."""
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None
