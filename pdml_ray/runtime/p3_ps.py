"""The P3 parameter-server runtime: P3 as published, over parameter-server shards on Ray actors.

    ps = P3ParameterServer(num_workers=2, num_shards=2)
    result = ps.run(model, loss_fn, x, y, batch_sizes=(20, 12), steps=10, sgd=SGDSettings(lr=0.05),
                    config=P3Config(policy="p3", slice_elements=40_000, emulated_bandwidth_gbps=1.0))
    result.parameters        # the shards' parameters after the last step (one flat vector)

Each step k, worker w trains on rows ``[k B + offset_w, k B + offset_w + b_w)`` of (x, y) (the global
batch k cut into the workers' shares) with gradient weight ``b_w / B``, so the sum the shards apply
is the mean gradient of the global batch: the parameters equal single-process SGD's on the same
global batches whatever the send order (``tests/ray/test_p3_ps_ray.py``).

- Shards (``pdml_ray.actors.p3_ps.P3ShardActor``) hold the slices round-robin
  (``pdml_ray.p3.shard.shard_of``), apply SGD per slice as soon as every worker pushed it, and answer
  each push with the updated values.
- Workers (the straggler runtime's ``GradientWorkerHost`` actor shell hosting ``RayP3PSWorker``, a
  ``pdml_ray.p3.ps.P3PSWorker``) push slices from parameter hooks
  during backward, in send-queue order (``p3`` / ``fifo`` / ``bucketed``), through an EMULATED link
  (``P3Config.emulated_bandwidth_gbps``: each message waits until it would have arrived, both ways);
  the next forward waits per layer (forward pre-hooks) for that layer's updated slices only.
- The data set and initial parameters are published once with ``ray.put`` (the straggler runtime's
  convention); results come back as object refs, gathered with one ``ray.get``.

Reuse of the straggler-tolerant runtime: its worker actor itself (``GradientWorkerHost`` via
``launch_gradient_worker``, configured with ``worker_cls=RayP3PSWorker``; ``call`` / ``call_fn`` run the
worker's methods), its conventions (``DEFAULT_GRADIENT_WORKER_NUM_CPUS``, ``gradient_worker_name``, ``configure``
to reuse actors across runs) and object-store publishing.
``P3Config.credit_bytes`` (default four slices) is the ``p3`` policy's window per EMULATED link
(``pdml_ray.p3.ps``: it hides the runtime's per-message cost behind the message ahead). Not modelled:
the shards' own NIC (each worker's link is the bottleneck).

**The run's scheduler.** Slice size and credit come from the ``p3`` axis of the run's scheduler
(``pdml_ray.priority.p3``), reached through ``SchedulerClient``: by default a scheduler actor named for
the run (``pdml-ray status`` and the metrics show it while the run trains; ended with the run), or in
this process (``run(..., in_process_scheduler=True)``: the same calls, answered synchronously). The
decision in force at step 0 is the config's own (fetched before the first step). With ``P3Config.auto`` the run
goes in segments of ``PDMLConfig.decision_interval`` steps: after each, the workers' measured links go
to the axis (``observe``) with a request for the decision of the boundary after next, which the
scheduler derives while the next segment trains; at that boundary a new slice size or credit is
applied (the shards re-sliced with their values and momentum, the workers re-planned) before its first
step. So a decision is fetched ahead and never waited on inside a step; each boundary applies the last
step's update before the next forward (that step's forward does not overlap it). Without ``auto`` the
run is one segment.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch
from torch import Tensor, nn

from pdml_ray.actors.gradient_worker import DEFAULT_GRADIENT_WORKER_NUM_CPUS
from pdml_ray.actors.p3_ps import RayP3PSWorker, launch_p3_shard, launch_p3_worker
from pdml_ray.actors.scheduler_transport import RunScheduler
from pdml_ray.config import PDMLConfig
from pdml_ray.config.p3 import P3Config
from pdml_ray.decisions import Boundary, P3Decision
from pdml_ray.errors import ConfigError, SchedulerUnavailableError, UsageError
from pdml_ray.p3.link import LinkModel
from pdml_ray.p3.ps import LossFn, WorkerRun, layer_plan, measure_compute, model_layers
from pdml_ray.p3.shard import SGDSettings
from pdml_ray.p3.slicing import SlicePlan, flatten_layer, reassemble
from pdml_ray.scheduler import SchedulerStats

WARMUP_STEPS = 2  # steps left out of the iteration time (one-off costs: first calls, allocations)
DECISION_TIMEOUT_S = 60.0
"""Longest a boundary waits for the decision requested a segment earlier before it keeps the current one."""


@dataclass(frozen=True, slots=True)
class P3PSResult:
    policy: str
    parameters: Tensor  # the shards' values after the last step, flat, in the model's parameter order
    worker_parameters: tuple[Tensor, ...]  # each replica's, after applying the last update
    runs: tuple[WorkerRun, ...]
    link: LinkModel | None
    decisions: tuple[P3Decision, ...] = ()
    """The scheduler's ``p3`` decisions the run ran, in order (each from its ``effective_step``)."""
    scheduler_stats: SchedulerStats | None = None
    """The run's scheduler's stats record at the end (its ``p3`` axis among them), read before it ended."""
    scheduler_name: str | None = None
    """The run's scheduler actor's name (``pdml-ray status --name``); None in-process."""

    @property
    def iteration_s(self) -> float:
        """Median steady-state iteration time: per step the slowest worker's, warm-up steps left out."""
        per_step = [max(vals) for vals in zip(*(r.iteration_s for r in self.runs))]
        return float(statistics.median(per_step[WARMUP_STEPS:] or per_step))

    @property
    def forward_wait_s(self) -> float:
        per_step = [max(vals) for vals in zip(*(r.forward_wait_s for r in self.runs))]
        return float(statistics.median(per_step[WARMUP_STEPS:] or per_step))


