"""Pipeline x data parallelism inside a Ray Train loop: torch's pipeline runtime per replica, gradients
averaged per stage.

A ``PDMLTrainer`` run with ``PDMLConfig.pipeline`` set runs its ``W`` workers as ``pipeline.stages``
stages x ``W / stages`` data-parallel replicas (``pipeline_layout``: rank r is stage r % S of replica
r // S). In the loop:

    ctx = pdml_ray.train.get_pipeline_context()
    pipe = ctx.prepare(model, microbatches=4, loss_fn=nn.functional.mse_loss,
                       optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    for step in range(steps):
        x, y = batch_of(ctx.replica)          # this replica's share of the global batch
        loss = pipe.step(x, y)                # the global batch's mean loss, on every rank

Each step of ``pipe.step``:

1. the step's plan: rank 0 takes it from the run's scheduler (its ``pipeline`` axis, over the worker's
   ``SchedulerClient``), requested a step ahead as ``runtime.pipeline_plans`` does, and broadcasts it to
   every rank when its version changes. The plan is single-replica: every replica runs the same order.
2. torch's ``_PipelineScheduleRuntime`` runs it over this replica's process group
   (``pipeline.torch_exec.TorchPlanRuntime``): the first stage splits ``x`` into micro-batches, the last
   computes the loss against ``y``; gradients are accumulated and divided by the micro-batch count.
3. each stage's gradients are averaged over that stage's replicas: one flat bucket, one all-reduce.
   Not DDP: torch's runtime runs the stage's backward once per micro-batch (and split into input and
   weight gradients in zero-bubble orders), where DDP's hooks would all-reduce every time; one
   all-reduce after the step is the one collective DDP's last-micro-batch sync would be, and the
   global batch's mean loss travels in the same bucket.
4. the optimizer steps this rank's stage (its parameters only).

The mean over replicas of each replica's mean over equal micro-batches is the full batch's mean
gradient: a step equals one step of the unsplit model on the global batch (``tests/unit/
test_train_pipeline.py``, to 1e-5).

Node priorities are off for pipeline runs: a replica's stages step in lockstep on the same
micro-batches, so there is no per-worker batch share to act on, and ``PDMLTrainer`` refuses
``node_priority`` (and ``sample_priority``) with ``pipeline``. Plans keep one stage per worker (the
stages are built once): static schedules, or osprey and auto with ``osprey.plans='full-backward'``,
which plan from every step's action latencies (``pipeline_latency``: the ranks time torch's compute
calls, rank 0 sends the slowest replica's per action). Ray-free: ``PDMLTrainer``'s worker wrapper
installs the context (``set_pipeline_context``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pdml_ray.client import SchedulerClient
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, MicroBatchPlan, WorkerReport
from pdml_ray.errors import ConfigError, SchedulerUnavailableError, UsageError
from pdml_ray.pipeline.plan import Plan
from pdml_ray.pipeline.registry import STATIC_SCHEDULES
from pdml_ray.pipeline.torch_exec import TorchPlanRuntime, pipeline_stages
from pdml_ray.train.pipeline_latency import ActionTimer, LatencyRow, stage_latencies
from pdml_ray.train.pipeline_layout import PipelineLayout

PLAN_TIMEOUT_S = 60.0
"""Longest rank 0 waits for a step's plan before it runs the newest plan it has again."""

_context: PipelineContext | None = None  # this worker process's context while PDMLTrainer runs a pipeline loop


def get_pipeline_context() -> PipelineContext:
    """The pipeline context of this Ray Train worker (inside a loop ``PDMLTrainer`` runs with ``pipeline`` set)."""
    if _context is None:
        raise UsageError("pdml_ray.train.get_pipeline_context() is only available inside a training loop "
                         "launched by pdml_ray.train.PDMLTrainer with PDMLConfig(pipeline=PipelineConfig(stages=...))")
    return _context


def set_pipeline_context(context: PipelineContext | None) -> None:
    """Install (or clear, with None) this process's pipeline context; ``PDMLTrainer``'s worker wrapper calls it."""
    global _context
    _context = context


