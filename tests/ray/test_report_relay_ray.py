"""Per-node reporting through the real relay actor: a node's workers' reports reach the scheduler
whole, in one call per round, and a worker's final flush waits until the scheduler has them."""

import ray

import pytest

from pdml_ray.actors.report_relay import RelaySchedulerTransport, relay_name, worker_transport
from pdml_ray.actors.scheduler import create_scheduler, end_scheduler
from pdml_ray.client import SchedulerClient
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import WorkerReport


def test_a_nodes_reports_reach_the_scheduler_through_its_relay_one_round_per_flush(ray_local):
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=128), scheduler_name="relay-test",
                        namespace="pdml-test")
    handle = create_scheduler(config, 2)
    clients = [SchedulerClient(RelaySchedulerTransport("relay-test", "pdml-test", members=2)) for _ in range(2)]
    for flush in range(3):
        for worker, client in enumerate(clients):
            client.report([WorkerReport(worker_id=worker, step=flush * 5 + k, samples=64, compute_s=0.1)
                           for k in range(5)], flush=flush == 2)
    stats = ray.get(handle.stats.remote())
    assert stats.reports_received == 30 and stats.reports_rejected == 0 and stats.last_step == 14
    relay = ray.get_actor(relay_name("relay-test", ray.get_runtime_context().get_node_id()), namespace="pdml-test")
    relayed = ray.get(relay.stats.remote())
    assert relayed["members"] == 2 and relayed["reports_received"] == 30 and relayed["reports_dropped"] == 0
    # one round per complete flush; more when a round went late (wait_s after its first call) or a held-back
    # call (MAX_REPORT_CALLS_IN_FLIGHT) split one, fewer when a worker's calls coalesced while one was in flight
    assert relayed["rounds"] >= 2
    assert sum(c.reports_dropped for c in clients) == 0
    end_scheduler(handle)
    ray.kill(relay)


def test_a_node_with_one_worker_reports_straight_to_the_scheduler_and_has_no_relay(ray_local):
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64), scheduler_name="relay-lone",
                        namespace="pdml-test")
    handle = create_scheduler(config, 1)
    transport = worker_transport("relay-lone", "pdml-test", "node", members=1)
    assert not isinstance(transport, RelaySchedulerTransport)
    client = SchedulerClient(transport)
    client.report([WorkerReport(worker_id=0, step=k, samples=64, compute_s=0.1) for k in range(5)], flush=True)
    stats = ray.get(handle.stats.remote())
    assert stats.reports_received == 5 and stats.reports_rejected == 0
    with pytest.raises(ValueError):  # no relay was made for the node
        ray.get_actor(relay_name("relay-lone", ray.get_runtime_context().get_node_id()), namespace="pdml-test")
    assert isinstance(worker_transport("relay-lone", "pdml-test", "node", members=2), RelaySchedulerTransport)
    end_scheduler(handle)
