"""The worker-side client never piles up calls or memory at a slow scheduler: at most
MAX_REPORT_CALLS_IN_FLIGHT report calls pending, later reports coalesced into the next call, the oldest
dropped and counted beyond MAX_BUFFERED_REPORTS, and a flush waits for what is in flight."""

from pdml_ray.client import MAX_BUFFERED_REPORTS, MAX_REPORT_CALLS_IN_FLIGHT, SchedulerClient
from pdml_ray.decisions import WorkerReport


class SlowTransport:
    """A scheduler that finishes calls only when told to (``finish``), or at a flush's wait."""

    def __init__(self):
        self.calls: list[list] = []  # [method, args, done]

    def connect(self, timeout_s):
        return True

    def submit(self, method, *args):
        call = [method, args, False]
        self.calls.append(call)
        return call

    def ready(self, pending, timeout_s):
        if timeout_s > 0:  # a flush waits: the scheduler catches up meanwhile
            pending[2] = True
        return pending[2]

    def result(self, pending, timeout_s=None):
        return None

    def finish(self, n):
        for call in [c for c in self.calls if not c[2]][:n]:
            call[2] = True


def _reports(step, n=5):
    return [WorkerReport(worker_id=0, step=step * n + k, samples=8, compute_s=0.1) for k in range(n)]


def test_reports_wait_while_the_scheduler_is_behind_and_travel_together_later():
    transport = SlowTransport()
    client = SchedulerClient(transport)
    for step in range(10):
        client.report(_reports(step))
    sent = [c for c in transport.calls if c[0] == "report"]
    assert len(sent) == MAX_REPORT_CALLS_IN_FLIGHT  # the rest are held, not queued at the scheduler
    assert client.reports_coalesced == 5 * (10 - MAX_REPORT_CALLS_IN_FLIGHT)
    transport.finish(1)  # the scheduler catches up with one call: the next carries everything held
    client.report(_reports(10))
    last = transport.calls[-1][1][0]
    assert len(last) == 5 * (11 - MAX_REPORT_CALLS_IN_FLIGHT)
    assert [r.step for r in last] == list(range(5 * MAX_REPORT_CALLS_IN_FLIGHT, 55))  # in order, none lost
    assert client.reports_dropped == 0


def test_beyond_the_buffer_the_oldest_reports_are_dropped_and_counted():
    transport = SlowTransport()
    client = SchedulerClient(transport)
    for step in range(MAX_REPORT_CALLS_IN_FLIGHT):
        client.report(_reports(step))
    big = [WorkerReport(worker_id=0, step=1000 + k, samples=8, compute_s=0.1) for k in range(MAX_BUFFERED_REPORTS + 7)]
    client.report(big)
    assert client.reports_dropped == 7 and len(client._held) == MAX_BUFFERED_REPORTS
    assert client._held[0].step == 1007  # the newest are kept


def test_a_flush_waits_for_the_calls_in_flight_and_sends_everything_held():
    transport = SlowTransport()
    client = SchedulerClient(transport)
    for step in range(8):
        client.report(_reports(step))
    client.report([], flush=True)
    sent = sum(len(c[1][0]) for c in transport.calls if c[0] == "report")
    assert sent == 40 and not client._held and client.reports_dropped == 0


class FailingTransport(SlowTransport):
    """Calls finish at once; ``fail`` of them fail as a dying actor's do (restarting) or as an error inside."""

    def __init__(self, fail=0, restarting=True):
        super().__init__()
        self.fail, self.restarting = fail, restarting

    def ready(self, pending, timeout_s):
        return True

    def result(self, pending, timeout_s=None):
        from pdml_ray.errors import SchedulerUnavailableError

        if self.fail > 0:
            self.fail -= 1
            error = SchedulerUnavailableError("scheduler 'x': ActorDiedError")
            error.restarting = self.restarting
            raise error
        return "ok"


def test_reports_in_a_call_that_failed_are_counted_as_dropped_and_training_goes_on():
    transport = FailingTransport(fail=1)
    client = SchedulerClient(transport)
    client.report(_reports(0))  # this call fails (the scheduler died with it in flight)
    client.report(_reports(1))  # finding the first one failed: counted; this one goes out
    client.report(_reports(2))
    assert client.report_calls_failed == 1 and client.reports_dropped == 5
    assert len([c for c in transport.calls if c[0] == "report"]) == 3


def test_a_blocking_call_is_sent_again_while_the_scheduler_restarts_but_not_after_an_error_inside_it():
    import pytest

    from pdml_ray.errors import SchedulerUnavailableError

    transport = FailingTransport(fail=2, restarting=True)
    client = SchedulerClient(transport)
    assert client.call("state_dict") == "ok" and len(transport.calls) == 3
    transport = FailingTransport(fail=1, restarting=False)
    client = SchedulerClient(transport)
    with pytest.raises(SchedulerUnavailableError):
        client.call("state_dict")
    assert len(transport.calls) == 1


def test_reports_travel_packed_and_read_back_whole():
    from pdml_ray.client import PackedReports

    transport = SlowTransport()
    client = SchedulerClient(transport)
    sent = _reports(0)
    client.report(sent)
    packed = transport.calls[-1][1][0]
    assert isinstance(packed, PackedReports) and list(packed.reports()) == sent