def global_batches(batch_sizes: Sequence[int], steps: int) -> list[list[tuple[int, int, float]]]:
    """Per worker, per step: (first row, rows, weight b_w / B) of its share of global batch k."""
    total = sum(batch_sizes)
    if total < 1 or any(b < 1 for b in batch_sizes):
        raise ConfigError(f"batch sizes must be >= 1 per worker, got {list(batch_sizes)}")
    return [[(k * total + sum(batch_sizes[:w]), b, b / total) for k in range(steps)]
            for w, b in enumerate(batch_sizes)]


def link_of(config: P3Config) -> LinkModel | None:
    bw = config.emulated_bandwidth_gbps
    return LinkModel(bw * 1e9 / 8, config.emulated_latency_us * 1e-6) if bw is not None else None


class P3Decisions:
    """The parameter-server runtime's client of the run's scheduler: its ``p3`` axis's decisions, each
    requested a segment before the boundary it applies at (see the module docstring)."""

    def __init__(self, config: PDMLConfig, num_workers: int, *, in_process: bool = False) -> None:
        self._run = RunScheduler(config, num_workers, in_process=in_process, name_prefix="pdml-p3ps")
        self.config, self.client = self._run.config, self._run.client
        self.scheduler_name: str | None = self._run.name
        """The scheduler actor's name (``pdml-ray status --name``), None in-process."""
        self.ran: list[P3Decision] = []
        """The decisions the run ran, in order."""


    def first(self) -> P3Decision:
        """The decision in force at step 0 (a blocking call, before any step)."""
        bundle = self.client.call("bundle", Boundary(0, self.config.decision_interval, ()), {})
        decision = bundle.get("p3")
        if not isinstance(decision, P3Decision):
            raise SchedulerUnavailableError("the run's scheduler gave no p3 decision for step 0; check that its "
                                            "PDMLConfig has the p3 section (`pdml-ray status`)")
        decision.validate()
        self.ran.append(decision)
        return decision

    def observe(self, step: int, rows: list[tuple[float, float, float]]) -> None:
        """What the workers measured about their links, to the ``p3`` axis (fire-and-forget)."""
        self.client.observe("p3", step, rows)

    def request(self, step: int) -> None:
        """Ask for the decision of the boundary at ``step`` (derived while the segment before it trains)."""
        self.client.request(Boundary(step, self.config.decision_interval, ()), {"p3": self.ran[-1].version})

    def take(self, step: int) -> P3Decision | None:
        """The decision requested for the boundary at ``step``, if it is a new one for this step (its answer
        waited for up to ``DECISION_TIMEOUT_S``: requested a segment ago, it is normally there); else None,
        and the current decision stays."""
        bundle = self.client.poll(DECISION_TIMEOUT_S)
        decision = bundle.get("p3") if bundle is not None else None
        if not (isinstance(decision, P3Decision) and decision.effective_step == step
                and decision.version > self.ran[-1].version):
            return None
        decision.validate()
        self.ran.append(decision)
        return decision

    def stats(self) -> SchedulerStats:
        return self.client.call("stats")

    def close(self) -> None:
        """End the run's scheduler actor (its snapshot deleted first); in-process there is nothing to end."""
        self._run.close()


