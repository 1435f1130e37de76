"""Step timing (pdml_ray.train.timing) with stand-in CUDA events on a fake GPU clock: a step's compute
time is the span between its begin and end records on the compute stream, it arrives once the end
has completed (a step late, never blocking unless asked), and work queued after end() (the all-reduce,
waiting for other ranks) is not in it. No GPU needed."""

import pytest
import torch

from pdml_ray.train.timing import CpuTimer, CudaEventTimer, make_timer


class FakeGpu:
    """Two streams on a fake clock (seconds). Work on a stream starts when the stream is free, and not
    before the host launched it (``now``); ``now`` is the host's time, moved by ``advance`` and by
    blocking waits (counted in ``blocks``)."""

    def __init__(self):
        self.now = 0.0
        self.tail = {"compute": 0.0, "side": 0.0}  # when each stream will have finished its queue
        self.current = "compute"
        self.blocks = 0

    def run(self, seconds, stream="compute"):
        self.tail[stream] = max(self.tail[stream], self.now) + seconds

    def wait_stream(self, waiter, other):
        """``waiter`` goes on only once ``other`` has done what is queued on it (like work.wait())."""
        self.tail[waiter] = max(self.tail[waiter], self.tail[other])

    def advance(self, seconds):
        self.now += seconds

    def event(self):
        return FakeEvent(self)


class FakeEvent:
    """The part of torch.cuda.Event the timer uses, on a FakeGpu."""

    def __init__(self, gpu):
        self.gpu = gpu
        self.at = None  # when the stream reaches the record

    def record(self, stream=None):
        stream = stream or self.gpu.current
        self.at = max(self.gpu.tail[stream], self.gpu.now)

    def query(self):
        return self.at is not None and self.gpu.now >= self.at

    def synchronize(self):
        if not self.query():
            self.gpu.blocks += 1
            self.gpu.now = self.at

    def elapsed_time(self, end_event):
        assert self.query() and end_event.query(), "elapsed_time on an event that has not completed"
        return (end_event.at - self.at) * 1000.0  # milliseconds, like CUDA's


def _timer(gpu, **kw):
    return CudaEventTimer(torch.device("cuda", 0), event_factory=gpu.event, **kw)


def _approx(results):
    return [(s, pytest.approx(t, abs=1e-9)) for s, t in results]


def test_a_step_is_reported_once_its_end_has_completed_with_the_span_between_its_records():
    gpu = FakeGpu()
    timer = _timer(gpu)
    gpu.run(0.003)  # the previous step's optimizer is still queued when the host begins this one
    timer.begin(0)
    gpu.run(0.010)  # forward + backward
    timer.end()
    assert timer.collect() == []  # the GPU has not got there: it arrives later
    assert timer.pending == 1
    gpu.advance(0.012)
    assert timer.collect() == []  # compute ends at 0.013
    gpu.advance(0.002)
    assert timer.collect() == _approx([(0, 0.010)])  # begin's record ran at 0.003, end's at 0.013
    assert timer.collect() == [] and timer.pending == 0  # reported once
    assert timer.latest_s == pytest.approx(0.010)


def test_work_after_end_the_all_reduce_and_waiting_for_other_ranks_is_excluded():
    gpu = FakeGpu()
    timer = _timer(gpu)
    got = []
    for step, compute in enumerate([0.010, 0.020, 0.015]):
        timer.begin(step)
        gpu.run(compute)
        gpu.wait_stream("side", "compute")  # the all-reduce starts once the gradient exists...
        gpu.run(0.200, stream="side")  # ...and lasts long: a slower rank arrives late
        timer.end()  # backward's compute ended (the last bucket)
        gpu.wait_stream("compute", "side")  # work.wait(): the compute stream waits for the all-reduce
        gpu.run(0.001)  # optimizer step
        got += timer.collect()
        gpu.advance(0.05)  # the host goes on (and waits, on its own, when it has to)
    gpu.advance(10.0)
    got += timer.collect()
    assert got == _approx([(0, 0.010), (1, 0.020), (2, 0.015)])


def test_nothing_blocks_unless_asked_and_results_come_in_step_order():
    gpu = FakeGpu()
    timer = _timer(gpu)
    got = []
    for step in range(4):  # the host runs ahead: it never waits for the GPU
        timer.begin(step)
        gpu.run(0.010)
        timer.end()
        got += timer.collect()
        gpu.advance(0.004)
    assert gpu.blocks == 0 and gpu.now == pytest.approx(0.016)
    assert [s for s, _ in got] == [0]  # only step 0's end (0.010) was reached by the last collect
    gpu.advance(0.010)  # now 0.026: step 1 (ends 0.020) is done, step 2 (ends 0.030) is not
    got += timer.collect()
    assert [s for s, _ in got] == [0, 1] and gpu.blocks == 0
    got += timer.collect(block=True)  # the end of training: wait for the rest
    assert got == _approx([(0, 0.010), (1, 0.010), (2, 0.010), (3, 0.010)])
    assert gpu.blocks == 2 and gpu.now == pytest.approx(0.040)  # waited for steps 2 and 3's ends
    assert timer.pending == 0


