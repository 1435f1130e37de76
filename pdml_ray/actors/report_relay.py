"""Per-node reporting: a node-local relay actor gathers its node's workers' report calls into one call
to the run's scheduler (``pdml_ray.client.ReportGather``), so the scheduler gets one call per node per
flush instead of one per worker (8 on an 8-GPU node); its per-call cost, most of its work, falls with it.

Why a relay actor, not a node-local process group: a gather over a process group is a collective, so
every worker of the node would wait in it for the slowest one's step, every flush; a call to a relay on
the same node is the fire-and-forget call a worker made to the scheduler before (the same client, the
same cost on the step), and the node's gather runs in the relay, off the workers' steps. What the gather
costs the step is therefore what a worker's flush cost before: ``pdml-ray bench scheduler --quick``
(256 simulated workers, 8 per node, on 2 cores loaded by other work) measured a worker's flush, packing
plus one Ray call, at 790 us (every 5 steps: ~160 us a step), and the relay's side of it, the gather and a
share of one call per node, at 101 us per worker flush. What it saves the scheduler: its CPU per report
fell from 130 to 44 us at 10 steps/s per worker and from 28 to 14 us saturated, and saturated throughput
rose from 22,900 to 37,400 reports/s (one run each; docs/observability.md). Hence relays above
``BOUNDARY_GATHER_MAX_WORKERS`` with ``PDMLConfig.report_via="auto"``, the default. Below it the
data-parallel loop's reports ride in the collectives its decision boundary already holds, where every
rank waits for the others anyway (``pdml_ray.train.boundary_reports``): no actor and one call per
boundary. A relay is an actor with its own idle cost, which on a small cluster is more than it saves.

The relay is named after the run's scheduler and its node, created by the node's first worker (its
owner: it ends with the worker group) and pinned to that node; ``num_cpus=0``, as the scheduler.
A node with one worker has no relay: its worker's call is already the node's one call.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pdml_ray.actors.scheduler_transport import RaySchedulerTransport
from pdml_ray.client import PackedReports, ReportGather, SchedulerClient
from pdml_ray.errors import SchedulerUnavailableError

RELAY_WAIT_S = 0.05
"""A round some worker of the node is late for goes to the scheduler this many seconds after its first
call (the node's other reports wait that long at most; at 10 steps/s a flush comes every 0.5 s)."""
TICK_S = 0.01
"""How often the relay's timer looks for a late round (seconds)."""


class NodeReportRelay:
    """One node's ``ReportGather`` as an actor: ``report`` takes a worker's packed reports (returns at
    once), a timer thread sends late rounds, ``flush`` sends the open round and waits for it."""

    def __init__(self, name: str, namespace: str, members: int, wait_s: float = RELAY_WAIT_S) -> None:
        self.gather = ReportGather(SchedulerClient(RaySchedulerTransport(name, namespace)), members, wait_s)
        self.reports_received = 0
        self._cpu0 = time.process_time()
        threading.Thread(target=self._tick_loop, name="pdml-relay-timer", daemon=True).start()

    def report(self, reports: PackedReports) -> None:
        rows = reports.rows if isinstance(reports, PackedReports) else [reports]  # a bad row: the scheduler refuses it
        self.reports_received += len(rows)
        self.gather.add(rows)

    def flush(self) -> None:
        self.gather.flush()

    def stats(self) -> dict[str, Any]:
        """Rounds sent (and how many late), reports received, the node client's counters and this
        process's CPU seconds since it started."""
        client = self.gather.client
        return {"members": self.gather.members, "rounds": self.gather.rounds, "rounds_late": self.gather.rounds_late,
                "reports_received": self.reports_received, "reports_dropped": client.reports_dropped,
                "reports_coalesced": client.reports_coalesced, "cpu_s": time.process_time() - self._cpu0}

    def _tick_loop(self) -> None:
        while True:
            self.gather.wait_for_work()  # asleep between flushes: no round open, nothing held back
            time.sleep(TICK_S)
            self.gather.tick()


# max_concurrency: a threaded actor (the timer thread and calls share the gather under its lock); the
# node's workers' calls return at once, so a few threads serve them
RelayActor = ray.remote(  # type: ignore[call-overload]  # the stub lacks max_concurrency
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=4)(NodeReportRelay)


def relay_name(scheduler_name: str, node_id: str) -> str:
    return f"{scheduler_name}-relay-{node_id}"


def node_relay(scheduler_name: str, namespace: str, members: int) -> Any:
    """The relay of this process's node for the run's scheduler, created if it is not there yet."""
    node_id = ray.get_runtime_context().get_node_id()
    return RelayActor.options(
        name=relay_name(scheduler_name, node_id), namespace=namespace, get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(scheduler_name, namespace, members)


class RelaySchedulerTransport(RaySchedulerTransport):
    """``RaySchedulerTransport`` whose report calls go to the node's relay (every other call goes to
    the scheduler). ``members``: the workers on this node (Ray Train's local world size)."""

    def __init__(self, name: str, namespace: str, members: int) -> None:
        super().__init__(name, namespace)
        self.members = members
        self._relay: Any = None

    def connect(self, timeout_s: float) -> bool:
        if not super().connect(timeout_s):
            return False
        try:
            self._relay = node_relay(self.name, self.namespace, self.members)
        except RayError:
            self._relay = None
        return self._relay is not None

    def submit(self, method: str, *args: Any) -> Any:
        if method != "report":
            return super().submit(method, *args)
        if self._relay is None:
            raise SchedulerUnavailableError(f"the report relay of scheduler {self.name!r} on this node is not there")
        try:
            return self._relay.report.remote(*args)
        except RayError as e:
            self._relay = None
            raise SchedulerUnavailableError(f"the report relay of scheduler {self.name!r}: {type(e).__name__}") from e

    def flush(self, timeout_s: float) -> None:
        """Wait until the node's relay has sent its open round and the scheduler has it."""
        if self._relay is None:
            raise SchedulerUnavailableError(f"the report relay of scheduler {self.name!r} on this node is not there")
        self.result(self._relay.flush.remote(), timeout_s)


def worker_transport(scheduler_name: str, namespace: str, route: str, members: int) -> RaySchedulerTransport:
    """A Ray Train worker's transport to its run's scheduler, for its run's ``route``
    (``PDMLConfig.report_route``): reports through the node's relay (``"node"``), or straight to the
    scheduler (``"worker"``; and ``"boundary"``, where the straight calls are rank 0's one call per
    boundary and every rank's final flush). A node with one worker (``members`` 1) reports straight in
    node mode too: its one call per flush is already the node's one call, and a relay would only add a
    hop and an idle actor."""
    if route == "node" and members > 1:
        return RelaySchedulerTransport(scheduler_name, namespace, members)
    return RaySchedulerTransport(scheduler_name, namespace)
