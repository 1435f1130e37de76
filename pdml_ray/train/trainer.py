"""``PDMLTrainer``: Ray Train's ``TorchTrainer`` plus a scheduler actor and the in-loop context."""

from __future__ import annotations

import dataclasses
import logging
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.exceptions import RayError

from pdml_ray.actors.scheduler import create_scheduler
from pdml_ray.actors.scheduler_transport import RaySchedulerTransport
from pdml_ray.client import SchedulerClient
from pdml_ray.config import PDMLConfig
from pdml_ray.config.training import check_ray_train
from pdml_ray.errors import ConfigError
from pdml_ray.priority.node import accelerator_from_gpu_name, accelerator_from_resources
from pdml_ray.scheduler import SchedulerStats
from pdml_ray.train.context import PDMLContext, set_context

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


def _run_worker(user_loop: Callable, config: dict) -> Any:
    """What every Ray Train worker runs: build the context, then the user's loop."""
    import ray.train
    import ray.train.torch

    pdml = config.pop(_CONFIG_KEY)
    pdml_config = PDMLConfig.from_dict(pdml["config"])
    train_ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    accel = detect_accelerator_type(device, list(pdml_config.node.accelerator_prior()))
    assert pdml_config.scheduler_name is not None  # fit() names the scheduler before launching workers
    client = SchedulerClient(RaySchedulerTransport(pdml_config.scheduler_name, pdml_config.namespace))
    context = PDMLContext(pdml_config, train_ctx.get_world_rank(), train_ctx.get_world_size(), device, accel, client)
    context.report_fn = ray.train.report
    checkpoint = ray.train.get_checkpoint()  # a restart after a failure, or resume_from_checkpoint
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            if context.load_scheduler_state(directory):
                log.info("rank %d resumes at step %d (epoch %d)", context.rank, context.global_step, context.start_epoch)
    set_context(context)
    try:
        return user_loop(config) if _takes_config(user_loop) else user_loop()
    finally:
        context.flush()
        set_context(None)


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

    def __repr__(self) -> str:
        if self.stats is None:
            return "PDMLRunInfo(scheduler lost)"
        node = self.stats.derivers.get("node")
        sizes = list(node.batch_sizes) if node is not None else []  # type: ignore[attr-defined]
        return (f"PDMLRunInfo(decisions={len(self.decisions)}, reports={self.stats.reports_received}, "
                f"batch_sizes={sizes}{', warnings=' + str(len(self.warnings)) if self.warnings else ''})")