def test_the_queue_of_pending_steps_is_bounded_by_waiting_for_the_oldest():
    gpu = FakeGpu()
    timer = _timer(gpu, max_pending=3)
    for step in range(6):  # the GPU falls far behind: nothing is collected in the loop
        timer.begin(step)
        gpu.run(0.010)
        timer.end()
        assert len(timer._pending) <= 3  # steps holding events: the bound
    # Closing step k happens at begin(k + 1): closing steps 3 and 4 went past the bound, so the
    # oldest (steps 0 and 1, ending at 0.010 and 0.020) were waited for and their times kept
    assert gpu.blocks == 2 and gpu.now == pytest.approx(0.020)
    assert len(timer._pending) == 3 and timer.pending == 5
    got = timer.collect()  # closes step 5, which pushes step 2 out too: one more wait (to 0.030)
    assert got == _approx([(0, 0.010), (1, 0.010), (2, 0.010)])
    assert gpu.blocks == 3 and len(timer._pending) == 3
    got += timer.collect(block=True)
    assert got == _approx([(s, 0.010) for s in range(6)])


def test_the_compute_stream_of_begin_gets_the_end_record_and_end_is_cheap_and_repeatable():
    gpu = FakeGpu()
    streams = iter(["compute"])
    timer = _timer(gpu, current_stream=lambda: next(streams))  # asked once per step, at begin
    timer.end()  # a DDP hook outside any step (e.g. a backward outside ctx.step): nothing happens
    assert not timer.ended and timer.collect() == []
    timer.begin(7)
    gpu.run(0.010)
    gpu.current = "side"  # end() called where another stream is current (autograd's thread)
    gpu.run(0.500, stream="side")
    timer.end()  # first backward's last bucket...
    gpu.current = "compute"
    gpu.run(0.005)
    timer.end()  # ...a second backward in the same step: the last end() counts
    assert timer.ended
    gpu.advance(1.0)
    assert timer.collect() == _approx([(7, 0.015)])  # recorded on the compute stream, not the side one


def test_abort_drops_the_open_step_and_begin_refuses_an_open_one():
    gpu = FakeGpu()
    timer = _timer(gpu)
    timer.begin(0)
    with pytest.raises(RuntimeError, match="still open"):
        timer.begin(1)
    timer.abort()
    timer.begin(1)
    gpu.run(0.010)
    timer.end()
    timer.begin(2)  # closes step 1 without a collect in between
    gpu.run(0.020)
    timer.end()
    gpu.advance(1.0)
    assert timer.collect() == _approx([(1, 0.010), (2, 0.020)])


def test_cpu_timer_reports_at_once_on_its_clock():
    clock = iter([1.0, 1.25, 2.0, 2.5, 2.75, 3.0, 3.5]).__next__
    timer = CpuTimer(clock=clock)
    timer.end()  # no step open: ignored (and reads no clock)
    timer.begin(0)  # 1.0
    timer.end()  # 1.25
    assert timer.ended
    assert timer.collect() == _approx([(0, 0.25)])  # no step late on a CPU
    assert timer.collect() == [] and not timer.ended
    timer.begin(1)  # 2.0
    timer.end()  # 2.5
    timer.end()  # 2.75: the last end counts
    timer.begin(2)  # 3.0, closes step 1
    timer.end()  # 3.5
    assert timer.collect(block=True) == _approx([(1, 0.75), (2, 0.5)])
    assert timer.latest_s == pytest.approx(0.5) and timer.pending == 0