class P3ParameterServer:
    """``num_workers`` worker actors and ``num_shards`` shard actors, reused across ``run`` calls; each run
    a client of its own scheduler (an actor, or in-process: ``run(..., in_process_scheduler=True)``)."""

    def __init__(self, num_workers: int = 2, num_shards: int = 2, *, name_prefix: str | None = None,
                 num_cpus_per_actor: float = DEFAULT_GRADIENT_WORKER_NUM_CPUS) -> None:
        if not ray.is_initialized():
            raise UsageError("P3ParameterServer needs a running Ray cluster: call ray.init() first")
        if num_workers < 1 or num_shards < 1:
            raise ConfigError(f"need >= 1 worker and >= 1 shard, got {num_workers} and {num_shards}")
        self.workers = [launch_p3_worker(i, name_prefix=name_prefix, num_cpus=num_cpus_per_actor)
                        for i in range(num_workers)]
        self.shards = [launch_p3_shard(i, name_prefix=name_prefix, num_cpus=num_cpus_per_actor)
                       for i in range(num_shards)]

    def run(self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, *, batch_sizes: Sequence[int],
            steps: int, sgd: SGDSettings, config: P3Config | PDMLConfig, timeout_s: float = 300.0,
            compute_sleep_s: list[tuple[float, float]] | None = None,
            in_process_scheduler: bool = False) -> P3PSResult:
        """``steps`` steps of ``model`` (left unchanged; every actor gets a copy) under ``config`` (a
        ``P3Config``, or a ``PDMLConfig`` with its ``p3`` section: its ``decision_interval`` times the
        boundaries of ``auto``); ``compute_sleep_s``: per layer (forward, backward) seconds of EMULATED
        compute (``P3PSWorker``). The run's scheduler is an actor (``pdml-ray status`` shows it while the run
        trains; starting it costs seconds: a new Ray worker process, 7-10 s on a loaded 2-core machine), or
        with ``in_process_scheduler`` this process's (the same calls, answered synchronously)."""
        pdml = config if isinstance(config, PDMLConfig) else PDMLConfig(p3=config)
        p3 = pdml.p3
        if p3 is None:
            raise ConfigError("P3ParameterServer.run needs a P3Config, or a PDMLConfig with its p3 section set")
        if len(batch_sizes) != len(self.workers):
            raise ConfigError(f"{len(batch_sizes)} batch sizes for {len(self.workers)} workers")
        if steps * sum(batch_sizes) > len(x):
            raise ConfigError(f"{steps} steps of {sum(batch_sizes)} samples need {steps * sum(batch_sizes)} rows, "
                              f"the data set has {len(x)}")
        decisions = P3Decisions(pdml, len(self.workers), in_process=in_process_scheduler)
        try:
            decision = decisions.first()
            plan = layer_plan(model, decision.slice_elements, p3.element_size)
            layers = [flatten_layer(ps) for _, _, ps in model_layers(model)]
            link = link_of(p3)
            layers_ref, x_ref, y_ref = ray.put(layers), ray.put(x), ray.put(y)  # published once
            self._configure_shards(plan, layers_ref, sgd)
            ray.get([w.configure.remote(i, model, loss_fn, x_ref, y_ref, batches, self.shards, policy=p3.policy,
                                        slice_elements=decision.slice_elements, bucket_bytes=p3.bucket_bytes,
                                        link=link, compute_sleep_s=compute_sleep_s,
                                        credit_bytes=decision.credit_bytes, transfer=p3.ps_transfer,
                                        worker_cls=RayP3PSWorker)
                     for i, (w, batches) in enumerate(zip(self.workers, global_batches(batch_sizes, steps)))],
                    timeout=120)
            interval = pdml.decision_interval if p3.auto else steps  # without auto nothing changes: one segment
            for first in range(0, steps, interval):
                stop = min(first + interval, steps)
                new = decisions.take(first) if first > 0 else None
                if new is not None and (new.slice_elements, new.credit_bytes) != (decision.slice_elements,
                                                                                  decision.credit_bytes):
                    plan = self._replan(plan, new, model, sgd, p3.element_size)
                decision = new or decision
                if p3.auto and stop < steps:
                    decisions.request(stop)  # decided while this segment trains, from the links measured so far
                links = ray.get([w.call.remote("train_segment", first, stop) for w in self.workers], timeout=timeout_s)
                rows = [row for row in links if row is not None]
                if rows:
                    decisions.observe(stop - 1, rows)
            outs = ray.get([w.call.remote("finish") for w in self.workers], timeout=timeout_s)
            values: dict[int, Tensor] = {}
            for part in ray.get([s.values.remote() for s in self.shards]):
                values.update(part)
            flat = torch.cat(reassemble(plan, [values[i] for i in range(len(plan.slices))]))
            stats = decisions.stats()
        finally:
            decisions.close()
        return P3PSResult(p3.policy, flat, tuple(p for _, p in outs), tuple(r for r, _ in outs), link,
                          tuple(decisions.ran), stats, decisions.scheduler_name)

    def _configure_shards(self, plan: SlicePlan, layers: Any, sgd: SGDSettings, momentum: Any = None) -> None:
        ray.get([s.configure.remote(i, len(self.shards), plan, layers, len(self.workers), sgd, momentum)
                 for i, s in enumerate(self.shards)], timeout=120)

    def _replan(self, plan: SlicePlan, decision: P3Decision, model: nn.Module, sgd: SGDSettings,
                element_size: int) -> SlicePlan:
        """Between segments (every update applied): the shards re-sliced with their current values and
        momentum, the workers re-planned; returns the new plan."""
        values: dict[int, Tensor] = {}
        momentum: dict[int, Tensor] = {}
        for v, m in zip(ray.get([s.values.remote() for s in self.shards]),
                        ray.get([s.momentum.remote() for s in self.shards])):
            values.update(v)
            momentum.update(m)
        layers = reassemble(plan, [values[i] for i in range(len(plan.slices))])
        momenta = (reassemble(plan, [momentum[i] for i in range(len(plan.slices))])
                   if len(momentum) == len(plan.slices) else None)  # none yet, or SGD without momentum
        new_plan = layer_plan(model, decision.slice_elements, element_size)
        self._configure_shards(new_plan, ray.put(layers), sgd, ray.put(momenta) if momenta is not None else None)
        ray.get([w.call.remote("replan", decision.slice_elements, decision.credit_bytes) for w in self.workers],
                timeout=120)
        return new_plan

    def compute_s(self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, *, batch_sizes: Sequence[int],
                  steps: int) -> float:
        """Median forward + backward seconds of an iteration (the slowest worker's, all computing at
        once as in training), without communication."""
        x_ref, y_ref = ray.put(x), ray.put(y)
        times = ray.get([w.call_fn.remote(measure_compute, model, loss_fn, x_ref, y_ref, batches, num_threads=1)
                         for w, batches in zip(self.workers, global_batches(batch_sizes, steps))], timeout=300)
        per_step = [max(vals) for vals in zip(*times)]
        return float(statistics.median(per_step[WARMUP_STEPS:] or per_step))

    def shutdown(self) -> None:
        for a in self.workers + self.shards:
            ray.kill(a)
        self.workers, self.shards = [], []

    def __enter__(self) -> P3ParameterServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
