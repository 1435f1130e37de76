"""``PDMLTrainer``: Ray Train's ``TorchTrainer`` plus a scheduler actor and the in-loop context."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import sys
import types
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.exceptions import RayError
from ray.util import register_serializer

from pdml_ray.actors.scheduler import create_scheduler
from pdml_ray.actors.report_relay import worker_transport
from pdml_ray.client import SchedulerClient
from pdml_ray.config import PDMLConfig
from pdml_ray.config.training import check_ray_train
from pdml_ray.errors import ConfigError, UsageError
from pdml_ray.priority.node import accelerator_from_gpu_name, accelerator_from_resources
from pdml_ray.scheduler import SchedulerStats
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.installed_context import set_context
from pdml_ray.train.pipeline import PipelineContext
from pdml_ray.train.pipeline_layout import PipelineLayout
from pdml_ray.train.ray_data import DatasetRows, materialize
from pdml_ray.train.result_metrics import in_force_and_pending

log = logging.getLogger(__name__)

_CONFIG_KEY = "_pdml"


def detect_accelerator_type(device: torch.device, known: list[str]) -> str:
    """The GPU's model name if there is one, else the node's ``accelerator_type:*`` resource, else CPU."""
    if device.type == "cuda":
        return accelerator_from_gpu_name(torch.cuda.get_device_name(device), known)
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return accelerator_from_resources(node.get("Resources", {})) or "CPU"
    return "CPU"


def _module_name(module: types.ModuleType) -> str:
    return module.__name__


def pickle_modules_by_name() -> None:
    """Let Ray pickle a loop written in ``__main__`` that reaches one of torch's module objects.

    Ray pickles such a loop by value, and with it each loaded submodule of a module it uses whose name
    parts all occur in the loop's code: ``import torch.distributed as dist`` plus any ``.config``
    (``ctx.config``, a transformers ``model.config``) brings in ``torch.distributed.config``. Several of
    torch's modules (its config modules, ``torch.backends.*``) are instances of ``ModuleType``
    subclasses, which cloudpickle cannot pickle: ``fit()`` failed with "cannot pickle
    'ConfigModuleInstance' object" before training. Ray's own hook for a type it cannot pickle,
    ``ray.util.register_serializer``, sends each such module by name, imported again where it is
    loaded (the workers have the same packages). Plain modules keep cloudpickle's own handling."""
    kinds = {type(m) for m in list(sys.modules.values())
             if isinstance(m, types.ModuleType) and type(m) is not types.ModuleType}
    for kind in kinds:
        register_serializer(kind, serializer=_module_name, deserializer=importlib.import_module)


def _run_worker(user_loop: Callable, config: dict) -> Any:
    """What every Ray Train worker runs: build the context, then the user's loop."""
    import ray.train
    import ray.train.torch

    pdml = config.pop(_CONFIG_KEY)
    pdml_config = PDMLConfig.from_dict(pdml["config"])
    train_ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    if pdml_config.pipeline is not None:  # pipeline x data parallel: a context of its own (train/pipeline.py)
        return _run_pipeline_worker(user_loop, config, pdml_config, train_ctx, device)
    accel = detect_accelerator_type(device, list(pdml_config.node.accelerator_prior()))
    assert pdml_config.scheduler_name is not None  # fit() names the scheduler before launching workers
    client = SchedulerClient(worker_transport(pdml_config.scheduler_name, pdml_config.namespace,
                                              pdml_config.report_route(train_ctx.get_world_size()),
                                              train_ctx.get_local_world_size()))
    if pdml["elastic"]:  # this start's worker count, before any worker registers under it
        import torch.distributed as dist

        if train_ctx.get_world_rank() == 0:
            client.call("resize", train_ctx.get_world_size())
        if train_ctx.get_world_size() > 1:
            dist.barrier()
    context = PDMLContext(pdml_config, train_ctx.get_world_rank(), train_ctx.get_world_size(), device, accel, client)
    context.report_fn = ray.train.report
    context.datasets = {name: DatasetRows(blocks) for name, blocks in pdml.get("datasets", {}).items()}
    context.elastic = pdml["elastic"]  # its checkpoint may come from another worker count
    return _run_loop(context, user_loop, config,
                     lambda: f"at step {context.global_step} (epoch {context.start_epoch})")


def _run_pipeline_worker(user_loop: Callable, config: dict, pdml_config: PDMLConfig, train_ctx: Any,
                         device: torch.device) -> Any:
    """A pipeline run's worker: its ``PipelineContext`` (no node priorities), then the user's loop."""
    import ray.train

    assert pdml_config.scheduler_name is not None  # fit() names the scheduler before launching workers
    client = SchedulerClient(worker_transport(
        pdml_config.scheduler_name, pdml_config.namespace,
        pdml_config.report_route(train_ctx.get_world_size(), boundary_collective=False), train_ctx.get_local_world_size()))
    accel = detect_accelerator_type(device, [])
    context = PipelineContext(pdml_config, train_ctx.get_world_rank(), train_ctx.get_world_size(), device, client, accel)
    context.report_fn = ray.train.report
    # pdml-ray's state is restored before the loop's prepare
    return _run_loop(context, user_loop, config, lambda: f"at step {context.start_step}")