class ScheduledStagePlans:
    """Every step's plan from the scheduler's ``pipeline`` axis: rank 0 asks one step ahead, and
    broadcasts a plan to every rank of the run when it differs from the one they run. The scheduler
    stamps a new version on every step's plan, a static schedule's too, so what travels every step is
    one integer (the count of distinct plans) and the plan itself only when it changed."""

    def __init__(self, client: SchedulerClient | None, *, rank: int, stages: int, microbatches: int,
                 device: torch.device, adaptive: bool = False) -> None:
        """``adaptive``: the schedule plans from measured latencies (osprey, auto), which ``observe`` sends."""
        self.client, self.rank, self.device, self.adaptive = client, rank, device, adaptive
        self.shape = {"stages": stages, "replicas": 1, "microbatches": microbatches}  # every replica runs it
        self.decision: MicroBatchPlan | None = None
        """Rank 0: the newest decision the scheduler sent."""
        self.plan: Plan | None = None
        """The plan every rank runs, as rank 0 broadcast it."""
        self.plan_changes = 0
        """Distinct plans run so far (a static schedule: 1); every rank counts the same."""
        self.fallbacks = 0
        """Rank 0: steps that ran the newest plan again because the scheduler's answer did not come."""
        self._newest: Plan | None = None  # rank 0: the newest decision's plan ...
        self._newest_count = 0  # ... and the count of distinct plans including it
        self._requested: int | None = None
        if rank == 0:
            if client is None:
                raise UsageError("rank 0 of a pipeline run plans through the run's scheduler: give it a SchedulerClient")
            client.set_shape("pipeline", self.shape)

    def plan_for(self, step: int) -> Plan:
        """Step ``step``'s plan, on every rank (a collective: every rank calls it for every step)."""
        if self.rank == 0:
            self._fetch(step)
        flag = torch.tensor([self._newest_count], dtype=torch.int64, device=self.device)  # rank 0's counts
        shared = dist.is_initialized() and dist.get_world_size() > 1
        if shared:
            dist.broadcast(flag, src=0)
        if int(flag.item()) != self.plan_changes or self.plan is None:  # a new plan: its data travels once
            box = [self._newest.to_dict() if self.rank == 0 and self._newest is not None else None]
            if shared:
                dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                raise SchedulerUnavailableError(f"no plan for step {step} from the pdml-ray scheduler (pipeline "
                                                "axis); check that its actor is alive (`pdml-ray status`)")
            self.plan, self.plan_changes = Plan.from_dict(box[0]), int(flag.item())
        return self.plan

    def observe(self, step: int, rows: list[LatencyRow]) -> None:
        """Step ``step``'s action latencies on this rank (``ActionTimer``) to the scheduler, for an adaptive
        schedule: gathered on rank 0 (a collective), the slowest replica's per action, fire-and-forget.
        Sent after step ``step + 1``'s plan was asked for: that plan rests on steps up to ``step - 1``."""
        if not self.adaptive:
            return
        gathered: list[Any] = [None] * dist.get_world_size() if self.rank == 0 else []
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.gather_object(rows, gathered if self.rank == 0 else None, dst=0)
        else:
            gathered = [rows]
        if self.rank == 0 and self.client is not None:
            self.client.observe("pipeline", step, stage_latencies(gathered))

    def _fetch(self, step: int) -> None:
        """Rank 0: take step ``step``'s decision (asked for a step ago) and ask for step ``step + 1``'s."""
        assert self.client is not None
        if self._requested != step:  # the first step: nothing useful in flight
            self.client.poll(PLAN_TIMEOUT_S)
            self._request(step)
        bundle = self.client.poll(PLAN_TIMEOUT_S)
        decision = bundle.get("pipeline") if bundle is not None else None
        if isinstance(decision, MicroBatchPlan):
            decision.validate()
            self.decision = decision
            if decision.plan != self._newest:
                self._newest, self._newest_count = decision.plan, self._newest_count + 1
        elif self.decision is not None:
            self.fallbacks += 1
        self._request(step + 1)

    def _request(self, step: int) -> None:
        assert self.client is not None
        since = {"pipeline": self.decision.version} if self.decision is not None else {}
        self.client.request(Boundary(step, 1, ()), since)
        self._requested = step


