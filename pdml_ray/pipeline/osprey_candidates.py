"""Osprey's candidates beside its own lane plans (step 6 of ``pdml_ray.pipeline.osprey``): with
``OspreyConfig.plans='any'``, every static order that builds for the shape (gpipe, 1f1b and every torch
order: split backward and two to four chunks per rank included), each torch order re-cut onto osprey's
lanes ('<name>@lanes') and osprey's zero-bubble lanes over two, three and four chunks per rank
(``pdml_ray.pipeline.chunked``: 'osprey-zb-<layout>', 'osprey-zb3-<layout>', 'osprey-zb4-<layout>', and
'-sized' on a step's told sizes), which osprey predicts and chooses among."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from pdml_ray.config import PipelineConfig
from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.pipeline.chunked import ChunkedLanes
from pdml_ray.pipeline.plan import MAX_CHUNKS, Plan

ZERO_BUBBLE_CHUNKS = tuple(range(2, MAX_CHUNKS + 1))
"""Chunks per rank (2, 3, 4) of osprey's zero-bubble lanes, one candidate set each: more chunks shorten the
pipeline's fill and drain (a chunk's forward reaches the last rank sooner) at more transfers, which
the prediction counts (``PipelineConfig.transfer_s``); the simulator has no fixed cost per action, so a
runtime's per-message overhead is not counted (why ``plans='any'`` is for the simulator)."""

Lanes = Callable[[], tuple[Sequence[Sequence[int]], Sequence[Sequence[Sequence[float]]]]]
"""Osprey's lanes, asked for only where needed: (members, costs), ``members[stage][lane]`` the replica and
``costs[lane][stage]`` its (forward, input, weight) seconds."""


class StaticCandidates:
    """The candidates of one shape. Static orders are built once on first use; torch orders on lanes are
    kept by (name, lane counts, lane members), the last 64 of them (lane counts change with the lanes'
    speeds, so a long run keeps only the recent ones)."""

    def __init__(self, stages: int, replicas: Sequence[int], microbatches: int, pipeline_config: PipelineConfig) -> None:
        self.stages, self.replicas, self.microbatches = stages, tuple(replicas), microbatches
        self.pipeline_config = pipeline_config
        self._statics: dict[str, Plan] | None = None  # every static order that fits the shape, built on first use
        self._on_lanes: dict[tuple[Any, ...], Plan | None] = {}  # torch orders on lanes, by (name, counts, members)
        self._chunked = tuple(ChunkedLanes(chunks=c, cap=pipeline_config.memory_limit,
                                           transfer_s=pipeline_config.transfer_s) for c in ZERO_BUBBLE_CHUNKS)

    def plans(self, lane_counts: Sequence[int] | None, lanes: Lanes) -> dict[str, Plan]:
        """label -> plan: every static order that builds for this shape and, with unequal micro-batch
        counts per lane (``lane_counts``), each torch order on those lanes and osprey's zero-bubble lanes
        from those counts (``lanes()`` is asked only then)."""
        from pdml_ray.pipeline.registry import STATIC_SCHEDULES, TORCH_SCHEDULES, make_schedule
        from pdml_ray.pipeline.torch_orders import lanes_plan

        if self._statics is None:
            self._statics = {}
            for name in STATIC_SCHEDULES[:2] + tuple(TORCH_SCHEDULES):  # gpipe and 1f1b: the others adapt themselves
                try:
                    plan = make_schedule(name, stages=self.stages, replicas=self.replicas,
                                          microbatches=self.microbatches, config=self.pipeline_config).plan(0)
                except (ConfigError, PlanError):
                    continue  # torch's size rules: this shape does not fit it
                self._statics[name] = plan
        out = dict(self._statics)
        if lane_counts is not None and len(set(lane_counts)) > 1:
            members, costs = lanes()
            for chunked in self._chunked:
                out.update(chunked.plans(costs, lane_counts, members))
            given, ids = 0, []
            for n in lane_counts:
                ids.append(list(range(given, given + n)))
                given += n
            if len(self._on_lanes) > 64:  # lane counts and members seen lately; a long run keeps few
                self._on_lanes.clear()
            for name in TORCH_SCHEDULES:
                if name not in self._statics:
                    continue
                key = (name, tuple(lane_counts), tuple(tuple(m) for m in members))
                if key not in self._on_lanes:
                    cls = _torch_class(name)
                    try:
                        self._on_lanes[key] = lanes_plan(cls.torch_class, self.stages, ids, members, cls.chunks, name=name)
                    except PlanError:
                        self._on_lanes[key] = None  # a lane's count below torch's minimum
                on_lanes = self._on_lanes[key]
                if on_lanes is not None:
                    out[f"{name}@lanes"] = on_lanes
        return out


    def sized_plans(self, lanes: Lanes, sizes: Sequence[float],
                    relative_cost: Sequence[Sequence[float]]) -> dict[str, Plan]:
        """label -> plan: osprey's zero-bubble lanes on a step's told ``sizes`` (``ChunkedLanes.sized_plans``)."""
        members, costs = lanes()
        out: dict[str, Plan] = {}
        for chunked in self._chunked:
            out.update(chunked.sized_plans(costs, sizes, relative_cost, members))
        return out


def _torch_class(name: str) -> Any:
    """The ``TorchOrderSchedule`` subclass registered as ``name``."""
    import importlib

    from pdml_ray.pipeline.registry import TORCH_SCHEDULES

    module_name, cls_name = TORCH_SCHEDULES[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)
