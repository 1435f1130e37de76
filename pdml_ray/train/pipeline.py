"""Pipeline x data parallelism inside a Ray Train loop: torch's pipeline runtime per replica, gradients
averaged per stage.

A ``PDMLTrainer`` run with ``PDMLConfig.pipeline`` set runs its ``W`` workers as ``pipeline.stages``
stages x ``W / stages`` data-parallel replicas (``pipeline_layout``: rank r is stage r % S of replica
r // S). In the loop:

    ctx = pdml_ray.train.get_pipeline_context()
    pipe = ctx.prepare(model, microbatches=4, loss_fn=nn.functional.mse_loss,
                       optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    for step in range(ctx.start_step, steps):  # 0, or where a resumed run's checkpoint stood
        x, y = batch_of(ctx.replica)          # this replica's share of the global batch
        loss = pipe.step(x, y)                # the global batch's mean loss, on every rank

A checkpoint holds the whole model and every stage's optimizer state, both gathered on rank 0
(``pipe.state_dict()``, ``pipe.optimizer_state_dict()``: collectives; the user saves them), and pdml-ray's
state, which ``ctx.report`` adds on rank 0 (the scheduler's, and the steps trained). On a restart
``PDMLTrainer`` restores pdml-ray's state before the loop (``ctx.start_step``), and the loop loads the
rest on every rank (``pipe.load_state_dict(model_state, optimizer_state)``). Gathered on rank 0 rather
than written per stage: the checkpoint stays one rank's directory, saved as a data-parallel loop saves
it (Ray Train would merge several ranks' directories, but every stage's replica 0 would then report one,
and a model saved in shards no longer loads into the unsplit model); a model too large for rank 0's
memory would want per-stage files.

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
installs the context (``installed_context.set_context``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pdml_ray.client import PlansAhead, SchedulerClient
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import WorkerReport
from pdml_ray.errors import ConfigError, PDMLError, SchedulerUnavailableError, StateError, UsageError
from pdml_ray.pipeline.plan import Plan
from pdml_ray.pipeline.registry import STATIC_SCHEDULES
from pdml_ray.pipeline.torch_exec import TorchPlanRuntime, pipeline_stages
from pdml_ray.state_format import check_scheduler_decisions, write_state
from pdml_ray.train.pipeline_latency import ActionTimer, LatencyRow, stage_latencies
from pdml_ray.train.pipeline_layout import PipelineLayout
from pdml_ray.train.saved_state import SCHEDULER_STATE_FILE, open_saved_state


class ScheduledStagePlans:
    """Every step's plan from the scheduler's ``pipeline`` axis: rank 0 asks one step ahead, and
    broadcasts a plan to every rank of the run when it differs from the one they run. The scheduler
    stamps a new version on every step's plan, a static schedule's too, so what travels every step is
    one integer (the count of distinct plans) and the plan itself only when it changed."""

    def __init__(self, client: SchedulerClient | None, *, rank: int, stages: int, microbatches: int,
                 device: torch.device, adaptive: bool = False, replan_threshold: float = 0.0) -> None:
        """``adaptive``: the schedule plans from measured latencies (osprey, auto), which ``observe`` sends;
        ``replan_threshold`` > 0: a step that ran further than that from its plan's prediction has the
        next step's plan asked for again (``OspreyConfig.replan_on_shift``, ``pdml_ray.pipeline.prediction``)."""
        self.rank, self.device, self.adaptive = rank, device, adaptive
        self.shape = {"stages": stages, "replicas": 1, "microbatches": microbatches}  # every replica runs it
        self.plan: Plan | None = None
        """The plan every rank runs, as rank 0 broadcast it."""
        self.plan_changes = 0
        """Distinct plans run so far (a static schedule: 1); every rank counts the same."""
        self._newest: Plan | None = None  # rank 0: the newest decision's plan ...
        self._newest_count = 0  # ... and the count of distinct plans including it
        self.ahead: PlansAhead | None = None
        """Rank 0: the fetch one step ahead, and its counts (``fallbacks``, ``replans``)."""
        if rank == 0:
            if client is None:
                raise UsageError("rank 0 of a pipeline run plans through the run's scheduler: give it a SchedulerClient")
            client.set_shape("pipeline", self.shape)
            self.ahead = PlansAhead(client, replan_threshold)

    @property
    def fallbacks(self) -> int:
        """Rank 0: steps that ran the newest plan again because the scheduler's answer did not come."""
        return self.ahead.fallbacks if self.ahead is not None else 0

    @property
    def replans(self) -> int:
        """Rank 0: steps whose plan was asked for again after the step before ran far from its prediction."""
        return self.ahead.replans if self.ahead is not None else 0

    def plan_for(self, step: int) -> Plan:
        """Step ``step``'s plan, on every rank (a collective: every rank calls it for every step)."""
        if self.ahead is not None:
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
        if self.ahead is not None:
            self.ahead.observe(step, stage_latencies(gathered))

    def _fetch(self, step: int) -> None:
        """Rank 0: take step ``step``'s decision (asked for a step ago) and ask for step ``step + 1``'s."""
        assert self.ahead is not None
        decision = self.ahead.take(step)
        if decision is not None and decision.plan != self._newest:
            self._newest, self._newest_count = decision.plan, self._newest_count + 1