def _run_loop(context: Any, user_loop: Callable, config: dict,
              resumed_at: Callable[[], str]) -> Any:
    """Either kind of worker context (``PDMLContext``, ``PipelineContext``): restore pdml-ray's state from
    Ray Train's latest checkpoint (a restart after a failure, or a rerun: the run storage's latest), install
    the context, run the user's loop, flush the context's reports."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            if context.load_scheduler_state(directory):
                log.info("rank %d resumes %s", context.rank, resumed_at())
    set_context(context)
    try:
        with _one_copy_of_prints():
            return user_loop(config) if _takes_config(user_loop) else user_loop()
    finally:
        context.flush()
        set_context(None)


@contextlib.contextmanager
def _one_copy_of_prints() -> Iterator[None]:
    """Each ``print`` of the loop reaches the driver once.

    Ray Train v2 (2.60) turns a worker's ``print`` into a log record, which its console handler writes
    to stderr, and prints it to stdout as well whenever ``sys.stdout is not sys.__stdout__`` (meant for a
    stream a library such as wandb wrapped). In a Ray worker that is always so: ``sys.stdout`` is Ray's
    own ``Unbuffered`` wrapper of a stream on file descriptor 1, so every line went out twice and
    log_to_driver streamed both (under ``TorchTrainer`` as well). For the loop ``sys.stdout`` is
    ``sys.__stdout__``, on the same descriptor, line-buffered (Ray's wrapper flushes every write), so a
    print goes out once, through the log record."""
    from ray._private.utils import Unbuffered

    wrapper, stream = sys.stdout, sys.__stdout__
    try:
        same_fd = (isinstance(wrapper, Unbuffered) and stream is not None
                   and wrapper.stream.fileno() == stream.fileno())
    except (AttributeError, OSError, ValueError):  # a stream without a file descriptor: leave it as it is
        same_fd = False
    if not same_fd or stream is None:
        yield
        return
    wrapper.flush()
    line_buffering = stream.line_buffering
    stream.reconfigure(line_buffering=True)
    sys.stdout = stream
    try:
        yield
    finally:
        stream.flush()
        sys.stdout = wrapper
        stream.reconfigure(line_buffering=line_buffering)


def _takes_config(fn: Callable) -> bool:
    import inspect

    return len(inspect.signature(fn).parameters) > 0


@dataclass(frozen=True)
class PDMLRunInfo:
    """What pdml-ray adds to Ray Train's ``Result`` of a ``PDMLTrainer.fit()``, as ``result.pdml``."""

    stats: SchedulerStats | None
    """The scheduler's typed stats at the end (None if the scheduler was lost)."""
    decisions: list[dict[str, Any]] = field(repr=False)
    """Every node decision the scheduler published (version, effective_step, batch_sizes, ...)."""
    telemetry: dict[str, Any] = field(repr=False)
    """The report log as numpy columns (worker_id, step, samples, compute_s, wait_s, step_s, ...)."""
    scheduler_state: dict[str, Any] = field(repr=False)
    warnings: tuple[str, ...] = ()
    in_force: dict[str, Any] | None = None
    """The node decision in force at the run's last reported step (version, effective_step, batch_sizes, ...)."""
    pending: dict[str, Any] | None = None
    """The newest node decision published for a step after that, which the run ended before reaching
    (None when there was none): ``stats.derivers["node"]`` shows the newest, which may be this one."""

    def __repr__(self) -> str:
        if self.stats is None:
            return "PDMLRunInfo(scheduler lost)"
        sizes = list(self.in_force["batch_sizes"]) if self.in_force is not None else []
        pending = (f", pending=v{self.pending['version']} {list(self.pending['batch_sizes'])} from step "
                   f"{self.pending['effective_step']}" if self.pending is not None else "")
        return (f"PDMLRunInfo(decisions={len(self.decisions)}, reports={self.stats.reports_received}, "
                f"batch_sizes={sizes}{pending}{', warnings=' + str(len(self.warnings)) if self.warnings else ''})")


class PDMLTrainer:
    """Drop-in for ``ray.train.torch.TorchTrainer`` with node (and optionally sample) priorities.

    Same ``train_loop_per_worker``, ``train_loop_config``, ``scaling_config``, ``run_config`` (and
    any other ``TorchTrainer`` keyword); ``pdml_config`` adds pdml-ray. Inside the loop, call
    ``pdml_ray.train.get_context()``. ``fit()`` returns Ray Train's own ``Result`` (metrics,
    checkpoint, error as usual) with pdml-ray's additions in one place: ``result.pdml``
    (``PDMLRunInfo``: scheduler stats, decision history, telemetry, scheduler state, warnings).
    ``datasets={"train": ds}`` (Ray Datasets) are materialised once in ``fit()``; the loop reads them
    at its batch sizes through ``ctx.iter_torch_batches("train", epoch=e)`` (``pdml_ray.train.ray_data``).
    ``ScalingConfig(num_workers=(min, max))`` is followed: at every start of the worker group the
    scheduler is resized to its count (``Scheduler.resize``) and the run resumes from its checkpoint's
    position with the new count's shares. With ``PDMLConfig(pipeline=PipelineConfig(stages=S, ...))``
    the workers run as ``S`` pipeline stages x ``num_workers / S`` data-parallel replicas instead, without
    node priorities; the loop takes ``pdml_ray.train.get_pipeline_context()``.
    """

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: dict | None = None,
                 scaling_config=None, run_config=None, pdml_config: PDMLConfig | None = None,
                 keep_scheduler: bool = False, **torch_trainer_kwargs: Any):
        from ray.train import RunConfig, ScalingConfig

        if "resume_from_checkpoint" in torch_trainer_kwargs:
            raise ConfigError("resume_from_checkpoint is deprecated in Ray Train v2 (Ray refuses it): a run resumes "
                              "from its run storage. Rerun with the same RunConfig(name=..., storage_path=...) and "
                              "ray.train.get_checkpoint() in the loop returns its latest checkpoint (pdml-ray "
                              "restores its state from it); FailureConfig(max_failures=N) does the same after a "
                              "worker failure")
        self.loop = train_loop_per_worker
        self.loop_config = dict(train_loop_config or {})
        if _CONFIG_KEY in self.loop_config:
            raise ConfigError(f"train_loop_config key {_CONFIG_KEY!r} is reserved for pdml-ray; rename that key")
        self.scaling_config = scaling_config or ScalingConfig(num_workers=1)
        # Ray Train names an unnamed run itself; naming it here lets the scheduler and metrics carry that name
        self.run_config = run_config if run_config is not None else RunConfig()
        self.pdml_config = pdml_config or PDMLConfig()
        workers = self.scaling_config.num_workers
        counts = workers if isinstance(workers, tuple) else (workers,)
        if not (len(counts) in (1, 2) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts)
                and counts[0] <= counts[-1]):
            raise ConfigError(f"PDMLTrainer needs a fixed number of workers, ScalingConfig(num_workers=N) with N >= 1, "
                              f"or an elastic range (min, max) with 1 <= min <= max; got num_workers={workers!r}")
        self.elastic = len(counts) == 2
        self.num_workers = counts[0]  # the scheduler's count until the first workers start (resized then)
        if self.elastic:
            self._check_elastic()
        if self.pdml_config.gradient_priority is not None:
            # a computed axis must act or be refused: in Ray Train every rank's gradient enters the all-reduce
            raise ConfigError("gradient_priority acts in the straggler-tolerant runtime (pdml_ray.runtime.stragglers, "
                              "policies topk and async), where the aggregator chooses which gradients to apply; under "
                              "PDMLTrainer every rank's gradient enters the weighted all-reduce, so nothing would act "
                              "on it: leave PDMLConfig.gradient_priority unset here")
        for n in sorted(set(counts)):
            check_ray_train(self.pdml_config, n)  # what validate-config checks too
            if self.pdml_config.pipeline is not None:
                PipelineLayout.build(n, self.pdml_config.pipeline.stages or 0)  # stages must divide the workers
        self.keep_scheduler = keep_scheduler
        self.scheduler = None  # the scheduler actor's handle after fit() when keep_scheduler=True
        self.kwargs = torch_trainer_kwargs

    def _check_elastic(self) -> None:
        """What an elastic run (``num_workers=(min, max)``) cannot combine with, refused with the fix."""
        config = self.pdml_config
        if config.pipeline is not None:
            raise ConfigError("a pipeline run's stages x replicas are fixed at its start: give "
                              "ScalingConfig(num_workers=N) with N a multiple of pipeline.stages")
        if config.sample_priority is not None:
            raise ConfigError("elastic worker counts work with node priorities alone: sample_priority's plans are "
                              "cut for a fixed set of ranks. Leave PDMLConfig.sample_priority unset, or give "
                              "ScalingConfig(num_workers=N)")
        if config.node_priority is not None and config.node_priority.emulated_speeds is not None:
            raise ConfigError("node_priority.emulated_speeds gives one speed per rank of a fixed worker group; an "
                              "elastic run's ranks come and go: leave emulated_speeds unset (the accelerator prior "
                              "seeds each newcomer), or give ScalingConfig(num_workers=N)")
        if config.replay_log:
            raise ConfigError("replay_log records a fixed worker count; an elastic run resizes its scheduler: "
                              "leave PDMLConfig.replay_log unset, or give ScalingConfig(num_workers=N)")

    def scheduler_name(self) -> str:
        """The scheduler actor's name: ``PDMLConfig.scheduler_name``, else the run's name, else a unique one."""
        if self.pdml_config.scheduler_name is not None:
            return self.pdml_config.scheduler_name
        run_name = self.run_config.name
        return f"pdml-{run_name}" if run_name else f"pdml-{uuid.uuid4().hex[:12]}"

    def fit(self) -> Any:
        """Train; returns Ray Train's ``Result`` with ``result.pdml`` (a ``PDMLRunInfo``) attached.

        A rerun under a ``RunConfig(name)`` whose run already finished continues from its last
        checkpoint when the loop has epochs left; if it trains no step from there, ``fit()`` raises a
        ``UsageError`` (it never returns a result of no training as a success)."""
        from ray.train.torch import TorchTrainer

        pdml_config = dataclasses.replace(self.pdml_config, scheduler_name=self.scheduler_name())
        if pdml_config.node_priority is not None and pdml_config.node_priority.emulation:  # said where the user looks, not only in the stats
            print(f"pdml-ray ({pdml_config.scheduler_name}): {pdml_config.node.emulation}", flush=True)
        loop = self.loop
        kwargs = dict(self.kwargs)
        pdml: dict[str, Any] = {"config": pdml_config.to_dict(), "elastic": self.elastic}
        if kwargs.get("datasets"):  # run once here; the workers read their rows by position (see ray_data)
            kwargs["datasets"], pdml["datasets"] = materialize(kwargs["datasets"])
        config = {**self.loop_config, _CONFIG_KEY: pdml}
        # built before the scheduler starts: an error here leaves nothing behind
        trainer = TorchTrainer(lambda cfg: _run_worker(loop, cfg), train_loop_config=config,
                               scaling_config=self.scaling_config, run_config=self.run_config, **kwargs)
        pickle_modules_by_name()  # before trainer.fit() pickles the loop
        scheduler = None
        try:
            scheduler = create_scheduler(pdml_config, self.num_workers, run_name=self.run_config.name)
            ray.get(scheduler.ping.remote())
            result = trainer.fit()
            try:
                stats, decisions, telemetry, state = ray.get([
                    scheduler.stats.remote(), scheduler.decision_history.remote(),
                    scheduler.telemetry.remote(), scheduler.state_dict.remote()], timeout=60)
            except RayError as e:  # the scheduler died for good: the training result still stands
                log.warning("scheduler state lost at the end of the run: %s", e)
                stats, decisions, telemetry, state = None, [], {}, {}
        finally:
            if scheduler is not None:
                self._release(scheduler)
        if stats is not None and stats.reports_received > 0 and len(telemetry.get("step", ())) == 0:
            # counts restored from a checkpoint, and no report in this fit(): the run had finished
            raise UsageError(
                f"run {self.run_config.name!r} resumed from its last checkpoint (step {stats.last_step}) and trained "
                "no step: its loop had already finished there. To train further, give the loop more epochs "
                "(range(ctx.start_epoch, epochs) continues with the first epoch not done); to start afresh, give "
                "a new RunConfig(name=...) or delete that run's folder under its storage_path")
        warnings_: list[str] = []
        if stats is not None and stats.reports_received == 0:
            warnings_.append("the training loop never ran a step through pdml-ray (no `with ctx.step(batch)`): it "
                             "trained as plain data parallelism, and no batch size pdml-ray decided was used; "
                             "see the README's loop")
        for w in warnings_:
            warnings.warn(w, stacklevel=2)
            log.warning("%s", w)
        in_force, pending = in_force_and_pending(decisions, stats.last_step) if stats is not None else (None, None)
        result.pdml = PDMLRunInfo(stats, decisions, telemetry, state, tuple(warnings_),  # type: ignore[attr-defined]
                                  dict(in_force) if in_force else None, dict(pending) if pending else None)
        return result

    def _release(self, scheduler: Any) -> None:
        """The run is over (or never started): keep the scheduler (``keep_scheduler``) or end it."""
        if self.keep_scheduler:
            self.scheduler = scheduler  # holding the handle keeps the (non-detached) actor alive
            return
        try:  # delete its restart snapshot from Ray's GCS before the kill
            ray.get(scheduler.close.remote(), timeout=10)
        except RayError as e:
            log.warning("scheduler snapshot not deleted (the next run with this name deletes it): %s", e)
        ray.kill(scheduler)  # a later fit() with the same name starts from a fresh scheduler
