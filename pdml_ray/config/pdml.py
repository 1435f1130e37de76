"""``PDMLConfig``: every component's config in one place, loadable from a dict or YAML."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdml_ray.config.checks import MAX_STEPS, check_range, require
from pdml_ray.config.continuity import ContinuityConfig
from pdml_ray.config.gradient import GradientPriorityConfig
from pdml_ray.config.loading import load_dataclass, read_yaml
from pdml_ray.config.node import NodePriorityConfig
from pdml_ray.config.p3 import P3Config
from pdml_ray.config.pipeline import PipelineConfig
from pdml_ray.config.sample import SamplePriorityConfig
from pdml_ray.config.stragglers import StragglerConfig
from pdml_ray.errors import ConfigError, shown


_SECTIONS: dict[str, tuple[type, bool]] = {
    "node_priority": (NodePriorityConfig, True), "sample_priority": (SamplePriorityConfig, True),
    "gradient_priority": (GradientPriorityConfig, True), "continuity": (ContinuityConfig, False),
    "pipeline": (PipelineConfig, True), "p3": (P3Config, True), "stragglers": (StragglerConfig, True)}
"""Each section field: its config class and whether None is allowed."""

DEFAULT_DECISION_INTERVAL = 5
"""``PDMLConfig.decision_interval``'s default: steps between decision boundaries."""
REPORT_ROUTES = ("auto", "boundary", "node", "worker")
"""The values of ``PDMLConfig.report_via``."""
DEFAULT_REPORT_VIA = "auto"
BOUNDARY_GATHER_MAX_WORKERS = 64
"""``report_via="auto"`` gathers reports in the boundary's collectives up to this many workers. Rank 0
receives the gather one rank at a time and unpacks every rank's rows (~1 us a row, a few rows per rank),
in series with its step: at 64 workers ~0.3 ms a boundary, against the ~1 ms of CPU that the call it
saves costs each worker. At a thousand workers that work, and the one scheduler call carrying all of
it, would fall on one worker and one actor thread; node relays spread it over the nodes."""


