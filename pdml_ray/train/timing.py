"""How long one training step's compute took, measured without waiting on any collective.

A step's compute time feeds the node priorities: ``samples / compute_s`` is a worker's rate, and the
batch shares follow the rates. So ``compute_s`` must hold this worker's own forward and backward and
nothing that depends on the other workers: not the gradient all-reduce, not waiting for the slowest
rank to arrive at it. If it did, every rank's step would last about as long as the slowest one's,
the measured rates would converge and the shares would barely move on exactly the mixed clusters
they are for.

**Why events.** GPU kernels run asynchronously: when ``backward()`` returns on the host, the GPU may
still be far from done, so host wall time measures kernel launches, not compute. Synchronizing first
(``torch.cuda.synchronize``) does not help: it waits for every stream of the device, the one the
all-reduce runs on included, so the time then contains the communication and the wait for the other
ranks. CUDA events measure on the GPU's own clock instead: an event recorded on the compute stream
when the step begins and one recorded when its compute ends (after backward's last gradient kernel
was launched, e.g. from DDP's communication hook at the last bucket) bracket exactly the work queued
on that stream in between. Collectives run on their own streams (NCCL's), and the compute stream only
waits for them when told to (``work.wait()``, DDP's end of backward, a ``wait_stream``), which happens
after the end event was recorded, so they fall outside the span. Recording is cheap and never blocks.

**Why a step late.** An event's time is known only once the GPU has reached it. Asking for it at once
(``event.synchronize()``) would block the host until the step's compute is done and take away the
overlap of the host running ahead. Instead ``collect()`` polls (``event.query()``) and hands out the
steps whose end event has completed, in step order: typically step ``s`` arrives while step ``s + 1``
runs. Nothing blocks unless ``collect(block=True)`` is asked for (the end of training, a checkpoint),
and that waits only for the compute stream to reach the end events, never for a collective queued
after them.

**Communication inside the span.** Some collectives sit inside the compute, where the step waits for
every rank: DDP's broadcast of buffers (BatchNorm's running statistics) at the start of each forward,
FSDP2's all-gathers before each sharded module's forward and backward and its reduce-scatters during
backward. ``pause()`` and ``resume()`` bracket them (the wrappers call them from module hooks, see
``pdml_ray.train.wrappers``); the bracketed time is subtracted from the step's span. On a GPU the two
marks are events on the compute stream too, so what is subtracted is how long the compute stream sat
in between: its wait for the collective (plus FSDP's copies in and out of the collective's buffers,
which cost the same at any batch size). Brackets nest (only the outermost counts), a ``pause()``
outside an open step does nothing, and one still open at ``end()`` is closed there.

**The bound.** A timer keeps at most ``max_pending`` ended steps whose times are not yet known (two
events each). If the host runs further ahead of the GPU than that, the oldest step is waited for
(its end event only, i.e. that step's own compute) and its time is kept for the next ``collect()``;
memory stays bounded and in ordinary training (the host is at most a step or two ahead) it never
happens.

On a CPU the same protocol runs on ``time.perf_counter``: a step's time is known as soon as it ends.

The protocol (``StepTimer``), as a step scope drives it::

    timer.begin(step)            # start of the step's compute (records on the compute stream)
    ...forward, backward...      # the last gradient bucket may call timer.end() (cheap, no sync);
                                 # a collective inside them is bracketed by timer.pause(), timer.resume()
    if not timer.ended:
        timer.end()              # otherwise compute ends when the step block does
    for s, compute_s in timer.collect():   # the steps whose time is now known (usually s = step - 1)
        ...report step s...

This module imports torch only (no Ray).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import torch

from pdml_ray.errors import ConfigError, UsageError

DEFAULT_MAX_PENDING = 8
"""Ended steps a ``CudaEventTimer`` keeps waiting for their events before it blocks on the oldest."""


class TimingEvent(Protocol):
    """What the timer needs of an event: ``torch.cuda.Event(enable_timing=True)``, or a stand-in."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds from this event to end_event

    def synchronize(self) -> None: ...


