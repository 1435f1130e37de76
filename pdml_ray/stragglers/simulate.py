"""Straggler-tolerant training on a simulated clock, without Ray: the same policies and the same
worker logic as the Ray runtime, with each worker's step finishing at its EMULATED compute time.

Per step every alive worker gets the policy's task at time 0 of the step and finishes after
``samples x per_sample_s x factor(worker, step)``; results arrive in that order, each committed as it
arrives (as the Ray worker commits when its sleep ends), until ``policy.ready``; the rest are cut off
and commit nothing (their partial work is kept for a resume), exactly like a cancelled step on Ray.
A worker past its death step never answers; when ``policy.feasible`` says the survivors cannot
complete a step, the run stops as stalled, naming the dead workers. Deterministic: unit tests compare policies with it.

Asynchronous policies (``policy.asynchronous``, e.g. ``async``) run on one continuing clock instead:
a worker gets a task only when ``policy.gives_task`` says so (idle, or its task too stale to use), is
never cut off by the next step, and its result arrives whenever its emulated time ends, possibly
steps later; a worker that dies loses the task it was computing. Policies with gradient priorities
(``policy.gradient_priority``) get the step's reports fed to an in-process scheduler
(``pdml_ray.stragglers.gradient_feed``) and adopt its decisions.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from pdml_ray.errors import ConfigError
from pdml_ray.stragglers.policy import Arrival, Combination, StragglerPolicy, combine_messages
from pdml_ray.stragglers.gradient_feed import GradientFeed
from pdml_ray.stragglers.run import Evaluator, RunResult, StepRecord, cosine
from pdml_ray.stragglers.worker import GradientWorker, PendingStep


def simulate(policy: StragglerPolicy, workers: Sequence[GradientWorker], params: Tensor, *, lr: float, steps: int,
             evaluate: Evaluator | None = None, label: str = "") -> RunResult:
    """Train ``steps`` SGD steps (``params -= lr * combined gradient``) from flat ``params``."""
    if len(workers) != policy.num_workers:
        raise ConfigError(f"{policy.name} needs {policy.num_workers} workers, got {len(workers)}")
    feed = GradientFeed.for_policy(policy)
    if policy.asynchronous:
        return _simulate_async(policy, workers, params, lr=lr, steps=steps, evaluate=evaluate, label=label, feed=feed)
    params = params.detach().to(torch.float32).clone()
    loss, full = evaluate(params) if evaluate else (math.nan, None)
    initial = loss
    records: list[StepRecord] = []
    history: dict[int, Tensor] = {}  # step -> parameters published at it (catch-up reads them)
    dead: set[int] = set()
    stalled = None
    for step in range(steps):
        dead |= {w.worker_id for w in workers if w.dies_at(step)}
        alive = frozenset(w.worker_id for w in workers) - dead
        if not policy.feasible(alive):
            stalled = f"worker(s) {sorted(dead)} died by step {step}; {policy.describe()} cannot complete a step without them"
            break
        history[step] = params
        tasks = {w: policy.task(w, step) for w in sorted(alive)}
        pending = {w: workers[w].compute(step, params, tasks[w], {s: history[s] for s in tasks[w].param_steps})
                   for w in tasks}
        finish = {w: workers[w].emulated_delay_s(step, pending[w].work_samples) for w in tasks}
        arrivals: dict[int, Arrival] = {}
        messages: dict[int, Tensor] = {}
        reports = []
        step_time = 0.0
        for w in sorted(tasks, key=lambda w: (finish[w], w)):
            messages[w], reply = workers[w].commit(pending[w], finish[w])
            arrivals[w] = reply.arrival
            reports.append(reply.report)
            step_time = finish[w]
            if policy.ready(step, arrivals, alive):
                break
        else:
            stalled = f"step {step}: all {len(tasks)} alive workers answered and {policy.describe()} is still not ready"
            break
        for w in tasks:
            if w not in arrivals:  # cut short at step_time: keep what it had done, as on Ray
                workers[w].cut(pending[w], step_time / finish[w] if finish[w] > 0 else 1.0)
        params, loss, full, grad_cos, combination = _apply(policy, step, arrivals, messages, reports, params, full,
                                                           lr=lr, evaluate=evaluate, feed=feed)
        records.append(StepRecord(step, step_time, loss, grad_cos, combination,
                                  tuple(t.partitions_computed for t in tasks.values()),
                                  tuple(arrivals), tuple(sorted(dead))))
    return RunResult(policy.name, label, tuple(records), stalled, initial, params)


def _apply(policy: StragglerPolicy, step: int, arrivals: dict[int, Arrival], messages: dict[int, Tensor],
           reports: list, params: Tensor, full: Tensor | None, *, lr: float, evaluate: Evaluator | None,
           feed: GradientFeed | None) -> tuple[Tensor, float, Tensor | None, float, Combination]:
    """One SGD step from what arrived (both loops): feed the reports, combine by the policy, update and
    evaluate. Returns (params, loss, full gradient, cosine to the previous full gradient, combination)."""
    if feed is not None:
        feed.observe(step, reports, policy)
    combination = policy.combine(step, list(arrivals.values()))
    gradient = combine_messages(combination, messages)
    grad_cos = cosine(gradient, full) if full is not None else math.nan
    params = params - lr * gradient.to(torch.float32)
    loss, full = evaluate(params) if evaluate else (math.nan, None)
    return params, loss, full, grad_cos, combination


def _simulate_async(policy: StragglerPolicy, workers: Sequence[GradientWorker], params: Tensor, *, lr: float,
                    steps: int, evaluate: Evaluator | None, label: str, feed: GradientFeed | None) -> RunResult:
    """The asynchronous loop: one clock (seconds of EMULATED compute) for the whole run."""
    params = params.detach().to(torch.float32).clone()
    loss, full = evaluate(params) if evaluate else (math.nan, None)
    initial = loss
    records: list[StepRecord] = []
    history: dict[int, Tensor] = {}
    busy: dict[int, tuple[PendingStep, float, float]] = {}  # worker -> (its step, start, finish time)
    dead: set[int] = set()
    stalled = None
    now = 0.0
    for step in range(steps):
        dead |= {w.worker_id for w in workers if w.dies_at(step)}
        for w in dead:
            busy.pop(w, None)  # the process died: what it was computing is lost
        alive = frozenset(w.worker_id for w in workers) - dead
        if not policy.feasible(alive):
            stalled = f"worker(s) {sorted(dead)} died by step {step}; {policy.describe()} cannot complete a step without them"
            break
        history[step] = params
        tasks = {}
        for w in sorted(alive):
            if not policy.gives_task(w, step, busy[w][0].step if w in busy else None):
                continue
            if w in busy:  # abandoned: cut short, its work kept for a resume
                abandoned, start, finish = busy[w]
                workers[w].cut(abandoned, (now - start) / (finish - start) if finish > start else 1.0)
            tasks[w] = policy.task(w, step)
            pending = workers[w].compute(step, params, tasks[w], {s: history[s] for s in tasks[w].param_steps})
            busy[w] = (pending, now, now + workers[w].emulated_delay_s(step, pending.work_samples))
        arrivals: dict[int, Arrival] = {}
        messages: dict[int, Tensor] = {}
        reports = []
        started = now
        while not policy.ready(step, arrivals, alive):
            if not busy:
                stalled = f"step {step}: every alive worker answered and {policy.describe()} is still not ready"
                break
            w = min(busy, key=lambda v: (busy[v][2], v))
            pending, start, finish = busy.pop(w)
            now = max(now, finish)
            messages[w], reply = workers[w].commit(pending, finish - start)
            arrivals[w] = reply.arrival
            reports.append(reply.report)
        if stalled:
            break
        params, loss, full, grad_cos, combination = _apply(policy, step, arrivals, messages, reports, params, full,
                                                           lr=lr, evaluate=evaluate, feed=feed)
        records.append(StepRecord(step, now - started, loss, grad_cos, combination,
                                  tuple(t.partitions_computed for t in tasks.values()),
                                  tuple(arrivals), tuple(sorted(dead))))
        for old in [s for s in history if s < step - 2 * policy.num_workers]:
            del history[old]
    return RunResult(policy.name, label, tuple(records), stalled, initial, params)