class PipelineParallel:
    """This rank's stage of ``model`` in its replica's pipeline, averaged over its stage's replicas.

    Every rank of the run builds it (process groups are created by all ranks together), from the same
    ``model`` (same initial parameters on every rank: seed it, or load one checkpoint)."""

    def __init__(self, model: nn.Sequential, *, layout: PipelineLayout, rank: int, device: torch.device,
                 plans: ScheduledStagePlans, microbatches: int, loss_fn: Callable[..., torch.Tensor],
                 optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 on_step: Callable[[int, int, float, float], None] | None = None, start_step: int = 0) -> None:
        """``on_step(step, samples, loss, step_s)`` runs after each step (the context's report); ``start_step``:
        the first step's number (a resumed run's, ``PipelineContext.start_step``)."""
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
        self.step_index = start_step
        plan = plans.plan_for(start_step)
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

    def optimizer_state_dict(self) -> dict[str, list[dict[str, Any] | None]] | None:
        """Every stage's optimizer state on rank 0, gathered from replica 0's stages as ``state_dict`` gathers
        the model (a stage's replicas step alike: their gradients are averaged first), tensors on the CPU:
        ``{"stages": [stage 0's optimizer.state_dict(), ...]}``, None for a stage without parameters; None
        on the other ranks. A collective: every rank calls it. Save it beside ``state_dict()`` and give both
        to ``load_state_dict`` when the run resumes."""
        mine = _on_cpu(self.optimizer.state_dict()) if self.replica == 0 and self.optimizer is not None else None
        gathered: list[Any] = [None] * self.layout.world_size if self.rank == 0 else []
        dist.gather_object(mine, gathered if self.rank == 0 else None, dst=0)
        if self.rank != 0:
            return None
        return {"stages": [gathered[self.layout.rank_at(k, 0)] for k in range(self.layout.stages)]}

    def load_state_dict(self, model_state: Mapping[str, torch.Tensor],
                        optimizer_state: Mapping[str, Any] | None = None) -> None:
        """Restore what ``state_dict()`` and ``optimizer_state_dict()`` saved, on every rank (each reads the
        checkpoint; not a collective), before the first step: the whole model's state (every rank holds the
        whole ``nn.Sequential``, its stage's layers included) and this stage's optimizer state (momentum,
        Adam's moments and step). StateError, naming the fix, if they do not fit this run (an optimizer
        state cut for another stage count is refused before the model is touched)."""
        saved = None
        if optimizer_state is not None:
            stages = optimizer_state.get("stages") if isinstance(optimizer_state, Mapping) else None
            if not isinstance(stages, list):
                raise StateError("the optimizer state must be what pipe.optimizer_state_dict() returns on rank 0 "
                                 f"({{'stages': [...]}}), got {type(optimizer_state).__name__}: save that one")
            if len(stages) != self.layout.stages:
                raise StateError(f"the checkpoint's optimizer state holds {len(stages)} stages' states and this run "
                                 f"has {self.layout.stages} stages (their parameters are cut by the stage count): "
                                 f"resume with pipeline.stages={len(stages)}, or load the model alone "
                                 "(optimizer_state=None)")
            saved = stages[self.stage]
            if (saved is None) != (self.optimizer is None):
                raise StateError(f"the checkpoint's optimizer state of stage {self.stage} is "
                                 f"{'empty' if saved is None else 'there'}, but this stage has "
                                 f"{'parameters' if self.optimizer is not None else 'none'}: resume with the same "
                                 "model and pipeline.stages")
        try:
            self.model.load_state_dict(model_state)
        except (RuntimeError, TypeError, AttributeError) as e:
            raise StateError(f"the checkpoint's model state does not fit the model given to ctx.prepare: {e}. "
                             "Resume with the same nn.Sequential") from None
        if self.optimizer is not None and saved is not None:
            try:
                self.optimizer.load_state_dict(saved)
            except (ValueError, KeyError, TypeError) as e:
                raise StateError(f"the checkpoint's optimizer state of stage {self.stage} does not fit its "
                                 f"optimizer: {e}. Resume with the same optimizer factory, model and "
                                 "pipeline.stages") from None


