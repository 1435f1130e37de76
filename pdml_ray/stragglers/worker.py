"""A data-parallel worker's logic, without Ray: hold a model replica and partitions, compute partition
gradients at given parameters, keep the latest one per partition, build the coded message.

``run(step, params, task)`` is what the Ray actor (``pdml_ray.actors.gradient_worker``) calls: real
forward/backward for each partition in ``task.compute``, then an EMULATED compute time of
``samples x per_sample_s x factor(worker, step)`` from the straggler model, slept in a way that a
newer step cuts short (``announce``): a cancelled step commits nothing and returns no message, so a
straggler never works on, or queues, steps the aggregator has moved past. What a cut-short step had
done is kept: a later task that asks for the same gradient (pipelined coding's catch-up: partition p
at the parameters of step t) resumes it and sleeps only the remaining fraction of its work, as a real
worker would finish a computation it had started. ``compute`` + ``commit``
are the same two halves without the sleep, for the simulated clock (``pdml_ray.stragglers.simulate``).

Objective of partition p: ``mean_loss(model(x_p), y_p) + l2 / 2 * ||theta||^2``; the full objective is
the mean over partitions (all of the same size).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor, nn

from pdml_ray.decisions import WorkerReport
from pdml_ray.errors import PlanError
from pdml_ray.stragglers.delays import NoStragglers, StragglerModel
from pdml_ray.stragglers.policy import Arrival, WorkerTask

LossFn = Callable[[Tensor, Tensor], Tensor]


def objective(model: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn, l2: float) -> Tensor:
    """Mean loss on (x, y) plus the L2 term: one partition's objective."""
    loss = loss_fn(model(x), y)
    if l2:
        loss = loss + 0.5 * l2 * sum((p * p).sum() for p in model.parameters())
    return loss


def flat_grad(model: nn.Module) -> Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])


@dataclass(frozen=True, slots=True)
class WorkerReply:
    """The small half of a worker's answer (the message tensor travels separately, as its own ref)."""

    arrival: Arrival
    report: WorkerReport
    emulated_s: float
    """Seconds of EMULATED compute (sleep) in this step."""
    cancelled: bool = False
    """True when a newer step cut this one short: nothing was committed, there is no message."""


@dataclass(frozen=True, slots=True)
class PendingStep:
    step: int
    task: WorkerTask
    fresh: dict[int, tuple[Tensor, int]]
    """partition -> (float32 gradient, the step whose parameters it was computed at)."""
    loss: float
    samples: int
    real_s: float
    work: dict[int, float]
    """partition -> samples of emulated work still to do (its size when fresh, less when resumed)."""

    @property
    def work_samples(self) -> float:
        return sum(self.work.values())


