"""The in-loop context: what a Ray Train worker's loop calls to train with pdml-ray priorities.

    ctx = pdml_ray.train.get_context()
    model = ctx.prepare_model(model)
    for epoch in range(epochs):
        for batch in ctx.epoch(epoch, num_samples):        # this worker's indices for the step
            x, y = X[batch.indices], Y[batch.indices]
            with ctx.step(batch) as step:                   # timed; reports telemetry on exit
                per_sample = loss_fn(model(x), y)           # reduction="none", shape (b_i,)
                step.loss(per_sample).backward()            # importance-weighted mean
            optimizer.step(); optimizer.zero_grad()         # gradients are already combined

During backward each rank's gradient is multiplied by its weight b_i / B and SUM all-reduced (DDP's
communication hook; FSDP2: a loss scale, see ``wrappers``), so every rank holds the mean gradient
over the global batch when the step block ends. Decisions switch at step
boundaries (every ``decision_interval`` steps): rank 0 polls the scheduler without blocking and
shares what it has in one collective (which also gathers the group's reports, ``report_via``), so
all ranks adopt a new decision at the same step.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pdml_ray.batching import step_slices
from pdml_ray.client import SchedulerClient
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, NodeDecision, SampleDecision, SamplePlan, StepBundle, WorkerReport
from pdml_ray.errors import ConfigError, UsageError
from pdml_ray.priority.sample_modes import irreducible_problem
from pdml_ray.priority.selective_backprop import BackpropSelector
from pdml_ray.state_format import check_decision
from pdml_ray.train.boundary_reports import BoundaryReports
from pdml_ray.train.boundary_spacing import next_stretch, widest_interval
from pdml_ray.train.result_metrics import pdml_metrics
from pdml_ray.train.saved_state import SavedRunState, read_saved_run, write_saved_run
from pdml_ray.train.nonfinite import NonFiniteCounts
from pdml_ray.train.step import StepBatch, StepScope, _Untimed
from pdml_ray.train.timing import make_timer
from pdml_ray.train.wrappers import (GradientCombiner, Sync, check_supported, combiner_for, describe, is_fsdp2,
                                     prepare_batchnorm)

log = logging.getLogger(__name__)


class PDMLContext:
    """Per-worker state: current decision, gradient combination, telemetry, decision switching."""

    def __init__(self, config: PDMLConfig, rank: int, world_size: int, device: torch.device,
                 accelerator_type: str, client: SchedulerClient | None):
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.accelerator_type = accelerator_type
        speeds = config.node.emulated_speeds
        self.speed = speeds[rank] if speeds else 1.0
        self.client = client
        self.decision = NodeDecision.uniform(config.node.batch, world_size)
        self.versions: dict[str, int] = {"node": self.decision.version}  # newest adopted version per deriver
        self.adopted: list[tuple[int, int, tuple[int, ...]]] = []  # (step, version, batch_sizes)
        self.stale_bundles = 0  # bundles that arrived after the step they were for (dropped)
        self.global_step = 0
        self.start_epoch = 0  # the epoch a resumed run continues in (restored from a checkpoint)
        self._position = (0, 0)  # (epoch, offset) just after the last finished step: a checkpoint resumes there
        self._resume: tuple[int, int] | None = None  # (epoch, offset) to start the next epoch() call from
        # Decisions take effect lead_steps after the boundary that adopts them (0 with ctx.epoch; a
        # DataLoader's batch sampler needs them known as far ahead as the loader prefetches).
        self.lead_steps = 0
        self._upcoming: list[NodeDecision] = []  # adopted, effective at a later step (in step order)
        self._horizon = 0  # the batch sizes of every step before this one are settled
        self._sampled: dict[int, StepBatch] = {}  # steps the batch sampler produced, by global step
        self._sampler_step: int | None = None  # the next global step the batch sampler produces
        self.report_fn: Any = None  # ray.train.report, set by PDMLTrainer (this module stays free of Ray)
        # PDMLTrainer(datasets=...)'s datasets by name (``ray_data.DatasetRows``; this module stays free of Ray)
        self.datasets: dict[str, Any] = {}
        self.elastic = False  # PDMLTrainer(num_workers=(min, max)): a checkpoint may hold another worker count
        self._startup_boundary = False  # a boundary at the first step after an elastic resize (load_scheduler_state)
        self._next_boundary = 0  # the step of the next boundary (``boundary_spacing`` may skip some in between)
        self.boundary_stretch = 1
        """Decision intervals to the next boundary, as rank 0 chose at the last one (``boundary_spacing``)."""
        self.boundaries = 0  # boundaries this worker ran
        self._boundary_mark: tuple[int, float] | None = None  # rank 0: (step, perf_counter) of the last boundary
        self.overhead_s = 0.0  # this worker's pdml-ray bookkeeping time (seconds)
        self._params: list[torch.nn.Parameter] = []
        self._combiner: GradientCombiner | None = None
        sp = config.sample_priority  # selective-backprop: the worker's own loss percentile (train/step.py)
        self.backprop_selector = (BackpropSelector(sp.backprop_share, sp.percentile_window)
                                  if sp is not None and sp.mode == "selective-backprop" else None)
        self._timer = make_timer(device)  # compute time per step (CUDA events on a GPU: a step late)
        self._untimed: dict[int, _Untimed] = {}  # finished steps whose compute time is not known yet
        self._open_scope: StepScope | None = None  # the step block being run (DDP's hook ends its compute)
        self._reports: list[WorkerReport] = []
        self.gathers_reports = config.report_route(world_size) == "boundary"
        """Reports ride in the boundary's collective to rank 0 (``PDMLConfig.report_via``; the same on
        every rank, as the collective needs)."""
        self._plans: dict[int, SamplePlan] = {}
        self._axis_decisions: dict[str, list[Any]] = {}  # adopted decisions of other axes (p3), in step order
        self._num_samples: int | None = None
        self._irreducible_count: int | None = None  # rho-loss: how many irreducible losses were set
        self._step_t0 = time.perf_counter()
        self._step_overhead = 0.0
        self.nonfinite = NonFiniteCounts(world_size, config.node.max_consecutive_nonfinite)
        """Steps excluded per worker for a NaN or infinite loss, dropped steps (``step.py``)."""
        self._last_report: WorkerReport | None = None  # the newest timed step's report (``pdml_metrics``)
        if client is not None:
            client.register(rank, accelerator_type)
        self._boundary_reports: BoundaryReports | None = None
        if self.gathers_reports:  # rank 0 needs every rank's type for the rows it gathers (a barrier too)
            types: list[Any] = [None] * world_size
            dist.all_gather_object(types, accelerator_type)
            self._boundary_reports = BoundaryReports(rank, world_size, device, widest_interval(config), types)
        elif world_size > 1:
            dist.barrier()  # every worker registered before rank 0 fetches the first decision

    # -- model ---------------------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, sync: Sync = "auto") -> torch.nn.Module:
        """Make every rank's gradient carry its weight ``b_i / B`` (see ``wrappers``). Call once.

        A ``DistributedDataParallel`` model gets a weighting communication hook, a ``fully_shard``
        (FSDP2) model a loss scale, and a plain module is moved to the device and wrapped in DDP (as
        ``ray.train.torch.prepare_model`` does, rank 0's parameters broadcast) with the hook. The
        returned model is the wrapper; ``.module`` is yours, as with DDP. BatchNorm layers get a batch
        floor or SyncBatchNorm (``node_priority.batchnorm``, see ``wrappers``).
        """
        if self._combiner is not None:
            raise UsageError("ctx.prepare_model was already called: prepare one model per training run")
        check_supported(model, sync)
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel) and not is_fsdp2(model):
            model = model.to(self.device)
        model, batch_floor = prepare_batchnorm(model, self.config.node, self.device)
        model, self._combiner = combiner_for(model, sync, self.world_size, self.device)
        self._combiner.on_compute_end = self._compute_ended  # DDP's last bucket: backward's compute is done
        self._combiner.comm_timer = self._timer  # collectives inside forward and backward are not compute
        if batch_floor and self.client is not None and self.rank == 0:  # BatchNorm: every decision keeps it
            self.client.set_shape("node", {"min_batch": batch_floor})
        self._params = [p for p in model.parameters() if p.requires_grad]
        if self.rank == 0:
            log.info("pdml-ray gradient weights: %s", describe(self._combiner))
        return model

    def _compute_ended(self) -> None:
        if self._open_scope is not None:
            self._open_scope.compute_ended()

    def measure_comm_s(self, repeats: int = 10) -> float:
        """Median seconds of the gradient all-reduce alone (after a barrier, so no one is waiting)."""
        numel = sum(p.numel() for p in self._params)
        if self.world_size == 1 or numel == 0:
            return 0.0
        flat = torch.zeros(numel, device=self.device)
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            if flat.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def record_measurement(self, name: str, value: float) -> None:
        """Store a named measurement with the scheduler (fire-and-forget), e.g. for a benchmark."""
        if self.client is not None:
            self.client.record_measurement(name, value)

    def set_irreducible_losses(self, losses: Any) -> None:
        """rho-loss (``sample_priority.mode='rho-loss'``): every training sample's irreducible loss, float
        (N,), finite, >= 0, sample i at index i of the data set the epochs draw from; the table then ranks
        sample i by its loss minus ``losses[i]``. Compute them with ``pdml_ray.train.irreducible`` (a
        holdout, or folds cross-fitted on the training set) inside the loop, so their cost is the run's,
        or before ``fit`` and pass them in ``train_loop_config``. Call it on every rank, before or after
        the first epoch (rank 0 sends them; blocking); a resumed run's table has them from its checkpoint
        and takes them again. ConfigError in another mode, or where N is not the data set's size."""
        sp = self.config.sample_priority
        if sp is None or sp.mode != "rho-loss":
            raise ConfigError("set_irreducible_losses needs PDMLConfig(sample_priority=SamplePriorityConfig("
                              f"mode='rho-loss')); this run's sample priorities are {sp.mode if sp else 'off'!r}")
        il = np.asarray(losses.detach().cpu() if isinstance(losses, torch.Tensor) else losses, dtype=np.float64)
        problem = irreducible_problem(il, self._num_samples)
        if problem is not None:
            raise ConfigError(f"set_irreducible_losses: {problem}")
        self._irreducible_count = il.size
        if self.rank == 0 and self.client is not None:
            self.client.set_irreducible_losses(self.global_step, il)

    def observe(self, axis: str, step: int, rows: list[tuple]) -> None:
        """Rank 0: one step's telemetry for ``axis`` beyond worker reports, fire-and-forget (P3's link,
        agreed by every rank first, for the ``p3`` axis)."""
        if self.rank == 0 and self.client is not None:
            self.client.observe(axis, step, rows)

    def axis_decision(self, axis: str, step: int) -> Any:
        """The newest adopted decision of ``axis`` (besides node and sample: ``p3``) in force at ``step``, or
        None; the same on every rank (adopted at the same boundaries). Older ones are forgotten."""
        adopted = self._axis_decisions.get(axis, [])
        while len(adopted) > 1 and adopted[1].effective_step <= step:
            adopted.pop(0)
        return adopted[0] if adopted and adopted[0].effective_step <= step else None

    # -- steps ---------------------------------------------------------------------------------
    def epoch(self, epoch: int, num_samples: int) -> Iterator[StepBatch]:
        """This worker's batches for one epoch.

        Uniform sampling (the default): a permutation seeded by (seed, epoch), cut per step into
        contiguous chunks of the current batch sizes: every sample is used exactly once per epoch.
        Sample priorities: an epoch is ceil(N / B) steps of B draws from the priority distribution.
        """
        if self._sampler_step is not None:
            raise UsageError("this run draws its batches through ctx.batch_sampler: use it for every epoch, "
                             "not ctx.epoch as well")
        for batch in self._steps(epoch, num_samples, lambda step: self._begin_step()):
            yield batch

    def batch_sampler(self, epoch: int, num_samples: int, lead_steps: int = 8) -> "StepBatchSampler":
        """This worker's batches for one epoch as a ``torch.utils.data.Sampler`` of index lists, for a
        ``DataLoader(dataset, batch_sampler=ctx.batch_sampler(epoch, len(dataset)), num_workers=...)``;
        train with ``with ctx.step() as step:`` (no argument: the step the sampler produced).

        The same batches as ``epoch()``, computed ahead of training: a DataLoader iterates its sampler
        up to ``num_workers x prefetch_factor`` batches early, in the main process. So decisions take
        effect ``lead_steps`` steps after the boundary that adopts them, on every rank alike, and the
        sampler never issues a collective or waits; it refuses to run further ahead than that (raise
        ``lead_steps`` to at least ``num_workers x prefetch_factor + 1``). Fix ``lead_steps`` before
        the first step; every rank must use the same value.
        """
        if lead_steps < 1:  # with 0 a decision adopted at a step's boundary would change a batch already cut
            raise ConfigError(f"lead_steps must be >= 1 (how far ahead the DataLoader may sample), got {lead_steps}")
        if lead_steps != self.lead_steps:
            if self._sampler_step is not None or self._upcoming:
                raise UsageError(f"lead_steps is {self.lead_steps} in this run (set by its first batch sampler, or "
                                 f"by the checkpoint it resumed, which holds decisions adopted for steps "
                                 f"{[d.effective_step for d in self._upcoming]}); keep it ({lead_steps} given): "
                                 "every rank must switch decisions at the same steps")
            self.lead_steps = lead_steps
            # at the start, or resuming: nothing adopted is pending, and the next boundary's decisions take
            # effect lead_steps after it, so every step before that runs on the current decision
            k = self.config.decision_interval
            self._horizon = max(-(-self.global_step // k) * k, self._next_boundary) + lead_steps
        if self._sampler_step is None:
            self._sampler_step = self.global_step
        return StepBatchSampler(self, epoch, num_samples)

    def iter_torch_batches(self, name: str, *, epoch: int, prefetch_batches: int = 1, dtypes: Any = None,
                           device: Any = "auto", collate_fn: Any = None, pin_memory: bool = False) -> Iterator[Any]:
        """This worker's batches of ``epoch`` from ``PDMLTrainer(datasets={name: ds})``, one per step, of
        its current batch size: Ray Data's ``iter_torch_batches`` (the same ``prefetch_batches``,
        ``dtypes``, ``device``, ``collate_fn``, ``pin_memory``) over the rows ``epoch()`` would give.
        Train each with ``with ctx.step() as step:`` (no argument). Decisions take effect
        ``prefetch_batches + 1`` steps after the boundary that adopts them (see ``batch_sampler``), so
        keep ``prefetch_batches`` the same for the whole run. See ``pdml_ray.train.ray_data``."""
        if name not in self.datasets:
            raise UsageError(f"no dataset {name!r}: PDMLTrainer(datasets=...) gave {sorted(self.datasets) or 'none'}; "
                             "pass PDMLTrainer(datasets={name: ray.data.Dataset}) as with TorchTrainer")
        return self.datasets[name].batches(self, epoch, prefetch_batches=prefetch_batches, dtypes=dtypes,
                                           device=device, collate_fn=collate_fn, pin_memory=pin_memory)

    def _steps(self, epoch: int, num_samples: int, before: Any) -> Iterator[StepBatch]:
        """The batches of one epoch from the current position; ``before(step)`` runs before each is cut
        (the step's boundary for ``epoch()``; a horizon check for the sampler, which runs ahead)."""
        self._set_num_samples(num_samples)
        start = 0
        if self._resume is not None and self._resume[0] == epoch:  # a resumed run: continue this epoch
            start, self._resume = self._resume[1], None
        step = self.global_step if self._sampler_step is None else self._sampler_step
        if self.config.sample_priority is None:
            perm = np.random.default_rng([self.config.seed, epoch]).permutation(num_samples)
            offset = start
            while offset < num_samples:
                before(step)
                decision = self.decision_at(step)
                chunks = step_slices(offset, decision.batch_sizes, num_samples)
                total = chunks[-1].stop - chunks[0].start
                mine = chunks[self.rank]
                yield StepBatch(step, epoch, perm[mine], (mine.stop - mine.start) / total, decision.version,
                                end_offset=offset + total)
                offset += total
                step += 1
        else:
            for k in range(start, math.ceil(num_samples / self.config.node.batch)):
                before(step)
                plan = self._plans.pop(step, None) or self._uniform_plan(step)
                sizes = [len(i) for i in plan.indices]
                # a plan that came through Ray holds read-only arrays, and torch warns on taking one in
                indices, weights = (np.require(a[self.rank], requirements="W") for a in (plan.indices, plan.weights))
                yield StepBatch(step, epoch, indices, sizes[self.rank] / sum(sizes),
                                self.decision_at(step).version, weights, end_offset=k + 1,
                                backprop_threshold=plan.backprop_threshold, feedback=plan.feedback,
                                uniform_weights=plan.uniform)
                step += 1

    def _epoch_end(self, num_samples: int) -> int:
        """A batch's ``end_offset`` once its epoch is done: samples (uniform), or steps (sample priorities)."""
        return num_samples if self.config.sample_priority is None else math.ceil(num_samples / self.config.node.batch)

    def _sampled_batches(self, epoch: int, num_samples: int) -> Iterator[StepBatch]:
        """What the batch sampler yields: ``_steps`` ahead of training, within the settled horizon."""
        assert self._sampler_step is not None

        def check(step: int) -> None:
            if step >= self._horizon:
                raise UsageError(f"the DataLoader asked for step {step}'s batch while training is at step "
                                 f"{self.global_step}: more than lead_steps={self.lead_steps} ahead. Pass "
                                 "ctx.batch_sampler(..., lead_steps=L) with L >= num_workers x prefetch_factor + 1")

        for batch in self._steps(epoch, num_samples, check):
            self._sampled[batch.step] = batch
            self._sampler_step = batch.step + 1
            yield batch

    def step(self, batch: StepBatch | None = None) -> StepScope:
        """The step block for ``batch`` (from ``epoch()``), or without one, for the step the batch sampler
        produced for this step (its boundary runs here)."""
        if batch is None:
            if self._sampler_step is None:
                raise UsageError("ctx.step() without a batch needs a DataLoader over ctx.batch_sampler(...); "
                                 "with ctx.epoch(...), pass the batch: ctx.step(batch)")
            self._begin_step()
            batch = self._sampled.pop(self.global_step, None)
            if batch is None:
                raise UsageError(f"the batch sampler has not produced step {self.global_step}: iterate the "
                                 "DataLoader built on ctx.batch_sampler once per ctx.step()")
        return StepScope(self, batch)

    def decision_at(self, step: int) -> NodeDecision:
        """The node decision in force at ``step`` (adopted decisions wait for their effective step)."""
        decision = self.decision
        for upcoming in self._upcoming:
            if upcoming.effective_step <= step:
                decision = upcoming
        return decision

    def _begin_step(self) -> None:
        """Start of a step: decisions effective from it take over; at a boundary, fetch new ones."""
        while self._upcoming and self._upcoming[0].effective_step <= self.global_step:
            self._in_force(self._upcoming.pop(0))
        if self._startup_boundary or (self.global_step % self.config.decision_interval == 0
                                      and self.global_step >= self._next_boundary):
            self._boundary()

    def _in_force(self, decision: NodeDecision) -> None:
        self.decision = decision
        self.adopted.append((self.global_step, decision.version, decision.batch_sizes))
        if self.rank == 0:
            log.info("step %d: adopted %s", self.global_step, decision)

    def _finish_step(self, batch: StepBatch, wait_s: float, per_sample: torch.Tensor | None, launch_s: float,
                     sleep_s: float, forward_only: int = 0) -> None:
        """The step is done: advance, and keep what its report needs until its compute time is known."""
        t0 = time.perf_counter()
        now = t0
        grad_norm = self._combiner.local_grad_norm() if self._combiner is not None else None
        self._untimed[batch.step] = _Untimed(batch, wait_s, now - self._step_t0,
                                             self._step_overhead, per_sample, launch_s, sleep_s, grad_norm,
                                             forward_only)
        self.global_step += 1
        self._position = (batch.epoch, batch.end_offset)
        if self._num_samples is not None and batch.end_offset >= self._epoch_end(self._num_samples):
            self._position = (batch.epoch + 1, 0)  # the epoch is done: a checkpoint resumes with the next one
        self._step_overhead = time.perf_counter() - t0
        self.overhead_s += self._step_overhead
        self._step_t0 = now

    # -- decisions -----------------------------------------------------------------------------
    def _set_num_samples(self, num_samples: int) -> None:
        if self._irreducible_count not in (None, num_samples):
            raise ConfigError(f"{self._irreducible_count} irreducible losses were set (set_irreducible_losses) for a "
                              f"data set of {num_samples} samples: give one per sample")
        if self._num_samples != num_samples:
            self._num_samples = num_samples
            if self.rank == 0 and self.client is not None and self.config.sample_priority is not None:
                self.client.set_dataset_size(num_samples)

    def _boundary(self) -> None:
        """At every ``decision_interval``-th step (or a whole number of them, ``boundary_spacing``): rank
        0 polls, everyone adopts together, reports go out. What the bundle brings takes effect
        ``lead_steps`` from now (at once with ``epoch()``).

        The ranks meet in a broadcast of what rank 0 polled (a flag, and the bundle only when one came)
        and of the intervals to the next boundary; with ``gathers_reports`` also in a gather of every
        rank's reports to rank 0, which sends them with its next request: one call per boundary for the
        group (``boundary_reports``)."""
        k, lead = self.config.decision_interval, self.lead_steps
        t0 = time.perf_counter()
        m = self._stretch_from(t0) if self.rank == 0 else 1
        bundle = None
        if self.rank == 0 and self.client is not None:
            # start-up (or the first step after an elastic resize): may wait briefly, the step has not begun
            first = self.global_step == 0 or self._startup_boundary
            bundle = self.client.poll(block_s=10.0 if first else 0.0)
            if first and bundle is None:
                self.client.request(self._boundary_for(self.global_step + lead), self.versions)
                bundle = self.client.poll(block_s=10.0)
            if bundle is not None and not bundle:
                bundle = None  # nothing new: skip the broadcast of the bundle itself
        gathered: list[tuple] = []
        reports, self._reports = self._reports, []
        if self.world_size > 1:
            # one tiny broadcast says whether anything came; the pickled bundle only travels when it did.
            # It is pdml-ray's: it counts as overhead, the wait for the last rank to finish its optimizer
            # step included (an upper bound on what the boundary costs). A close one: with a barrier timed
            # before it (bench hetero --quick --compute sleep, 2 loaded cores) every rank waited 2-7 ms in
            # the barrier, rank 0 too, the last to arrive (after its poll), so that wait was the
            # collective's own latency, not the step's imbalance.
            flag = torch.tensor([1 if bundle is not None else 0, m], dtype=torch.int32, device=self.device)
            dist.broadcast(flag, src=0)
            came, m = flag.tolist()
            if came:
                box = [bundle]
                dist.broadcast_object_list(box, src=0)
                bundle = box[0]
        if self._boundary_reports is not None:  # the group's reports to rank 0, for its next request
            gathered, reports = self._boundary_reports.exchange(reports)
        # reports go after the collectives: fire-and-forget, so no rank waits on another's submission
        if self.client is not None:
            self.client.report(reports)
        if bundle is not None:
            self._adopt(bundle)
        following = (self.global_step // k + m) * k  # the next boundary (a start-up one may fall between)
        self._horizon = following + lead  # nothing adopted later takes effect before that
        self._next_boundary, self.boundary_stretch = following, m
        self.boundaries += 1
        self._startup_boundary = False
        if self.rank == 0 and self.client is not None:
            # ask now for what the next boundary needs (the group's reports with it); it has until then
            self.client.request(self._boundary_for(following + lead), self.versions, gathered)
        dt = time.perf_counter() - t0
        self._step_overhead += dt
        self.overhead_s += dt

    def _boundary_for(self, first_step: int) -> Boundary:
        steps = self.config.decision_interval * self.boundary_stretch
        return Boundary(first_step, steps, self.decision_at(first_step).batch_sizes)

    def _stretch_from(self, now: float) -> int:
        """Rank 0: the decision intervals to the next boundary (``boundary_spacing.next_stretch``), from
        the wall time a step took since the last boundary."""
        mark, self._boundary_mark = self._boundary_mark, (self.global_step, now)
        if mark is None or self.global_step <= mark[0]:
            return 1
        return next_stretch(self.config, self.boundaries, (now - mark[1]) / (self.global_step - mark[0]))

    def _adopt(self, bundle: StepBundle) -> None:
        """Adopt each decision for exactly the step the scheduler stamped on it; a late one is dropped
        (the scheduler re-issues it for the next boundary), so both sides' histories agree."""
        effective = self.global_step + self.lead_steps
        for name, decision in bundle.decisions.items():
            if decision.effective_step != effective or decision.version <= self.versions.get(name, -1):
                self.stale_bundles += 1
                log.debug("step %d: dropped %s (for another step, or not newer)", self.global_step, decision)
                continue
            self.versions[name] = decision.version
            if isinstance(decision, NodeDecision):
                decision.validate(self.config.node.batch)
                if effective == self.global_step:
                    self._in_force(decision)
                else:
                    self._upcoming.append(decision)
            elif isinstance(decision, SampleDecision):
                for plan in decision.plans:
                    if plan.step >= effective and tuple(len(i) for i in plan.indices) == self.decision_at(plan.step).batch_sizes:
                        self._plans[plan.step] = plan
            else:  # another axis's (P3's slicing): kept for the runtime that acts on it (``axis_decision``)
                check_decision(decision, self.config, self.world_size)
                self._axis_decisions.setdefault(name, []).append(decision)

    def _uniform_plan(self, step: int) -> SamplePlan:
        """Fallback when no priority plan arrived in time: uniform draws, identical on every rank."""
        rng = np.random.default_rng([self.config.seed, 7919, step])
        decision = self.decision_at(step)
        idx = rng.integers(0, self._num_samples, size=decision.global_batch_size)
        cuts = np.cumsum(decision.batch_sizes)[:-1]
        parts = tuple(np.split(idx, cuts))
        return SamplePlan(step, parts, tuple(np.ones(len(p), dtype=np.float32) for p in parts), uniform=True)

    # -- checkpoints ---------------------------------------------------------------------------
    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        """``ray.train.report(metrics, checkpoint=...)`` with pdml-ray's state added to rank 0's checkpoint.

        ``checkpoint`` is a ``ray.train.Checkpoint`` made from a local directory
        (``Checkpoint.from_directory(d)``, as Ray Train's examples do): rank 0 writes the scheduler's
        state (estimates, decisions, the sample table), the decision in force, and where in which
        epoch the run stands into it before Ray Train persists it. A run resumed from it (after a
        worker failure with ``FailureConfig(max_failures>=1)``, or a rerun under the same
        ``RunConfig(name, storage_path)``, Ray Train's run storage) continues there: ``PDMLTrainer``
        restores it before the loop starts (the decisions in force and pending, ``lead_steps``); the
        loop reads ``ctx.start_epoch`` (the first epoch not finished) and loads its own model and
        optimizer state as usual.
        """
        if self.report_fn is None:
            raise UsageError("ctx.report needs the Ray Train worker PDMLTrainer launches (it calls ray.train.report)")
        pdml = self.pdml_metrics()
        if checkpoint is not None and self.rank == 0:
            directory = getattr(checkpoint, "path", None)
            if directory is None or not os.path.isdir(directory):
                raise UsageError("ctx.report needs a checkpoint made from a local directory "
                                 "(ray.train.Checkpoint.from_directory(d)) to add pdml-ray's state to it")
            self.save_scheduler_state(directory)
        self.report_fn({**pdml, **metrics}, checkpoint=checkpoint)  # the user's keys win

    def pdml_metrics(self) -> dict[str, float]:
        """pdml-ray's figures that ``report`` adds to the reported metrics, keys prefixed ``pdml/``
        (``pdml_ray.train.result_metrics`` lists them)."""
        return pdml_metrics(self)

    def save_scheduler_state(self, directory: str) -> bool:
        """Rank 0: write the scheduler's state (estimates, decisions, sample table), the decision in force
        and the run's position (epoch, offset) into a checkpoint directory, next to the model, as data
        (``pdml_ray.state_format``: JSON plus arrays, never a pickle). Other ranks do nothing. Returns
        whether a file was written."""
        if self.rank != 0 or self.client is None:
            return False
        self.flush()
        state = self.client.call("state_dict")
        write_saved_run(directory, SavedRunState(
            state=state, decision=self.decision, versions=dict(self.versions), global_step=self.global_step,
            position=self._position, lead_steps=self.lead_steps, upcoming=tuple(self._upcoming),
            horizon=self._horizon))
        return True

    def load_scheduler_state(self, directory: str) -> bool:
        """Restore what ``save_scheduler_state`` wrote: rank 0 loads it into the scheduler; every rank
        resumes the decision, the step count and the position in the epoch (``start_epoch``; the next
        ``epoch(start_epoch, n)`` continues where the checkpoint was taken). Returns False if the
        checkpoint has no pdml-ray state.

        Every rank reads and checks the whole file before anything is applied: a damaged file, or a
        decision this run could not have made (batch sizes outside min/max or not summing to the global
        batch, weights not their shares), raises the same StateError on every rank, and nothing changes."""
        saved = read_saved_run(directory, self.config, self.world_size, elastic=self.elastic)
        if saved is None:
            return False
        step, position, lead = saved.global_step, saved.position, saved.lead_steps
        workers = len(saved.decision.batch_sizes) if self.elastic else self.world_size
        if workers != self.world_size:
            # Resized: the position carries over (it counts samples, not ranks), so the steps after this
            # checkpoint that the old group ran are replayed from it. Its decisions were for the old count,
            # and the scheduler actor, resized as this group started, keeps its own state: the first step
            # runs a start-up boundary that brings the new count's shares (from the accelerator prior).
            self.global_step = step
            self._position = self._resume = (position[0], position[1])
            self.start_epoch = position[0]
            self.lead_steps, self._upcoming, self._horizon = lead, [], step + lead
            self._next_boundary = step
            self._startup_boundary = True
            return True
        if self.rank == 0 and self.client is not None:
            self.client.call("load_state_dict", saved.state)
        self.decision = saved.decision
        # the file holds node and sample decisions only: the scheduler sends its current ones of other axes
        # (P3's slicing) again at the first boundary, so the runtime runs what the scheduler says
        self.versions = {name: v for name, v in saved.versions.items() if name in ("node", "sample")}
        self.global_step = step
        self._position = (position[0], position[1])
        self._resume = self._position
        self.start_epoch = self._position[0]
        self.lead_steps, self._upcoming, self._horizon = lead, list(saved.upcoming), saved.horizon
        # the boundary the horizon was set at named the next one (horizon - lead): boundaries resume there,
        # so nothing adopted takes effect before the horizon, whose batches a loader may have cut
        self._next_boundary = max(0, saved.horizon - lead)
        return True

    def _report_timed(self, step: int, span_s: float) -> None:
        """Step ``step``'s compute time is known: queue its report (sent at the next boundary)."""
        t0 = time.perf_counter()
        u = self._untimed.pop(step, None)
        if u is None:
            return
        per_sample = u.per_sample  # its kernels came before the end event: reading it does not wait
        loss = float(per_sample.float().mean()) if per_sample is not None and per_sample.numel() else float("nan")
        grad_norm = float(u.grad_norm) if u.grad_norm is not None else float("nan")  # its kernel ran in backward
        sample_losses = None
        if self.config.sample_priority is not None and per_sample is not None and u.batch.feedback:
            sample_losses = per_sample.float().cpu().numpy()
        self._last_report = WorkerReport(
            worker_id=self.rank, step=step, samples=max(len(u.batch.indices), 0),
            compute_s=(span_s - u.launch_s if span_s > u.launch_s else span_s) + u.sleep_s, wait_s=u.wait_s, step_s=u.step_s,
            overhead_s=u.overhead_s, loss=loss, grad_norm=grad_norm if math.isfinite(grad_norm) else float("nan"),
            accelerator_type=self.accelerator_type,
            sample_indices=u.batch.indices if sample_losses is not None else None, sample_losses=sample_losses,
            forward_only=u.forward_only)
        self._reports.append(self._last_report)
        dt = time.perf_counter() - t0
        self._step_overhead += dt
        self.overhead_s += dt

    def flush(self) -> None:
        """Send the reports still buffered, waiting for the last steps' compute times (the end of
        training, a checkpoint)."""
        for step, span_s in self._timer.collect(block=True):
            self._report_timed(step, span_s)
        if self.client is not None:
            self.client.report(self._reports, flush=True)
        self._reports = []


class StepBatchSampler(torch.utils.data.Sampler[list[int]]):
    """This worker's index lists for one epoch, step by step (see ``PDMLContext.batch_sampler``).

    Iterated by a DataLoader in the main process; the worker processes only receive index lists.
    Each list is ``batch.indices`` of the ``StepBatch`` that ``ctx.step()`` then picks up.
    """

    def __init__(self, ctx: PDMLContext, epoch: int, num_samples: int) -> None:
        self.ctx, self.epoch, self.num_samples = ctx, epoch, num_samples

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.ctx._sampled_batches(self.epoch, self.num_samples):
            yield batch.indices.tolist()

    def __len__(self) -> int:
        """Steps in the epoch: ceil(N / B) (a resumed epoch has fewer)."""
        return math.ceil(self.num_samples / self.ctx.config.node.batch)