def _on_cpu(x: Any) -> Any:
    """``x`` (an optimizer's state dict) with every tensor a CPU copy of its own: rank 0 keeps no reference
    to a live buffer, and unpickles no other rank's device."""
    if torch.is_tensor(x):
        return x.detach().cpu().clone()
    if isinstance(x, dict):
        return {k: _on_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_on_cpu(v) for v in x)
    return x


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
        self.start_step = 0
        """The first step this run trains: 0, or the steps a resumed run's checkpoint had trained."""
        self.pipeline: PipelineParallel | None = None
        self._reports: list[WorkerReport] = []

    def prepare(self, model: nn.Sequential, *, microbatches: int, loss_fn: Callable[..., torch.Tensor],
                optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> PipelineParallel:
        """This rank's stage of ``model`` in a pipeline of ``microbatches`` micro-batches per step,
        ``loss_fn(output, target)`` on the last stage, ``optimizer(params)`` over this stage's parameters.
        Call once, on every rank."""
        if self.pipeline is not None:
            raise UsageError("ctx.prepare was already called: prepare one pipeline per training run")
        assert self.config.pipeline is not None  # a pipeline run's config (checked where the context is built)
        osprey = self.config.pipeline.osprey
        plans = ScheduledStagePlans(self.client, rank=self.rank, stages=self.layout.stages,
                                    microbatches=microbatches, device=self.device,
                                    adaptive=self.schedule not in STATIC_SCHEDULES,
                                    replan_threshold=osprey.jump_threshold if osprey.replan_on_shift else 0.0)
        self.pipeline = PipelineParallel(model, layout=self.layout, rank=self.rank, device=self.device, plans=plans,
                                         microbatches=microbatches, loss_fn=loss_fn, optimizer=optimizer,
                                         on_step=self._queue_report, start_step=self.start_step)
        return self.pipeline

    def _queue_report(self, step: int, samples: int, loss: float, step_s: float) -> None:
        """A step is done: queue this worker's report (sent every ``decision_interval`` steps)."""
        assert self.pipeline is not None
        self._reports.append(WorkerReport(
            worker_id=self.rank, step=step, samples=samples, compute_s=self.pipeline.last_compute_s,
            wait_s=self.pipeline.last_wait_s, step_s=step_s, loss=loss, accelerator_type=self.accelerator_type))
        if len(self._reports) >= self.config.decision_interval:
            self._send_reports(flush=False)

    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        """``ray.train.report(metrics, checkpoint=...)`` with pdml-ray's figures added (``pdml/`` keys) and,
        with a checkpoint (``ray.train.Checkpoint.from_directory(d)``, on rank 0), pdml-ray's state in it
        (``save_scheduler_state``): a run resumed from it (``FailureConfig`` restart, or a rerun under the
        same ``RunConfig(name, storage_path)``) continues at ``ctx.start_step`` with the scheduler's state of
        then, which ``PDMLTrainer`` restores before the loop; the loop restores its model and optimizers
        (``pipe.load_state_dict``)."""
        if self.report_fn is None:
            raise UsageError("ctx.report needs the Ray Train worker PDMLTrainer launches (it calls ray.train.report)")
        if checkpoint is not None and self.rank == 0:
            directory = getattr(checkpoint, "path", None)
            if directory is None or not os.path.isdir(directory):
                raise UsageError("ctx.report needs a checkpoint made from a local directory "
                                 "(ray.train.Checkpoint.from_directory(d)) to add pdml-ray's state to it")
            self.save_scheduler_state(directory)
        pipe = self.pipeline
        pdml = {"pdml/step": float(pipe.step_index if pipe else 0),
                "pdml/pipeline_plan_changes": float(pipe.plans.plan_changes if pipe else 0),
                # rank 0's steps that ran the newest plan again because the scheduler's answer was late (others: 0)
                "pdml/pipeline_plan_fallbacks_total": float(pipe.plans.fallbacks if pipe else 0),
                "pdml/pipeline_stages": float(self.layout.stages), "pdml/pipeline_replicas": float(self.layout.replicas)}
        self.report_fn({**pdml, **metrics}, checkpoint=checkpoint)  # the user's keys win

    def save_scheduler_state(self, directory: str) -> bool:
        """Rank 0: write the scheduler's state (its ``pipeline`` axis: the schedule's estimates and counters,
        and the run's report history) and the steps trained into a checkpoint directory, beside the model,
        as data (``pdml_ray.state_format``: JSON plus arrays, never a pickle), in the file a data-parallel
        run's checkpoint holds it in. Other ranks do nothing. Returns whether a file was written."""
        if self.rank != 0 or self.client is None:
            return False
        self.flush()  # this run's reports in before the state is taken
        step = self.pipeline.step_index if self.pipeline is not None else self.start_step
        write_state(os.path.join(directory, SCHEDULER_STATE_FILE),
                    {"state": self.client.call("state_dict"), "global_step": step, "stages": self.layout.stages})
        return True

    def load_scheduler_state(self, directory: str) -> bool:
        """Restore what ``save_scheduler_state`` wrote, before ``prepare`` (``PDMLTrainer`` calls it before the
        loop with ``ray.train.get_checkpoint()``'s directory): rank 0 loads it into the scheduler, every rank
        sets ``start_step``. Returns False if the checkpoint has no pdml-ray state. Every rank reads and
        checks the whole file first: one it refuses raises the same StateError on every rank, and nothing
        changes."""
        if self.pipeline is not None:
            raise UsageError("load_scheduler_state restores where a run resumes: call it before ctx.prepare")
        found = open_saved_state(directory, "a pipeline run")
        if found is None:
            return False
        path, saved = found
        try:
            step, stages = saved["global_step"], saved["stages"]
            if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
                raise StateError(f"its global_step must be an integer >= 0, got {step!r:.40}")
            if stages != self.layout.stages:
                raise StateError(f"it was written by a run of {stages!r:.20} stages and this one has "
                                 f"{self.layout.stages} (set pipeline.stages={stages!r:.20})")
            check_scheduler_decisions(saved["state"], self.config, self.world_size)
        except PDMLError as e:
            raise StateError(f"{path} holds a pdml-ray state this pipeline run refuses: {e}. Resume from another "
                             "checkpoint, or with the config that wrote it") from None
        if self.rank == 0 and self.client is not None:
            self.client.call("load_state_dict", saved["state"])
        self.start_step = step
        return True

    def flush(self) -> None:
        """Send the reports still buffered and wait for them to be in (the end of training, a checkpoint)."""
        self._send_reports(flush=True)

    def _send_reports(self, flush: bool) -> None:
        """The buffered reports to the scheduler: fire-and-forget, or with ``flush`` waiting for them."""
        if self.client is not None and (self._reports or flush):  # a flush also sends what the client held back
            self.client.report(self._reports, flush=flush)
        self._reports = []