class GradientWorker:
    """Worker ``worker_id`` holding ``partitions`` (partition id -> (x, y)) and a replica of ``model``."""

    def __init__(self, worker_id: int, model: nn.Module, loss_fn: LossFn,
                 partitions: Mapping[int, tuple[Tensor, Tensor]], *, l2: float = 0.0,
                 straggler_model: StragglerModel | None = None, per_sample_s: float = 0.0,
                 num_threads: int | None = None) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.worker_id = worker_id
        self.model, self.loss_fn, self.l2 = model, loss_fn, l2
        self.partitions = dict(partitions)
        self.straggler_model: StragglerModel = straggler_model or NoStragglers()
        self.per_sample_s = per_sample_s
        self._latest: dict[int, tuple[Tensor, int]] = {}  # partition -> (float32 gradient, computed step)
        self._unfinished: dict[tuple[int, int], tuple[Tensor, float]] = {}  # (partition, step) -> (gradient, work left)
        self._newest_step = -1
        self._cond = threading.Condition()
        self._lock = threading.Lock()  # one step's compute/commit at a time

    def describe(self) -> dict:
        return {"worker": self.worker_id, "partitions": sorted(self.partitions),
                "straggler_model": self.straggler_model.label}

    def dies_at(self, step: int) -> bool:
        d = self.straggler_model.death_step(self.worker_id)
        return d is not None and step >= d

    def emulated_delay_s(self, step: int, samples: float) -> float:
        return samples * self.per_sample_s * self.straggler_model.factor(self.worker_id, step)

    # -- the two halves --------------------------------------------------------------------------

    def compute(self, step: int, params: Tensor, task: WorkerTask,
                old_params: Mapping[int, Tensor] | None = None) -> PendingStep:
        """Real gradients of ``task.compute`` at ``params`` (flat) and of ``task.catch_up`` at
        ``old_params[at_step]``; not yet visible to messages."""
        if task.worker != self.worker_id:
            raise PlanError(f"worker {self.worker_id} got worker {task.worker}'s task")
        old = dict(old_params or {})
        missing = [s for s in task.param_steps if s not in old]
        if missing:
            raise PlanError(f"worker {self.worker_id} step {step}: catch-up needs the parameters of steps {missing}")
        t0 = time.perf_counter()
        fresh: dict[int, tuple[Tensor, int]] = {}
        work: dict[int, float] = {}
        losses, samples = [], 0
        for p, at, theta in [(p, at, old[at]) for p, at in task.catch_up] + [(p, step, params) for p in task.compute]:
            if p not in self.partitions:
                raise PlanError(f"worker {self.worker_id} does not hold partition {p} (holds {sorted(self.partitions)})")
            x, y = self.partitions[p]
            samples += len(x)
            if (p, at) in self._unfinished:  # resume what a cut-short step had started
                g, left = self._unfinished.pop((p, at))
                fresh[p], work[p] = (g, at), left
                continue
            work[p] = float(len(x))
            nn.utils.vector_to_parameters(theta.to(torch.float32), self.model.parameters())
            self.model.zero_grad(set_to_none=True)
            loss = objective(self.model, x, y, self.loss_fn, self.l2)
            loss.backward()
            fresh[p] = (flat_grad(self.model).detach().to(torch.float32).clone(), at)
            if at == step:
                losses.append(float(loss.detach()))
        return PendingStep(step, task, fresh, sum(losses) / len(losses) if losses else float("nan"), samples,
                           time.perf_counter() - t0, work)

    def cut(self, pending: PendingStep, done_fraction: float) -> None:
        """A newer step cut ``pending`` short after ``done_fraction`` of its emulated time: keep its
        gradients with the work left (every partition progressed at the same rate), so a later task
        asking for the same (partition, step) resumes it. Older unfinished work is dropped."""
        keep = max(0.0, 1.0 - done_fraction)
        for p, (g, at) in pending.fresh.items():
            self._unfinished[(p, at)] = (g, pending.work[p] * keep)
        newest = {p: at for p, (_, at) in pending.fresh.items()}
        self._unfinished = {(p, at): v for (p, at), v in self._unfinished.items() if at >= newest.get(p, at)}

    def commit(self, pending: PendingStep, emulated_s: float = 0.0) -> tuple[Tensor, WorkerReply]:
        """Make the fresh gradients current and build the message ``sum c * latest g_p``."""
        for p, (g, v) in pending.fresh.items():
            if p not in self._latest or v >= self._latest[p][1]:
                self._latest[p] = (g, v)
        self._unfinished = {(p, at): x for (p, at), x in self._unfinished.items()
                            if p not in self._latest or at > self._latest[p][1]}
        message: Tensor | None = None
        terms = []
        for p, c in pending.task.send:
            if p not in self._latest:
                continue  # never computed: not in the message (and not in the arrival's terms)
            g, v = self._latest[p]
            message = c * g if message is None else message + c * g
            terms.append((p, float(c), v))
        if message is None:
            message = torch.zeros(sum(q.numel() for q in self.model.parameters()), dtype=torch.float32)
        grad_norm = float(torch.linalg.vector_norm(torch.stack([g for g, _ in pending.fresh.values()]).mean(0))) \
            if pending.fresh else float("nan")
        report = WorkerReport(worker_id=self.worker_id, step=pending.step, samples=max(1, pending.samples),
                              compute_s=max(pending.real_s + emulated_s, 1e-9), loss=pending.loss, grad_norm=grad_norm)
        return message, WorkerReply(Arrival(self.worker_id, pending.step, tuple(terms)), report, emulated_s)

    # -- the whole step, as the actor runs it ----------------------------------------------------

    def announce(self, step: int) -> None:
        """A newer step exists: any step older than it stops at its next check."""
        with self._cond:
            if step > self._newest_step:
                self._newest_step = step
                self._cond.notify_all()

    def run(self, step: int, params: Tensor, task: WorkerTask, *old_params: Tensor) -> tuple[Tensor, WorkerReply]:
        """Compute, sleep the emulated time (unless a newer step is announced), commit.

        ``old_params`` are the parameters of ``task.param_steps``, in that order (catch-up only)."""
        self.announce(step)
        with self._lock:
            if self._superseded(step):
                return self._cancelled(step, task, 0.0)
            pending = self.compute(step, params, task, dict(zip(task.param_steps, old_params)))
            delay = self.emulated_delay_s(step, pending.work_samples)
            t0 = time.perf_counter()
            with self._cond:
                cut = self._cond.wait_for(lambda: self._newest_step > step, timeout=delay) if delay > 0 else False
            slept = time.perf_counter() - t0
            if cut:
                self.cut(pending, slept / delay)
                return self._cancelled(step, task, slept)
            return self.commit(pending, slept)

    def _superseded(self, step: int) -> bool:
        with self._cond:
            return self._newest_step > step

    def _cancelled(self, step: int, task: WorkerTask, slept: float) -> tuple[Tensor, WorkerReply]:
        report = WorkerReport(worker_id=self.worker_id, step=step, samples=1, compute_s=max(slept, 1e-9),
                              loss=math.nan)
        return torch.zeros(0), WorkerReply(Arrival(self.worker_id, step, ()), report, slept, cancelled=True)