def test_a_collective_bracketed_inside_the_span_is_not_compute_on_the_gpu():
    """FSDP2's all-gather before a module, or DDP's buffer broadcast: the compute stream waits for a
    collective on another stream that a slower rank holds up; pause()/resume() around it take the wait
    out, however long it is. Brackets nest (the outermost counts), and one open at end() closes there."""
    gpu = FakeGpu()
    timer = _timer(gpu)
    got = []
    for step, wait in enumerate([0.300, 0.010]):
        timer.begin(step)
        gpu.run(0.004)  # the first module's forward
        timer.pause()
        timer.pause()  # nested: FSDP's unshard inside a bracketed pre-forward
        gpu.run(wait, stream="side")  # the all-gather, waiting for the slow rank
        gpu.wait_stream("compute", "side")
        timer.resume()
        gpu.run(0.001)  # the copy-out, still inside the outer bracket
        timer.resume()
        timer.resume()  # one resume too many: ignored
        gpu.run(0.006)  # the rest of forward and backward
        timer.pause()  # a reduce-scatter still in flight when the step's compute ends
        gpu.run(0.050, stream="side")
        gpu.wait_stream("compute", "side")
        timer.end()
        got += timer.collect()
        gpu.advance(1.0)
    got += timer.collect()
    assert got == _approx([(0, 0.010), (1, 0.010)])  # 4 + 6 ms of compute, whatever the waits


def test_pause_outside_a_step_or_after_its_end_changes_nothing():
    clock = iter([0.0, 1.0, 1.5, 2.0, 3.0]).__next__
    timer = CpuTimer(clock=clock)
    timer.pause()  # an evaluation forward outside ctx.step: reads no clock
    timer.resume()
    timer.begin(0)  # 0.0
    timer.pause()  # 1.0
    timer.resume()  # 1.5
    timer.end()  # 2.0
    timer.pause()  # after end: ignored
    timer.resume()
    assert timer.collect() == _approx([(0, 1.5)])
    timer.begin(1)  # 3.0
    timer.abort()  # a failed step drops its brackets with it
    timer.resume()
    assert timer.collect() == []


def test_make_timer_picks_events_on_cuda_and_wall_time_elsewhere_without_touching_cuda():
    assert isinstance(make_timer(torch.device("cpu")), CpuTimer)
    timer = make_timer(torch.device("cuda", 0))  # constructing it needs no GPU
    assert isinstance(timer, CudaEventTimer) and timer.device == torch.device("cuda", 0)
    assert timer.collect(block=True) == []
    with pytest.raises(ValueError):
        CudaEventTimer(torch.device("cuda", 0), max_pending=0)


def test_the_context_reports_each_step_once_its_compute_time_arrives_a_step_late():
    """PDMLContext driven with the event timer on the fake GPU: step s's report waits for its end event
    and carries exactly its compute-stream span (not the all-reduce on the side stream after it); the
    end of training collects the last one."""
    import numpy as np

    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.train.context import PDMLContext, StepBatch

    gpu = FakeGpu()
    ctx = PDMLContext(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=4)), 0, 1, torch.device("cpu"),
                      "CPU", None)
    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    ctx._timer = _timer(gpu)
    seen = []
    for step, compute in enumerate([0.010, 0.020, 0.030]):
        batch = StepBatch(step=step, epoch=0, indices=np.arange(4), grad_weight=1.0, decision_version=0)
        with ctx.step(batch) as scope:
            scope.loss(model(torch.ones(4, 2)).squeeze(1)).backward()
            gpu.run(compute)  # this step's kernels, queued on the compute stream (the host is ahead)
        gpu.run(0.5, "side")  # the all-reduce on its own stream, after the end event
        seen.append([r.step for r in ctx._reports])
        gpu.advance(compute)  # the GPU gets through this step's compute while the host moves on
    assert seen == [[], [0], [0, 1]]  # each step's report comes at the next step, never blocking
    assert [r.compute_s for r in ctx._reports] == [pytest.approx(0.010), pytest.approx(0.020)]
    assert gpu.blocks == 0
    ctx.client = None
    ctx.flush()  # the end of training: collects the last step (done by now: nothing to wait for)
    assert not ctx._untimed and gpu.blocks == 0


def test_the_sleep_compute_mode_sleeps_samples_times_the_time_per_sample_over_the_speed():
    """Sleep compute mode: the step's compute is its (small) real work plus samples x per-sample / speed,
    reported as compute."""
    import numpy as np

    from pdml_ray.config import NodePriorityConfig, PDMLConfig
    from pdml_ray.train.context import PDMLContext, StepBatch

    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8, emulated_speeds=[0.5],
                                                         emulated_per_sample_s=5e-3))
    ctx = PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", None)
    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    batch = StepBatch(step=0, epoch=0, indices=np.arange(8), grad_weight=1.0, decision_version=0)
    with ctx.step(batch) as scope:
        scope.loss(model(torch.ones(8, 2)).squeeze(1)).backward()
    (report,) = ctx._reports  # the CPU clock: reported as soon as the block ends
    assert 0.080 <= report.compute_s < 0.080 + 0.05  # 8 samples x 5 ms / 0.5, plus the tiny real step
