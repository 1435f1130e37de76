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
    assert client._held[0][1] == 1007  # the newest are kept (packed rows: the step is field 1)


def test_a_flush_waits_for_the_calls_in_flight_and_sends_everything_held():
    transport = SlowTransport()
    client = SchedulerClient(transport)
    for step in range(8):
        client.report(_reports(step))
    client.report([], flush=True)
    sent = sum(len(c[1][0]) for c in transport.calls if c[0] == "report")
    assert sent == 40 and not client._held and client.reports_dropped == 0


def test_a_flush_straight_to_the_scheduler_returns_only_once_its_own_call_is_in():
    # a worker that ends right after its final flush must not leave that call behind (the scheduler is a
    # threaded actor: a later call of the same caller, stats or a checkpoint's, may otherwise overtake it)
    transport = SlowTransport()
    client = SchedulerClient(transport)
    client.report(_reports(0))
    client.report(_reports(1), flush=True)
    assert [c[2] for c in transport.calls if c[0] == "report"] == [True, True]
    assert not client._report_calls


class RelayLikeTransport(SlowTransport):
    """A transport with a ``flush`` (a node relay): it records which report calls were done when it ran."""

    def flush(self, timeout_s):
        self.flushed_after = [c[2] for c in self.calls if c[0] == "report"]


def test_a_flush_through_a_relay_runs_only_after_the_last_report_call_is_in():
    # a threaded relay actor may run a caller's calls out of order: the flush must not overtake the
    # report call it is meant to deliver
    transport = RelayLikeTransport()
    client = SchedulerClient(transport)
    client.report(_reports(0))
    client.report(_reports(1), flush=True)
    assert transport.flushed_after == [True, True]


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



def _rows(worker, step, n=5):
    from pdml_ray.client import PackedReports

    return PackedReports.pack([WorkerReport(worker_id=worker, step=step * n + k, samples=8, compute_s=0.1)
                               for k in range(n)]).rows


def test_a_node_round_goes_to_the_scheduler_as_one_call_once_every_member_reported():
    from pdml_ray.client import ReportGather

    transport = FailingTransport()  # every call finishes at once
    gather = ReportGather(SchedulerClient(transport), members=8, wait_s=60.0)
    for flush in range(3):
        for worker in range(8):
            gather.add(_rows(worker, flush))
            sent = [c for c in transport.calls if c[0] == "report"]
            assert len(sent) == flush + (worker == 7)  # nothing goes before the node's last member
    sent = [c[1][0] for c in transport.calls if c[0] == "report"]
    assert [len(p) for p in sent] == [40, 40, 40] and gather.rounds == 3 and gather.rounds_late == 0
    assert sorted((r.worker_id, r.step) for r in sent[1]) == [(w, s) for w in range(8) for s in range(5, 10)]


def test_a_round_a_member_is_late_for_goes_after_wait_s_and_a_flush_sends_at_once():
    import time

    from pdml_ray.client import ReportGather

    transport = FailingTransport()
    gather = ReportGather(SchedulerClient(transport), members=8, wait_s=0.02)
    for worker in range(7):  # the 8th never reports this round
        gather.add(_rows(worker, 0))
    gather.tick()
    assert not transport.calls  # not yet wait_s old
    time.sleep(0.03)
    gather.tick()
    assert [len(c[1][0]) for c in transport.calls] == [35] and gather.rounds_late == 1
    gather.add(_rows(7, 1))
    gather.flush()
    assert [len(c[1][0]) for c in transport.calls] == [35, 5] and gather.rounds == 2


def test_a_node_behind_the_scheduler_coalesces_rounds_and_its_timer_sends_them_once_a_slot_is_free():
    from pdml_ray.client import ReportGather

    transport = SlowTransport()
    gather = ReportGather(SchedulerClient(transport), members=2, wait_s=60.0)
    for flush in range(4):
        gather.add(_rows(0, flush))
        gather.add(_rows(1, flush))
    assert len(transport.calls) == MAX_REPORT_CALLS_IN_FLIGHT and gather.client.reports_held == 30
    transport.finish(1)
    gather.tick()  # no new round: the timer sends what was held back
    assert [len(c[1][0]) for c in transport.calls] == [10, 30] and gather.client.reports_dropped == 0


def test_a_nodes_timer_has_work_only_while_a_round_is_open_or_reports_are_held_back():
    from pdml_ray.client import ReportGather

    transport = SlowTransport()
    gather = ReportGather(SchedulerClient(transport), members=2, wait_s=60.0)
    assert not gather.wait_for_work(0.0)  # nothing yet: the relay's timer sleeps
    gather.add(_rows(0, 0))
    assert gather.wait_for_work(0.0)  # a round is open
    gather.tick()
    assert gather.wait_for_work(0.0)  # still open (not wait_s old): tick again later
    gather.add(_rows(1, 0))  # the round goes
    gather.tick()
    assert not gather.wait_for_work(0.0)  # sent, nothing held back
    gather.add(_rows(0, 1))
    gather.add(_rows(1, 1))  # the first call is still pending: this round is held back
    gather.tick()
    assert gather.client.reports_held == 10 and gather.wait_for_work(0.0)  # ticks until a slot frees
    transport.finish(1)
    gather.tick()
    assert gather.client.reports_held == 0 and not gather.wait_for_work(0.0)
