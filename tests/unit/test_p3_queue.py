"""P3 send queues: order, preemption at slice granularity, the credit window, DDP-like buckets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.config import P3Config, PDMLConfig
from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.p3.queue import QUEUES, BucketedQueue, ddp_buckets, make_queue
from pdml_ray.p3.slicing import plan_slices


def drain(queue):
    out = []
    while (m := queue.pop()) is not None:
        out.append(m)
        queue.ack(m)
    return out


def test_p3_sends_in_forward_order_fifo_in_ready_order():
    plan = plan_slices([10, 20, 10], 10)  # slices: L0:0, L1:1,2, L2:3
    for name, expect in [("p3", [0, 1, 2, 3]), ("fifo", [3, 1, 2, 0])]:
        q = make_queue(name, plan)
        for layer in (2, 1, 0):  # backward: last layer first, all ready before anything is sent
            for s in plan.slices_of(layer):
                q.push(s)
        assert [m.slices[0].index for m in drain(q)] == expect, name


def test_a_newly_ready_high_priority_slice_overtakes_queued_low_priority_ones():
    plan = plan_slices([10, 10, 40], 10)  # L2 has slices 2..5
    q = make_queue("p3", plan, credit_bytes=40)  # one slice in flight
    for s in plan.slices_of(2):
        q.push(s)
    first = q.pop()
    assert first is not None and first.slices[0].index == 2
    assert q.pop() is None  # the window is full: slices 3..5 stay queued (can still be overtaken)
    for s in plan.slices_of(0):  # layer 0 becomes ready while layer 2 is being sent
        q.push(s)
    q.ack(first)
    assert [m.slices[0].index for m in drain(q)] == [0, 3, 4, 5]
    fifo = make_queue("fifo", plan, credit_bytes=40)
    for s in plan.slices_of(2):
        fifo.push(s)
    m = fifo.pop()
    assert m is not None
    for s in plan.slices_of(0):
        fifo.push(s)
    fifo.ack(m)
    assert [m.slices[0].index for m in drain(fifo)] == [3, 4, 5, 0]  # FIFO never preempts


@settings(max_examples=50, deadline=None)
@given(numels=st.lists(st.integers(1, 120), min_size=1, max_size=6), size=st.integers(1, 30),
       credit_slices=st.integers(1, 6), acks=st.lists(st.booleans(), max_size=80))
def test_bytes_in_flight_never_exceed_the_credit(numels, size, credit_slices, acks):
    plan = plan_slices(numels, size)
    credit = credit_slices * size * 4
    q = make_queue("p3", plan, credit_bytes=credit)
    flying, pushed, ack_iter = [], 0, iter(acks)
    layers = list(reversed(range(len(numels))))
    while pushed < len(layers) or q.pending or flying:
        if pushed < len(layers) and next(ack_iter, True):
            for s in plan.slices_of(layers[pushed]):
                q.push(s)
            pushed += 1
        while (m := q.pop()) is not None:
            flying.append(m)
            assert q.in_flight_bytes <= credit
        if flying:
            q.ack(flying.pop(0))
    assert q.max_in_flight_bytes <= credit and q.in_flight_bytes == 0


def test_a_message_larger_than_the_credit_still_goes_alone():
    plan = plan_slices([100], 100)
    q = make_queue("p3", plan, credit_bytes=8)
    q.push(plan.slices[0])
    m = q.pop()
    assert m is not None and m.nbytes == 400


def test_buckets_follow_ddp_reverse_order_and_go_when_complete():
    plan = plan_slices([10, 10, 10, 10], 10)  # 40 bytes per slice
    buckets = ddp_buckets(plan, bucket_bytes=80)
    assert [[s.index for s in b] for b in buckets] == [[2, 3], [0, 1]]
    q = make_queue("bucketed", plan, bucket_bytes=80)
    assert isinstance(q, BucketedQueue)
    q.push(plan.slices[3])
    assert q.pop() is None  # half a bucket
    q.push(plan.slices[2])
    m = q.pop()
    assert m is not None and [s.index for s in m.slices] == [2, 3] and m.nbytes == 80
    q.push(plan.slices[1])
    q.push(plan.slices[0])
    m2 = q.pop()
    assert m2 is not None and [s.index for s in m2.slices] == [0, 1] and m2.priority == 0
    q.ack(m)
    q.ack(m2)
    q.reset()
    q.push(plan.slices[3])
    q.push(plan.slices[2])
    assert q.pop() is not None  # a new round starts with full buckets again


def test_misuse_and_unknown_names_are_refused():
    plan = plan_slices([10], 10)
    with pytest.raises(ConfigError, match="bucketed"):
        make_queue("lifo", plan)
    q = make_queue("fifo", plan)
    q.push(plan.slices[0])
    with pytest.raises(PlanError, match="twice"):
        q.push(plan.slices[0])
    with pytest.raises(PlanError, match="still queued"):
        q.reset()
    with pytest.raises(ConfigError):
        make_queue("p3", plan, credit_bytes=0)
    assert sorted(QUEUES) == ["bucketed", "fifo", "layer-fifo", "p3"]


def test_p3_config_validates_and_loads_from_a_dict():
    c = PDMLConfig.from_dict({"p3": {"policy": "fifo", "slice_elements": 1000, "emulated_bandwidth_gbps": 1.0}})
    assert c.p3 is not None and c.p3.effective_credit_bytes == 16_000
    assert P3Config().slice_elements == 40_000
    for bad in [{"policy": "lifo"}, {"slice_elements": 0}, {"credit_bytes": -1}, {"emulated_bandwidth_gbps": 0},
                {"emulated_latency_us": 5.0}, {"auto": "yes"}, {"element_size": 3}]:
        with pytest.raises(ConfigError):
            P3Config(**bad)