class PDMLTrainer:
    """Drop-in for ``ray.train.torch.TorchTrainer`` with node (and optionally sample) priorities.

    Same ``train_loop_per_worker``, ``train_loop_config``, ``scaling_config``, ``run_config`` (and
    any other ``TorchTrainer`` keyword); ``pdml_config`` adds pdml-ray. Inside the loop, call
    ``pdml_ray.train.get_context()``. ``fit()`` returns Ray Train's own ``Result`` (metrics,
    checkpoint, error as usual) with pdml-ray's additions in one place: ``result.pdml``
    (``PDMLRunInfo``: scheduler stats, decision history, telemetry, scheduler state, warnings).
    """

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: dict | None = None,
                 scaling_config=None, run_config=None, pdml_config: PDMLConfig | None = None,
                 keep_scheduler: bool = False, **torch_trainer_kwargs: Any):
        from ray.train import ScalingConfig

        self.loop = train_loop_per_worker
        self.loop_config = dict(train_loop_config or {})
        if _CONFIG_KEY in self.loop_config:
            raise ConfigError(f"train_loop_config key {_CONFIG_KEY!r} is reserved for pdml-ray; rename that key")
        self.scaling_config = scaling_config or ScalingConfig(num_workers=1)
        self.run_config = run_config
        self.pdml_config = pdml_config or PDMLConfig()
        workers = self.scaling_config.num_workers
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"PDMLTrainer needs a fixed number of workers, ScalingConfig(num_workers=N) with "
                              f"N >= 1; got num_workers={workers!r} (elastic ranges are not supported: batch "
                              "shares are split over a fixed set of ranks)")
        self.num_workers = workers
        if self.pdml_config.gradient_priority is not None:
            # a computed axis must act or be refused: in Ray Train every rank's gradient enters the all-reduce
            raise ConfigError("gradient_priority acts in the straggler-tolerant runtime (pdml_ray.runtime.stragglers, "
                              "policies topk and async), where the aggregator chooses which gradients to apply; under "
                              "PDMLTrainer every rank's gradient enters the weighted all-reduce, so nothing would act "
                              "on it: leave PDMLConfig.gradient_priority unset here")
        check_ray_train(self.pdml_config, self.num_workers)  # what validate-config checks too
        self.keep_scheduler = keep_scheduler
        self.scheduler = None  # the scheduler actor's handle after fit() when keep_scheduler=True
        self.kwargs = torch_trainer_kwargs

    def scheduler_name(self) -> str:
        """The scheduler actor's name: ``PDMLConfig.scheduler_name``, else the run's name, else a unique one."""
        if self.pdml_config.scheduler_name is not None:
            return self.pdml_config.scheduler_name
        run_name = getattr(self.run_config, "name", None)
        return f"pdml-{run_name}" if run_name else f"pdml-{uuid.uuid4().hex[:12]}"

    def fit(self) -> Any:
        """Train; returns Ray Train's ``Result`` with ``result.pdml`` (a ``PDMLRunInfo``) attached."""
        from ray.train.torch import TorchTrainer

        pdml_config = dataclasses.replace(self.pdml_config, scheduler_name=self.scheduler_name())
        if pdml_config.node.emulation:  # said where the user looks, not only in the stats
            print(f"pdml-ray ({pdml_config.scheduler_name}): {pdml_config.node.emulation}", flush=True)
        scheduler = create_scheduler(pdml_config, self.num_workers)
        ray.get(scheduler.ping.remote())
        loop = self.loop
        config = {**self.loop_config, _CONFIG_KEY: {"config": pdml_config.to_dict()}}
        trainer = TorchTrainer(lambda cfg: _run_worker(loop, cfg), train_loop_config=config,
                               scaling_config=self.scaling_config, run_config=self.run_config, **self.kwargs)
        try:
            result = trainer.fit()
            try:
                stats, decisions, telemetry, state = ray.get([
                    scheduler.stats.remote(), scheduler.decision_history.remote(),
                    scheduler.telemetry.remote(), scheduler.state_dict.remote()], timeout=60)
            except RayError as e:  # the scheduler died for good: the training result still stands
                log.warning("scheduler state lost at the end of the run: %s", e)
                stats, decisions, telemetry, state = None, [], {}, {}
        finally:
            if self.keep_scheduler:
                self.scheduler = scheduler  # holding the handle keeps the (non-detached) actor alive
            else:
                try:  # the run is over: delete its restart snapshot from Ray's GCS before the kill
                    ray.get(scheduler.close.remote(), timeout=10)
                except RayError as e:
                    log.warning("scheduler snapshot not deleted (the next run with this name deletes it): %s", e)
                ray.kill(scheduler)  # a later fit() with the same name starts from a fresh scheduler
        warnings_: list[str] = []
        if stats is not None and stats.reports_received == 0:
            warnings_.append("the training loop never ran a step through pdml-ray (no `with ctx.step(batch)`): it "
                             "trained as plain data parallelism, and no batch size pdml-ray decided was used; "
                             "see the README's loop")
        for w in warnings_:
            warnings.warn(w, stacklevel=2)
            log.warning("%s", w)
        result.pdml = PDMLRunInfo(stats, decisions, telemetry, state, tuple(warnings_))  # type: ignore[attr-defined]
        return result