@dataclass(kw_only=True, slots=True)
class PDMLConfig:
    """Everything pdml-ray needs to know, one section per component."""

    node_priority: NodePriorityConfig | None = None
    """None (the default) builds no node axis, as a runtime without node priorities needs (the pipeline
    and straggler runtimes). Ray Train runs (``PDMLTrainer``) require it: the global batch size is its
    ``global_batch_size``."""
    sample_priority: SamplePriorityConfig | None = None
    """None (the default) keeps uniform sampling: a seeded permutation per epoch."""
    gradient_priority: GradientPriorityConfig | None = None
    """None (the default) derives no gradient priorities; set it for the straggler runtime's top-K and
    async policies (``pdml_ray.priority.gradient``)."""
    continuity: ContinuityConfig = field(default_factory=ContinuityConfig)
    pipeline: PipelineConfig | None = None
    """None (the default) builds no pipeline axis. Set it for the pipeline runtime
    (``pdml_ray.runtime.pipeline``): the scheduler's ``pipeline`` deriver plans every step's micro-batches
    with the schedule it names (static, osprey or auto; osprey knobs, memory limit)."""
    stragglers: StragglerConfig | None = None
    """None (the default): no straggler-tolerant runtime. Set it for that runtime
    (``pdml_ray.runtime.StragglerRuntime.from_config``): the policy and its n and s, learning rate, step
    timeout, emulated compute. Its ``topk`` and ``async`` policies take their rule (K, priorities,
    ``max_wait``) from the ``gradient`` axis (``gradient_priority``), decided every ``decision_interval``
    steps by the run's scheduler; the run's scheduler config carries this section, so ``pdml-ray status``
    shows the policy."""
    p3: P3Config | None = None
    """None (the default): gradients go through DDP's hook. Set it for P3 ordering: per-slice all-reduces in
    priority order with per-layer optimizer steps (``pdml_ray.train.p3_sync``), and the simulator's settings."""
    decision_interval: int = DEFAULT_DECISION_INTERVAL
    """Steps between decision boundaries, for every axis that decides at boundaries: node shares, sample
    plans and the gradient rule are re-derived every ``decision_interval`` steps, and all ranks switch
    together at the same step. The pipeline axis plans every step (a plan per step)."""
    decision_interval_min_s: float = 0.0
    """Seconds decision boundaries are at least apart in the data-parallel Ray Train loop (``ctx.step``;
    0, the default: a boundary every ``decision_interval`` steps; a pipeline run plans every step).
    Where steps are short, rank 0 stretches the interval to a whole number of decision intervals from
    its measured step time (at most ``MAX_ROWS / (2 decision_interval)``), and every rank skips the
    boundaries in between: a boundary costs about the same at any step length (a broadcast, a gather,
    one scheduler call), so this cuts what pdml-ray costs a short step, at the price of shares that
    adapt every few seconds rather than every few steps (the first four boundaries of a run keep every
    interval, so the first shares come as fast). Runs with sample priorities keep every boundary (their
    plans follow each interval). ``pdml_ray.train.boundary_spacing``; measured in
    docs/observability.md."""
    seed: int = 0
    """Seed of the global permutation and of every random draw the scheduler makes."""
    replay_log: int = 0
    """Most inputs (reports, observations, shapes, decision requests) the scheduler keeps for a
    deterministic replay of every axis (``pdml_ray.replay``); 0 (the default) keeps none."""
    report_via: str = DEFAULT_REPORT_VIA
    """How a Ray Train worker's reports reach the scheduler:

    - ``"boundary"``: in the data-parallel loop's decision-boundary collective. Every rank already
      meets there to learn whether a new decision came. Each rank puts its reports into one gather
      to rank 0, which sends everyone's with its request for the next decision: one call per
      boundary for the whole group, not one per worker. A pipeline run has no such collective and
      reports as ``"node"``.
    - ``"node"``: through a relay actor on each node, which sends the node's workers' reports of each
      flush as one call (``pdml_ray.actors.report_relay``; a node with one worker reports straight).
    - ``"worker"``: one call per worker, straight to the scheduler.
    - ``"auto"`` (the default): ``"boundary"`` up to ``BOUNDARY_GATHER_MAX_WORKERS`` workers, ``"node"``
      above, where every rank would receive and unpickle every other rank's reports at each boundary.

    Why: a Ray actor call costs the actor 1.3-3.4 ms of CPU at a training pace (about two a second),
    so the calls, not the reports in them, are most of what reporting costs (docs/observability.md,
    ``pdml-ray bench hetero --report-via``)."""
    scheduler_name: str | None = None
    """Name of the run's scheduler actor (``pdml-ray status --name``). None: ``PDMLTrainer.fit()`` names
    it after the run (``RunConfig.name``) or, without one, a fresh unique name, so concurrent runs on
    one cluster get their own scheduler and metric series."""
    namespace: str = "pdml"
    """Ray namespace of the scheduler actor."""

    def __post_init__(self) -> None:
        check_range(self.seed, "seed", 0, 2**63 - 1, whole=True, hint="of numpy's and torch's generators")
        check_range(self.decision_interval, "decision_interval", 1, MAX_STEPS, whole=True,
                    hint="steps between decision boundaries, e.g. 5")
        check_range(self.decision_interval_min_s, "decision_interval_min_s", 0.0, 3600.0,
                    hint="seconds between decision boundaries at least, e.g. 2.0; 0 = every decision_interval steps")
        check_range(self.replay_log, "replay_log", 0, 10**7, whole=True, hint="scheduler inputs kept; 0 = none")
        for f in dataclasses.fields(self):  # sections: the right config class (or None where optional)
            section = _SECTIONS.get(f.name)
            value = getattr(self, f.name)
            if section is not None and not (isinstance(value, section[0]) or (value is None and section[1])):
                raise ConfigError(f"{f.name} must be a {section[0].__name__}{' or None' if section[1] else ''}, "
                                  f"got {shown(value)}")
        require(self.report_via in REPORT_ROUTES,
                f"report_via must be one of {', '.join(map(repr, REPORT_ROUTES))} (how reports reach the "
                f"scheduler), got {shown(self.report_via)}")
        require(isinstance(self.namespace, str) and bool(self.namespace),
                f"namespace must be a non-empty string (the Ray namespace), got {shown(self.namespace)}")
        require(self.scheduler_name is None or (isinstance(self.scheduler_name, str) and bool(self.scheduler_name)),
                "scheduler_name must be a non-empty string, or None to name it after the run")

    @property
    def node(self) -> NodePriorityConfig:
        """The node section, for code that runs only with node priorities (the Ray Train path)."""
        if self.node_priority is None:
            raise ConfigError("this needs node priorities: set PDMLConfig(node_priority=NodePriorityConfig("
                              "global_batch_size=...)), the samples per optimizer step over all workers")
        return self.node_priority

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PDMLConfig":
        return load_dataclass(cls, data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "PDMLConfig":
        data = read_yaml(path)  # bounded, JSON-like types only (pdml_ray.config.loading)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def report_route(self, world_size: int, boundary_collective: bool = True) -> str:
        """How reports travel in a run of ``world_size`` workers: ``report_via`` with ``"auto"``
        resolved, and ``"boundary"`` as ``"node"`` where the loop has no boundary collective
        (``boundary_collective`` False: a pipeline run) or a single worker has nobody to gather."""
        route = self.report_via
        if route == "auto":
            route = "boundary" if world_size <= BOUNDARY_GATHER_MAX_WORKERS else "node"
        return route if route != "boundary" or (boundary_collective and world_size > 1) else "node"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