class StepTimer(Protocol):
    """Times the compute of one step at a time; results come out in step order via ``collect``."""

    def begin(self, step: int) -> None: ...

    def end(self) -> None: ...

    @property
    def ended(self) -> bool: ...

    def abort(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def collect(self, block: bool = False) -> list[tuple[int, float]]: ...

    @property
    def pending(self) -> int: ...

    @property
    def latest_s(self) -> float | None: ...


M = TypeVar("M")  # a time mark: a perf_counter reading, or a recorded event


class _Timer(Generic[M]):
    """The bookkeeping common to both timers; subclasses say what a mark is and when it is known."""

    def __init__(self, max_pending: int) -> None:
        if max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1 (ended steps kept waiting for their events), got {max_pending}")
        self.max_pending = max_pending
        self._open: tuple[int, M] | None = None  # (step, begin mark) of the step being computed
        self._end: M | None = None  # the open step's end mark (the last end() call counts)
        self._gaps: list[tuple[M, M]] = []  # the open step's (pause, resume) marks: not compute
        self._paused: M | None = None  # the open bracket's pause mark
        self._depth = 0  # pause() calls not yet resumed (brackets nest; the outermost counts)
        self._pending: deque[tuple[int, M, M, list[tuple[M, M]]]] = deque()  # ended, time not known yet
        self._ready: list[tuple[int, float]] = []  # known (waited for under the bound), not handed out
        self._latest: float | None = None

    # -- what a subclass provides --------------------------------------------------------------
    def _mark(self, at_begin: bool) -> M:
        raise NotImplementedError

    def _done(self, mark: M) -> bool:
        raise NotImplementedError

    def _wait(self, mark: M) -> None:
        raise NotImplementedError

    def _seconds(self, begin: M, end: M) -> float:
        raise NotImplementedError

    # -- the protocol --------------------------------------------------------------------------
    def begin(self, step: int) -> None:
        """The step's compute starts now. Closes the previous step if it ended; one step at a time."""
        if self._open is not None:
            if self._end is None:
                raise UsageError(f"timer: begin({step}) while step {self._open[0]} is still open; "
                                   "call end() or abort() first")
            self._close()
        self._open = (step, self._mark(at_begin=True))
        self._gaps, self._paused, self._depth = [], None, 0

    def end(self) -> None:
        """The open step's compute ends now. Cheap and never blocks (safe inside a communication hook,
        on autograd's thread); without an open step it does nothing; a later call moves the end. A
        bracket still open (``pause()`` without its ``resume()``) is closed here."""
        if self._open is not None:
            self._end = self._mark(at_begin=False)
            if self._paused is not None:
                self._gaps.append((self._paused, self._end))
                self._paused = None

    def pause(self) -> None:
        """A collective starts inside the open step's compute: time from here to ``resume()`` is not
        compute. Cheap and never blocks; nests; outside an open step, or after ``end()``, it does nothing."""
        if self._open is None or self._end is not None:
            return
        self._depth += 1
        if self._depth == 1:
            self._paused = self._mark(at_begin=False)

    def resume(self) -> None:
        """The collective that ``pause()`` announced is done: compute goes on."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._paused is not None and self._end is None:
            self._gaps.append((self._paused, self._mark(at_begin=False)))
            self._paused = None

    @property
    def ended(self) -> bool:
        """Whether ``end()`` was called for the open step."""
        return self._open is not None and self._end is not None

    def abort(self) -> None:
        """Drop the open step (it failed: it has no time to report)."""
        self._open, self._end = None, None
        self._gaps, self._paused, self._depth = [], None, 0

    def collect(self, block: bool = False) -> list[tuple[int, float]]:
        """``(step, compute seconds)`` of every step whose time became known since the last call, in
        step order. Closes the open step if it has ended. Without ``block`` it never waits: a step
        whose end the GPU has not reached yet stays pending (and later ones behind it, to keep the
        order). With ``block`` it waits for all ended steps (their compute only)."""
        if self.ended:
            self._close()
        out, self._ready = self._ready, []
        while self._pending:
            step, begin, end, gaps = self._pending[0]
            if not self._done(end):
                if not block:
                    break
                self._wait(end)
            self._pending.popleft()
            out.append((step, self._compute_s(begin, end, gaps)))
        if out:
            self._latest = out[-1][1]
        return out

    @property
    def pending(self) -> int:
        """Ended steps whose time is not handed out yet (the open step not counted)."""
        return len(self._pending) + len(self._ready)

    @property
    def latest_s(self) -> float | None:
        """The compute seconds of the newest step handed out by ``collect`` (None before the first)."""
        return self._latest

    def _compute_s(self, begin: M, end: M, gaps: list[tuple[M, M]]) -> float:
        """The span from begin to end less its bracketed collectives (every mark is done once end is)."""
        return max(self._seconds(begin, end) - sum(self._seconds(p, r) for p, r in gaps), 0.0)

    def _close(self) -> None:
        assert self._open is not None and self._end is not None
        step, begin = self._open
        self._pending.append((step, begin, self._end, self._gaps))
        self._open, self._end, self._gaps, self._paused, self._depth = None, None, [], None, 0
        while len(self._pending) > self.max_pending:  # the GPU is far behind: wait for the oldest
            old_step, old_begin, old_end, old_gaps = self._pending.popleft()
            self._wait(old_end)
            self._ready.append((old_step, self._compute_s(old_begin, old_end, old_gaps)))


class CpuTimer(_Timer[float]):
    """Host wall time (``time.perf_counter``): right for CPU compute, which is done when it returns."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(max_pending=1)
        self._clock = clock

    def _mark(self, at_begin: bool) -> float:
        return self._clock()

    def _done(self, mark: float) -> bool:
        return True

    def _wait(self, mark: float) -> None:
        pass

    def _seconds(self, begin: float, end: float) -> float:
        return end - begin


class CudaEventTimer(_Timer[TimingEvent]):
    """GPU time between two events on the compute stream (see the module docstring).

    ``begin`` records on the device's current stream and notes it as the step's compute stream;
    ``end`` records on that same stream, whichever thread calls it (DDP runs communication hooks on
    autograd's device thread). ``event_factory`` makes the events (``torch.cuda.Event(enable_timing=
    True)`` by default; a test passes stand-ins on a fake clock); ``current_stream`` gives the compute
    stream (by default ``torch.cuda.current_stream(device)`` with real events, ``None`` with
    stand-ins, which then use their own notion of the current stream). Nothing touches CUDA before
    the first ``begin``.
    """

    def __init__(self, device: torch.device | int | str | None = None,
                 event_factory: Callable[[], TimingEvent] | None = None,
                 current_stream: Callable[[], Any] | None = None,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        super().__init__(max_pending)
        self.device = torch.device(device) if device is not None else torch.device("cuda")
        if event_factory is None:
            event_factory = _cuda_event
            if current_stream is None:
                dev = self.device
                current_stream = lambda: torch.cuda.current_stream(dev)  # noqa: E731
        self._new_event = event_factory
        self._current_stream = current_stream if current_stream is not None else (lambda: None)
        self._stream: Any = None  # the open step's compute stream

    def _mark(self, at_begin: bool) -> TimingEvent:
        if at_begin:
            self._stream = self._current_stream()
        event = self._new_event()
        event.record(self._stream)
        return event

    def _done(self, mark: TimingEvent) -> bool:
        return mark.query()

    def _wait(self, mark: TimingEvent) -> None:
        mark.synchronize()  # until the compute stream reaches this event: nothing queued after it

    def _seconds(self, begin: TimingEvent, end: TimingEvent) -> float:
        return begin.elapsed_time(end) / 1000.0


def _cuda_event() -> TimingEvent:
    return torch.cuda.Event(enable_timing=True)


def make_timer(device: torch.device) -> StepTimer:
    """The step timer for compute on ``device``: CUDA events on a GPU, ``perf_counter`` otherwise."""
    if device.type == "cuda":
        return CudaEventTimer(device)
    return CpuTimer()
