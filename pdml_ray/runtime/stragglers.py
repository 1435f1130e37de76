"""Straggler-tolerant data parallelism on Ray worker actors: the aggregator's loop.

Each step the aggregator publishes the parameters once (``ray.put``), sends every alive worker its
task from the policy (with the parameter refs it needs, never copies), and waits with ``ray.wait`` on
the small replies, in arrival order, until ``policy.ready``; then it fetches only the messages the
policy's ``Combination`` uses, sums them in float64, takes an SGD step and publishes again.

- **Late results never pile up.** A worker gets a new task only by being sent the next step, and the
  next step's call cuts the old one short inside the worker (``pdml_ray.actors.gradient_worker``): the
  old call returns a ``cancelled`` reply at once and commits nothing. Replies tagged with an older
  step are dropped.
- **Deaths are noticed, never waited on.** A call that fails with ``RayActorError`` marks its worker
  dead; the policy's ``feasible`` says whether the survivors can still complete steps. Beyond what
  the policy tolerates, and after ``step_timeout_s`` without enough results, the run stops as
  stalled (``RunResult.stalled`` names the dead or missing workers; ``on_stall="raise"`` raises
  ``StragglerStallError`` instead).
- **Telemetry**: every reply carries a ``WorkerReport`` (samples, compute_s with the emulated sleep,
  loss, grad_norm); the records keep them all, and a scheduler actor (``create_scheduler``, or any
  actor with ``report(list[WorkerReport])``) passed as ``scheduler`` receives the completed ones
  (not the cut-short ones) fire-and-forget, once per step.
- **Gradient priorities** (policies with ``gradient_priority``: ``topk``, ``async``): the completed
  reports also go to the run's scheduler actor (``GradientFeed`` over ``SchedulerClient``; its one axis
  is the gradient deriver), every ``interval`` steps with a request for the next rule, which the
  aggregator adopts (``policy.adopt``) at the first step its answer is there and applies to each step's
  arrivals locally: the actor is never waited on. The run shows in ``pdml-ray status``
  (``scheduler_name``); ``in_process_scheduler=True`` keeps that scheduler in the driver instead.
  ``self.feed.cost_s`` is the aggregator's time on the feed (part of the step times).
- **Asynchronous policies** (``policy.asynchronous``: ``async``): a worker gets a task only when
  ``policy.gives_task`` says so (idle, or its task too stale to use), so it is not cut short by the
  next step and its reply, from an older step, counts when it arrives. Every step, each busy worker
  is ``tick``-ed (its EMULATED death happens at the step it is due, as for the others) and a dead
  one's unfinished or unfetched result is dropped. ``step_time_s`` then runs from the end of the
  previous step (its evaluation included: the workers keep computing through it).

Timing: ``step_time_s`` runs from publishing the parameters to the updated parameters. The full
loss and full gradient (for the figures: time to target, gradient cosine) are computed on the
aggregator's own model copy after that, outside the timed step. Compute times are EMULATED when
``per_sample_s`` > 0 (the workers sleep samples x per_sample_s x the straggler model's factor after
their real forward/backward).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Literal

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError
from torch import Tensor, nn

from pdml_ray.actors.gradient_worker import DEFAULT_GRADIENT_WORKER_NUM_CPUS, launch_gradient_worker
from pdml_ray.actors.scheduler import create_scheduler, end_scheduler
from pdml_ray.actors.scheduler_transport import RaySchedulerTransport
from pdml_ray.config import PDMLConfig, StragglerConfig
from pdml_ray.decisions import WorkerReport
from pdml_ray.errors import ConfigError, PDMLError, UsageError
from pdml_ray.metrics import PriorityGauges, export_or_warn
from pdml_ray.stragglers.delays import NoStragglers, StragglerModel
from pdml_ray.stragglers.gradient_feed import GradientFeed, feed_config
from pdml_ray.stragglers.policy import Arrival, StragglerPolicy, combine_messages
from pdml_ray.stragglers.problem import worker_partitions
from pdml_ray.stragglers.registry import make_policy
from pdml_ray.stragglers.run import FullObjective, RunResult, StepRecord, cosine
from pdml_ray.stragglers.stats import StragglerRunStats
from pdml_ray.stragglers.worker import LossFn, WorkerReply


class StragglerStallError(PDMLError, RuntimeError):
    """Training cannot continue: workers the policy needs are dead or did not answer in time."""


class WorkerPool:
    """Worker actors kept across runs: ``StragglerRuntime`` configures the first ``n`` for its policy,
    and dead ones are replaced before the next run. Starting 8 actors costs seconds on 2 cores."""

    def __init__(self, num_cpus_per_worker: float = DEFAULT_GRADIENT_WORKER_NUM_CPUS, name_prefix: str | None = None) -> None:
        self.num_cpus_per_worker, self.name_prefix = num_cpus_per_worker, name_prefix
        self.actors: list[Any] = []
        self._launched = 0

    def take(self, n: int) -> list[Any]:
        """``n`` live actors (launching or replacing as needed)."""
        needed, total = n * self.num_cpus_per_worker, ray.cluster_resources().get("CPU", 0.0)
        if needed > total:  # the actors would wait for resources forever
            raise ConfigError(f"{n} workers x num_cpus_per_worker={self.num_cpus_per_worker} need {needed:g} CPUs "
                              f"but the Ray cluster has {total:g}; lower num_cpus_per_worker")
        while len(self.actors) < n:
            self.actors.append(self._launch())
        return self.actors[:n]

    def replace(self, index: int) -> None:
        """Replace actor ``index`` (it died)."""
        ray.kill(self.actors[index])
        self.actors[index] = self._launch()

    def _launch(self) -> Any:
        self._launched += 1
        return launch_gradient_worker(self._launched - 1, name_prefix=self.name_prefix, num_cpus=self.num_cpus_per_worker)

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []


class StragglerRuntime:
    """``policy.num_workers`` worker actors over (x, y) cut into ``policy.num_partitions`` partitions."""

    def __init__(self, policy: StragglerPolicy, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, *,
                 lr: float, l2: float = 0.0, straggler_model: StragglerModel | None = None,
                 per_sample_s: float = 0.0, step_timeout_s: float = 30.0,
                 num_cpus_per_worker: float = DEFAULT_GRADIENT_WORKER_NUM_CPUS, scheduler: Any = None,
                 pool: WorkerPool | None = None, metrics_name: str | None = "pdml-stragglers",
                 in_process_scheduler: bool = False, decision_interval: int = 5,
                 config: StragglerConfig | None = None) -> None:
        if not ray.is_initialized():
            raise UsageError("StragglerRuntime needs a running Ray cluster: call ray.init() first")
        if not (step_timeout_s > 0 and lr > 0):
            raise ConfigError(f"step_timeout_s ({step_timeout_s!r}) and lr ({lr!r}) must be > 0")
        self.policy, self.lr, self.step_timeout_s = policy, lr, step_timeout_s
        self.straggler_model: StragglerModel = straggler_model or NoStragglers()
        self.scheduler = scheduler
        self.model = model
        self.evaluate = FullObjective(model, loss_fn, x, y, l2)
        self._own_pool = pool is None
        self._scheduler_actor: Any = None
        self.scheduler_name: str | None = None
        """The run's scheduler actor (``pdml-ray status --name``) deriving the policy's gradient rule, if any."""
        if policy.gradient_priority is not None and not in_process_scheduler:
            self.scheduler_name = f"pdml-stragglers-{uuid.uuid4().hex[:8]}"
            run_config = dataclasses.replace(
                feed_config(policy.gradient_priority, policy.seed, getattr(policy, "fixed_weights", None),
                            decision_interval), scheduler_name=self.scheduler_name, stragglers=config)
            self._scheduler_actor = create_scheduler(run_config, policy.num_workers)
            self.feed = GradientFeed.for_policy(policy, interval=decision_interval,
                                                transport=RaySchedulerTransport(self.scheduler_name, run_config.namespace))
        else:
            self.feed = GradientFeed.for_policy(policy, interval=decision_interval)
        self.pool = pool if pool is not None else WorkerPool(num_cpus_per_worker)
        emulated = [what for what, on in (("compute", per_sample_s > 0),
                                          ("stragglers", not isinstance(self.straggler_model, NoStragglers))) if on]
        self.stats = StragglerRunStats(policy.name, emulated=",".join(emulated) or "none")
        """This runtime's figures over its steps (``pdml_ray.stragglers.stats``), exported after every step
        as ``pdml_straggler_*`` metrics tagged ``run=<metrics_name>-<id>`` (``metrics_name=None``: not exported)."""
        self._gauges = PriorityGauges(metrics_name) if metrics_name is not None else None
        self._actors = self.pool.take(policy.num_workers)
        # the scheduler actor's process starts meanwhile; waiting for it here (start-up, as PDMLTrainer's
        # start-up calls do) keeps a short run's first decisions from being lost to its start
        started = [] if self._scheduler_actor is None else [self._scheduler_actor.ping.remote()]
        ray.get([a.configure.remote(w, model, loss_fn, held, l2=l2, straggler_model=self.straggler_model,
                                    per_sample_s=per_sample_s, num_threads=1)
                 for w, (a, held) in enumerate(zip(self._actors, worker_partitions(policy, x, y)))] + started,
                timeout=120)  # fail fast if one cannot start

    @classmethod
    def from_config(cls, config: StragglerConfig | PDMLConfig, model: nn.Module, loss_fn: LossFn, x: Tensor,
                    y: Tensor, *, l2: float = 0.0, straggler_model: StragglerModel | None = None,
                    **kwargs: Any) -> StragglerRuntime:
        """The runtime a config describes: a ``StragglerConfig`` (policy by name, lr, timeout, emulated
        compute), or a ``PDMLConfig`` with its ``stragglers`` section, whose ``gradient_priority`` and
        ``decision_interval`` the ``topk`` and ``async`` policies' rule then follows."""
        gradient_priority, interval = None, 5
        if isinstance(config, PDMLConfig):
            if config.stragglers is None:
                raise ConfigError("this PDMLConfig has no stragglers section: set PDMLConfig(stragglers="
                                  "StragglerConfig(policy=..., workers=..., stragglers=...))")
            gradient_priority, interval, config = config.gradient_priority, config.decision_interval, config.stragglers
        policy = make_policy(config.policy, workers=config.workers, stragglers=config.stragglers, seed=config.code_seed,
                             gradient_priority=gradient_priority)
        return cls(policy, model, loss_fn, x, y, lr=config.lr, l2=l2, straggler_model=straggler_model,
                   per_sample_s=config.per_sample_ms / 1e3, step_timeout_s=config.step_timeout_s,
                   decision_interval=interval, config=config, **kwargs)

    def shutdown(self) -> None:
        """Stop this runtime's workers: kill them if it launched its pool, else cut their steps short and
        replace the dead ones, so the pool serves the next run."""
        if self._gauges is not None:
            self._gauges.close()
        if self._scheduler_actor is not None:
            if self.feed is not None:
                try:
                    self.feed.close()  # its figures stay readable after the actor is gone
                except PDMLError:  # the scheduler is already gone: its figures with it
                    pass
            end_scheduler(self._scheduler_actor)
            self._scheduler_actor = None
        if self._own_pool:
            self.pool.shutdown()
            return
        for i, a in enumerate(self._actors):
            try:
                ray.get(a.stop.remote(), timeout=30)
            except RayActorError:
                self.pool.replace(i)

    def train(self, steps: int, *, on_stall: Literal["report", "raise"] = "report") -> RunResult:
        """Run ``steps`` steps from the model's current parameters; returns every step's record."""
        policy = self.policy
        params = nn.utils.parameters_to_vector(self.model.parameters()).detach().to(torch.float32).clone()
        loss, full = self.evaluate(params)
        initial = loss
        records: list[StepRecord] = []
        history: dict[int, ray.ObjectRef] = {}  # step -> published parameters (catch-up reads old ones)
        pending: dict[ray.ObjectRef, tuple[int, int, ray.ObjectRef]] = {}  # reply ref -> (worker, step, message ref)
        dead: dict[int, int] = {}  # worker -> step at which its death was noticed
        stalled: str | None = None
        previous_end = time.perf_counter()
        for step in range(steps):
            if policy.asynchronous:
                self._tick_busy(step, pending, dead)
            alive = frozenset(range(policy.num_workers)) - set(dead)
            if not policy.feasible(alive):
                stalled = self._death_note(dead, step)
                break
            t0 = time.perf_counter()
            history[step] = ray.put(params)
            for old in [s for s in history if s < step - policy.s - 2]:
                del history[old]
            in_flight = {w: s for w, s, _ in pending.values()}
            tasks = {w: policy.task(w, step) for w in sorted(alive) if policy.gives_task(w, step, in_flight.get(w))}
            for w, task in tasks.items():
                msg_ref, reply_ref = self._actors[w].run.options(num_returns=2).remote(
                    step, history[step], task, *[history[s] for s in task.param_steps])
                pending[reply_ref] = (w, step, msg_ref)
            arrivals: dict[int, Arrival] = {}
            message_refs: dict[int, ray.ObjectRef] = {}
            reports: list[WorkerReport] = []
            measured: list[WorkerReport] = []
            while not policy.ready(step, arrivals, alive):
                if not policy.feasible(alive):
                    stalled = self._death_note(dead, step)
                    break
                if not any(s == step or policy.asynchronous for _, s, _ in pending.values()):
                    stalled = f"step {step}: every alive worker answered and {policy.describe()} is still not ready"
                    break
                remaining = t0 + self.step_timeout_s - time.perf_counter()
                done, rest = ray.wait(list(pending), num_returns=1, timeout=max(remaining, 0.0))
                if done and rest:  # whatever else has already arrived, in one go
                    done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
                if not done:
                    waiting = sorted(w for w, s, _ in pending.values() if s == step)
                    stalled = (f"step {step}: timed out after {self.step_timeout_s:g} s waiting for workers {waiting}"
                               f"{'; ' + self._death_note(dead, step) if dead else ''}")
                    break
                for ref in done:
                    w, s, msg_ref = pending.pop(ref)
                    try:
                        reply: WorkerReply = ray.get(ref)
                    except RayActorError:
                        dead.setdefault(w, step)
                        alive = alive - {w}
                        continue
                    reports.append(reply.report)
                    if not reply.cancelled:  # a cut-short step's compute_s is not a throughput sample
                        measured.append(reply.report)
                    if (s == step or policy.asynchronous) and not reply.cancelled:
                        arrivals[w] = reply.arrival
                        message_refs[w] = msg_ref
            if stalled:
                break
            if self.feed is not None:
                self.feed.observe(step, measured, policy)
            combination = policy.combine(step, list(arrivals.values()))
            used = [w for w, _ in combination.weights]
            messages = dict(zip(used, ray.get([message_refs[w] for w in used])))
            gradient = combine_messages(combination, messages)
            params = params - self.lr * gradient.to(torch.float32)
            step_time = time.perf_counter() - (previous_end if policy.asynchronous else t0)
            # outside the timed step: the figures' full loss and gradient, and the telemetry
            grad_cos = cosine(gradient, full)
            loss, full = self.evaluate(params)
            if self.scheduler is not None and measured:
                self.scheduler.report.remote(measured)
            # every reply taken this step that the update did not use is dropped (arrivals do not carry
            # over): cut short by this step's call, late from an older step, or left out by the policy
            self.stats.observe(step_time, len(reports) - len(set(used) & set(arrivals)), len(dead))
            export_or_warn(self._gauges, self.stats)
            records.append(StepRecord(step, step_time, loss, grad_cos, combination,
                                      tuple(t.partitions_computed for t in tasks.values()), tuple(arrivals),
                                      tuple(sorted(dead)), tuple(reports)))
            previous_end = time.perf_counter()
        nn.utils.vector_to_parameters(params, self.model.parameters())
        if stalled and on_stall == "raise":
            raise StragglerStallError(f"{policy.describe()} stalled: {stalled}")
        return RunResult(policy.name, self.straggler_model.label, tuple(records), stalled, initial, params)

    def _tick_busy(self, step: int, pending: dict[ray.ObjectRef, tuple[int, int, ray.ObjectRef]],
                   dead: dict[int, int]) -> None:
        """Asynchronous policies: tell each busy worker the step (an EMULATED death due now happens);
        a worker found dead loses its pending results (unfinished, or finished and not yet taken)."""
        busy = sorted({w for w, _, _ in pending.values()} - set(dead))
        for w, ref in [(w, self._actors[w].tick.remote(step)) for w in busy]:
            try:
                ray.get(ref, timeout=self.step_timeout_s)
            except RayActorError:
                dead.setdefault(w, step)
                for r in [r for r, (v, _, _) in pending.items() if v == w]:
                    del pending[r]
            except GetTimeoutError:
                pass  # slow to answer but alive: its result still counts when it comes

    def _death_note(self, dead: dict[int, int], step: int) -> str:
        named = ", ".join(f"worker {w} (noticed at step {s})" for w, s in sorted(dead.items()))
        return (f"{named or 'no worker'} died; {self.policy.describe()} cannot complete step {step} "
                f"with the {self.policy.num_workers - len(dead)} survivors")