class PipelineParallel:
    """This rank's stage of ``model`` in its replica's pipeline, averaged over its stage's replicas.

    Every rank of the run builds it (process groups are created by all ranks together), from the same
    ``model`` (same initial parameters on every rank: seed it, or load one checkpoint)."""

    def __init__(self, model: nn.Sequential, *, layout: PipelineLayout, rank: int, device: torch.device,
                 plans: ScheduledStagePlans, microbatches: int, loss_fn: Callable[..., torch.Tensor],
                 optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 on_step: Callable[[int, int, float, float], None] | None = None) -> None:
        """``on_step(step, samples, loss, step_s)`` runs after each step (the context's report)."""
        if not isinstance(model, nn.Sequential):
            raise UsageError(f"a pipeline run splits an nn.Sequential into stages, got {type(model).__name__}; "
                             "write the model as nn.Sequential(layer, layer, ...)")
        self.model, self.layout, self.rank, self.device = model, layout, rank, device
        self.stage, self.replica = layout.stage_of(rank), layout.replica_of(rank)
        self.plans = plans
        # new_group is collective over the whole run: every rank creates every group, in the same order
        self.replica_group = _group_of(layout.replica_groups(), rank)
        self.stage_group = _group_of(layout.stage_groups(), rank) if layout.replicas > 1 else None
        self.first, self.last = self.stage == 0, self.stage == layout.stages - 1
        self.last_rank = layout.rank_at(layout.stages - 1, self.replica)  # global rank holding the loss
        self.step_index = 0
        plan = plans.plan_for(0)
        if plan.stage_rank is not None or plan.num_stages != layout.stages:
            raise ConfigError(f"{plan.schedule or 'the plan'} places {plan.num_stages} stages on ranks "
                              f"{plan.stage_rank}; a pipeline run under PDMLTrainer runs one stage per worker "
                              f"({layout.stages}): keep pipeline.osprey.plans 'full-backward'")
        self.stages = pipeline_stages(model, plan, self.stage, device, group=self.replica_group)
        self.runtime = TorchPlanRuntime(self.stages, microbatches, loss_fn=loss_fn)
        self.timer = ActionTimer(self.stages) if plans.adaptive else None
        self.params = [p for s in self.stages for p in s.submod.parameters() if p.requires_grad]
        # a stage of parameter-free layers (an activation alone) has nothing to optimize
        self.optimizer = optimizer(self.params) if self.params else None
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=False)
        self.on_step = on_step
        self.last_compute_s = 0.0
        """Seconds of the newest step inside torch's runtime (its waits on the other stages included)."""
        self.last_wait_s = 0.0
        """Seconds of the newest step's gradient all-reduce and loss broadcast."""

    def step(self, inputs: torch.Tensor | None, target: torch.Tensor | None) -> float:
        """One training step of this replica's share of the global batch: ``inputs`` are read on the first
        stage, ``target`` on the last (other ranks may pass None). Returns the global batch's mean loss
        (the mean of each replica's mean loss over its micro-batches), the same on every rank."""
        if self.first and inputs is None or self.last and target is None:
            raise UsageError(f"stage {self.stage} of {self.layout.stages} needs "
                             f"{'the inputs' if self.first else 'the targets'} of its replica's batch: pass them "
                             "(every rank may pass both)")
        start = time.perf_counter()
        plan = self.plans.plan_for(self.step_index)
        self.runtime.load(plan)
        t0 = time.perf_counter()
        losses: list[torch.Tensor] = []
        args = (inputs.to(self.device),) if self.first and inputs is not None else ()
        self.runtime.step(*args, target=target.to(self.device) if self.last and target is not None else None,
                          losses=losses)
        t1 = time.perf_counter()
        if self.timer is not None:
            self.plans.observe(self.step_index, self.timer.take())
        loss = torch.stack([x.detach().float() for x in losses]).mean() if self.last else torch.zeros(())
        # One flat bucket (gradients, then the loss), summed over this stage's replicas and divided by them.
        bucket = torch.cat([p.grad.reshape(-1) for p in self.params] + [loss.reshape(1).to(self.device)])
        if self.stage_group is not None:
            dist.all_reduce(bucket, group=self.stage_group)
            bucket /= self.layout.replicas
        offset = 0
        for p in self.params:
            p.grad.copy_(bucket[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        mean_loss = bucket[-1:].clone()
        if self.layout.stages > 1:  # the last stage has it: every stage of the replica gets it
            dist.broadcast(mean_loss, src=self.last_rank, group=self.replica_group)
        self.last_wait_s = time.perf_counter() - t1
        self.last_compute_s = t1 - t0
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)
        self.step_index += 1
        loss_value = float(mean_loss.item())
        if self.on_step is not None:
            batch = target if target is not None else inputs
            self.on_step(self.step_index - 1, len(batch) if batch is not None else 0, loss_value,
                         time.perf_counter() - start)
        return loss_value

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole model's state (every stage's parameters and buffers, as ``model.state_dict()`` names
        them) on rank 0, gathered from replica 0's stages; None on the other ranks. A collective: every
        rank calls it. Load it into the unsplit model with ``model.load_state_dict``."""
        mine: dict[str, torch.Tensor] = {}
        if self.replica == 0:
            held = {id(t) for s in self.stages for t in [*s.submod.parameters(), *s.submod.buffers()]}
            mine = {k: v.detach().cpu().clone() for k, v in self.model.state_dict(keep_vars=True).items()
                    if id(v) in held}
        gathered: list[Any] = [None] * self.layout.world_size if self.rank == 0 else []
        dist.gather_object(mine, gathered if self.rank == 0 else None, dst=0)
        if self.rank != 0:
            return None
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        for part in gathered:
            state.update(part or {})
        return state


def _group_of(groups: Sequence[list[int]], rank: int) -> Any:
    """Create every group (all ranks must, in the same order) and return the one holding ``rank``."""
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


class PipelineContext:
    """A pipeline run's per-worker state: where this rank sits, its pipeline, its reports."""

    def __init__(self, config: PDMLConfig, rank: int, world_size: int, device: torch.device,
                 client: SchedulerClient | None, accelerator_type: str = "CPU") -> None:
        if config.pipeline is None or config.pipeline.stages is None:
            raise ConfigError("a pipeline run needs PDMLConfig(pipeline=PipelineConfig(stages=S, ...))")
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.client, self.accelerator_type = client, accelerator_type
        self.layout = PipelineLayout.build(world_size, config.pipeline.stages)
        self.schedule = config.pipeline.schedule
        self.stage, self.replica = self.layout.stage_of(rank), self.layout.replica_of(rank)
        self.report_fn: Any = None  # ray.train.report, set by PDMLTrainer (this module stays free of Ray)
        self.pipeline: PipelineParallel | None = None
        self._reports: list[WorkerReport] = []

    def prepare(self, model: nn.Sequential, *, microbatches: int, loss_fn: Callable[..., torch.Tensor],
                optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> PipelineParallel:
        """This rank's stage of ``model`` in a pipeline of ``microbatches`` micro-batches per step,
        ``loss_fn(output, target)`` on the last stage, ``optimizer(params)`` over this stage's parameters.
        Call once, on every rank."""
        if self.pipeline is not None:
            raise UsageError("ctx.prepare was already called: prepare one pipeline per training run")
        plans = ScheduledStagePlans(self.client, rank=self.rank, stages=self.layout.stages,
                                    microbatches=microbatches, device=self.device,
                                    adaptive=self.schedule not in STATIC_SCHEDULES)
        self.pipeline = PipelineParallel(model, layout=self.layout, rank=self.rank, device=self.device, plans=plans,
                                         microbatches=microbatches, loss_fn=loss_fn, optimizer=optimizer,
                                         on_step=self._queue_report)
        return self.pipeline

    def _queue_report(self, step: int, samples: int, loss: float, step_s: float) -> None:
        """A step is done: queue this worker's report (sent every ``decision_interval`` steps)."""
        assert self.pipeline is not None
        self._reports.append(WorkerReport(
            worker_id=self.rank, step=step, samples=samples, compute_s=self.pipeline.last_compute_s,
            wait_s=self.pipeline.last_wait_s, step_s=step_s, loss=loss, accelerator_type=self.accelerator_type))
        if len(self._reports) >= self.config.decision_interval:
            self.flush()

    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        """``ray.train.report(metrics, checkpoint=...)`` with pdml-ray's figures added (``pdml/`` keys)."""
        if self.report_fn is None:
            raise UsageError("ctx.report needs the Ray Train worker PDMLTrainer launches (it calls ray.train.report)")
        pipe = self.pipeline
        pdml = {"pdml/step": float(pipe.step_index if pipe else 0),
                "pdml/pipeline_plan_changes": float(pipe.plans.plan_changes if pipe else 0),
                # rank 0's steps that ran the newest plan again because the scheduler's answer was late (others: 0)
                "pdml/pipeline_plan_fallbacks_total": float(pipe.plans.fallbacks if pipe else 0),
                "pdml/pipeline_stages": float(self.layout.stages), "pdml/pipeline_replicas": float(self.layout.replicas)}
        self.report_fn({**pdml, **metrics}, checkpoint=checkpoint)  # the user's keys win

    def flush(self) -> None:
        """Send the reports still buffered (fire-and-forget)."""
        if self.client is not None and self._reports:
            self.client.report(self._reports)
        self._reports = []
