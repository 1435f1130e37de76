"""The pipeline axis: the micro-batch schedule of every global step, derived by the run's scheduler.

The schedule itself (static, osprey or auto, named by ``PipelineConfig.schedule``) is the pure
``pdml_ray.pipeline`` object it always was; this deriver hosts it inside the one ``Scheduler`` so that
a pipeline run has the same version stamps, history, replay, ``pdml-ray status`` and metrics as every
other axis:

    on_shape({"stages", "replicas", "microbatches"})   the runtime announces the pipeline it runs (with
                                 "layers", a relative cost per layer, and "cuts", where layer
                                 re-balancing is on: ``PipelineConfig.rebalance``)
    observe(step, rows)          one step's action latencies, rows of (stage, replica, kind, microbatch,
                                 seconds) as plain tuples (cheap to send, like ``PackedReports``);
                                 or, before step ``step`` is planned, its micro-batch sizes as rows
                                 ('size', microbatch, relative size) (the replay log keeps both)
    decide(boundary, earlier)    the plan for ``boundary.first_step``: a ``MicroBatchPlan``, with the
                                 layers that move between stages before that step
                                 (``pdml_ray.pipeline.rebalance``), if any

The runtime asks for step t+1's plan while step t runs (``pdml_ray.runtime.pipeline``), so an adaptive
schedule plans t+1 on measurements through step t-1: planning never sits on the step's critical path.
Pure: no Ray, no clocks that change decisions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, MicroBatchPlan, Rejection, WorkerReport
from pdml_ray.errors import ConfigError, PlanError, ReportError, StateError
from pdml_ray.pipeline.plan import MAX_CHUNKS, Kind, Measurement, PipelineSchedule
from pdml_ray.pipeline.rebalance import LayerMove, Rebalancer, stage_seconds
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.priority.base import Deriver, GaugeValue

MAX_ROWS_PER_OBSERVATION = 1 << 21
"""Most action latencies one observation may carry (two per action of a step of ``MAX_ACTIONS``)."""
MAX_LAYERS = 1 << 16
"""Most layers a shape may announce for re-balancing."""


@dataclass(frozen=True, slots=True)
class PipelineAxisStats:
    """What the pipeline axis knows: the schedule, the shape it plans for, its planning cost."""

    schedule: str
    stages: int
    replicas: tuple[int, ...]
    microbatches: int
    steps_observed: int
    plans: int
    """Plans derived so far (one per step asked for)."""
    plan_s: float
    """Seconds spent planning, summed (the deriver's own cost per step: ``plan_s / plans``)."""
    observations_rejected: int
    last_decision: Mapping[str, Any] | None
    """The adaptive schedule's record behind its newest plan (osprey's lane weights, auto's choice);
    None for a static schedule."""
    cuts: tuple[int, ...] | None = None
    """Where layer re-balancing has the stages cut now (first layer of stages 1..S-1); None when it is off."""
    layer_moves: int = 0
    """Layer moves decided so far."""

    def summary_lines(self) -> list[str]:
        mean_ms = 1e3 * self.plan_s / self.plans if self.plans else math.nan
        line = (f"pipeline: {self.schedule} over {self.stages} stages x replicas {list(self.replicas)}, "
                f"{self.microbatches} micro-batches; {self.plans} plans ({mean_ms:.2f} ms each), "
                f"{self.steps_observed} steps observed")
        if self.observations_rejected:
            line += f", {self.observations_rejected} observations rejected"
        lines = [line]
        if self.cuts is not None:
            lines.append(f"  layer re-balancing: cuts {list(self.cuts)}, {self.layer_moves} moves")
        if self.last_decision:
            lines.append("  last decision: " + ", ".join(f"{k}={v}" for k, v in sorted(self.last_decision.items())
                                                         if not isinstance(v, (list, tuple, dict))))
        return lines

    def gauges(self) -> list[GaugeValue]:
        tags = (("schedule", self.schedule),)
        return [GaugeValue("pdml_pipeline_plans_total", "micro-batch plans the scheduler derived", self.plans, tags),
                GaugeValue("pdml_pipeline_plan_seconds_total", "seconds the scheduler spent planning micro-batches",
                           self.plan_s, tags),
                GaugeValue("pdml_pipeline_steps_observed_total", "pipeline steps whose latencies the scheduler took",
                           self.steps_observed, tags)]


class PipelineDeriver(Deriver):
    """Hosts the configured pipeline schedule; plans one step per boundary once the shape is known."""

    name = "pipeline"
    history_rows = 200
    """Plans kept in the scheduler's history (a plan of 8 stages x 4 replicas x 32 micro-batches is 512
    actions, ~50 KB as objects: 200 of them ~10 MB)."""

    def __init__(self, config: PDMLConfig, num_workers: int) -> None:
        super().__init__(config, num_workers)
        assert config.pipeline is not None
        self.pipeline = config.pipeline
        self.shape: dict[str, Any] | None = None
        self.schedule: PipelineSchedule | None = None
        self.steps_observed = 0
        self.plans = 0
        self.plan_s = 0.0
        self.observations_rejected = 0
        self.rebalancer: Rebalancer | None = None
        self._stage_ranks: dict[int, list[int] | None] = {}
        """Step -> its plan's ranks of virtual stages (None: one stage per rank), until its latencies come."""
        self._move: tuple[int, LayerMove | None] | None = None
        """The newest step planned and the layer move decided for it (a step planned again keeps it)."""

    # -- events -------------------------------------------------------------------------------------
    def on_shape(self, shape: Mapping[str, Any]) -> None:
        """The runtime announces its stages, replicas per stage and micro-batches per step (and, for layer
        re-balancing, its layers' relative costs and its cuts)."""
        keys = {"stages", "replicas", "microbatches"}
        if not isinstance(shape, Mapping) or not keys <= set(shape) <= keys | {"layers", "cuts"} \
                or ("layers" in shape) != ("cuts" in shape):
            raise ReportError(f"pipeline shape must be a mapping of stages, replicas, microbatches (and layers with "
                              f"cuts, or neither), got {shape!r:.200}")
        try:
            schedule = make_schedule(self.pipeline.schedule, stages=shape["stages"], replicas=shape["replicas"],
                                      microbatches=shape["microbatches"], config=self.pipeline)
        except ConfigError as e:
            raise ReportError(f"pipeline shape refused: {e}") from None
        replicas = shape["replicas"]
        new: dict[str, Any] = {"stages": int(shape["stages"]), "microbatches": int(shape["microbatches"]),
               "replicas": [int(replicas)] * int(shape["stages"]) if isinstance(replicas, int) else
               [int(r) for r in replicas]}
        rebalancer = self._rebalancer(shape, new["stages"])
        if rebalancer is not None:
            new.update(layers=[float(w) for w in shape["layers"]], cuts=[int(c) for c in shape["cuts"]])
        if new == self.shape:
            return  # announced again (a driver reconnecting): keep what was learnt
        self.shape, self.schedule, self.rebalancer = new, schedule, rebalancer
        self.steps_observed = 0

    def _rebalancer(self, shape: Mapping[str, Any], stages: int) -> Rebalancer | None:
        """Layer re-balancing over the announced layers, where the config turns it on; ReportError when it
        is on and the runtime announced no layers (a decision nobody could carry out is refused)."""
        config = self.pipeline.rebalance
        if not config.enabled:
            return None
        layers, cuts = shape.get("layers"), shape.get("cuts")
        if layers is None:
            raise ReportError("pipeline.rebalance is on but the runtime announced no layers: announce them "
                              "(ScheduledPlans(layers=..., cuts=...)) or set pipeline.rebalance.enabled: false")
        ok = (isinstance(layers, (list, tuple)) and 0 < len(layers) <= MAX_LAYERS and isinstance(cuts, (list, tuple))
              and len(cuts) == stages - 1 and all(isinstance(c, int) and not isinstance(c, bool) for c in cuts)
              and all(isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w < 1e30 for w in layers))
        if not ok:
            raise ReportError(f"pipeline layers must be at most {MAX_LAYERS} relative costs >= 0 and cuts {stages - 1} "
                              f"integer layer indices, got layers {str(layers)[:80]} cuts {str(cuts)[:80]}")
        try:
            return Rebalancer(config, layer_costs=layers, cuts=list(cuts or ()))
        except PlanError as e:
            raise ReportError(f"pipeline layers refused: {e}") from None

    def observation_rejection(self, rows: object) -> Rejection | None:
        """Why one step's latency rows cannot be taken whole, or None."""
        if self.shape is None:
            return Rejection("pipeline", "pipeline latencies before the runtime announced its shape (set_shape)")
        if not isinstance(rows, (list, tuple)) or len(rows) > MAX_ROWS_PER_OBSERVATION:
            return Rejection("pipeline", f"pipeline latencies must be a list of at most {MAX_ROWS_PER_OBSERVATION} "
                                         f"rows, got {type(rows).__name__}")
        stages, replicas, m = self.shape["stages"], self.shape["replicas"], self.shape["microbatches"]
        if rows and type(rows[0]) is tuple and len(rows[0]) == 3 and rows[0][0] == "size":  # noqa: E721
            return self._sizes_rejection(rows, m)
        # Virtual stages: a plan of c chunks per rank (torch's interleaved and V orders, osprey's zero-bubble
        # lanes; c <= MAX_CHUNKS) has c x stages stages; those plans need equal replica counts.
        virtual = MAX_CHUNKS * stages if len(set(replicas)) == 1 else stages
        for row in rows:
            ok = type(row) is tuple and len(row) == 5  # noqa: E721
            if ok:
                k, r, kind, mb, seconds = row
                ok = (_index(k, virtual) and _index(r, replicas[k % stages]) and kind in ("F", "B", "I", "W")
                      and _index(mb, m)
                      and isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                      and math.isfinite(seconds) and 0.0 <= seconds < 1e6)
            if not ok:
                return Rejection("pipeline", f"a pipeline latency row must be (stage, replica, 'F', 'B', 'I' or 'W', "
                                             f"microbatch, seconds) within the announced shape, got {row!r:.120}")
        return None

    @staticmethod
    def _sizes_rejection(rows: Sequence[object], microbatches: int) -> Rejection | None:
        """Why a step's micro-batch sizes (rows ('size', microbatch, relative size), one per micro-batch in
        order) cannot be taken, or None."""
        ok = len(rows) == microbatches and all(
            type(row) is tuple and len(row) == 3 and row[0] == "size" and row[1] == i  # noqa: E721
            and isinstance(row[2], (int, float)) and not isinstance(row[2], bool) and 0.0 < row[2] < 1e6
            for i, row in enumerate(rows))
        return None if ok else Rejection(
            "pipeline", f"pipeline micro-batch sizes must be {microbatches} rows ('size', microbatch, relative size > 0), "
                        f"one per micro-batch in order, got {str(rows)[:120]}")

    def observe(self, step: int, rows: Sequence[tuple]) -> None:
        """Fold one step's latencies (checked by ``observation_rejection``) into the schedule's estimates;
        or, for rows ('size', microbatch, size), tell the schedule step ``step``'s micro-batch sizes
        before its plan is asked for (``ScheduledPlans.tell_sizes``)."""
        assert self.schedule is not None
        if rows and rows[0][0] == "size":
            self.schedule.tell_sizes(step, [float(s) for _, _, s in rows])
            return
        self.schedule.observe([Measurement(k, r, Kind(kind), mb, float(s)) for k, r, kind, mb, s in rows])
        if self.rebalancer is not None:
            ranks = self._stage_ranks.pop(step, None)
            self.rebalancer.observe(step, stage_seconds(rows, self.rebalancer.stages, ranks))
        self.steps_observed += 1

    # -- the protocol -------------------------------------------------------------------------------
    def ingest(self, reports: Sequence[WorkerReport]) -> None:
        """Worker reports carry nothing for this axis (its telemetry is ``observe``'s)."""

    def decide(self, boundary: Boundary, earlier: Mapping[str, Decision]) -> MicroBatchPlan | None:
        if self.schedule is None:
            return None
        t0 = time.perf_counter()
        plan = self.schedule.plan(boundary.first_step)
        record = self.schedule.last_decision
        move = None
        if self.rebalancer is not None:
            if self._move is not None and self._move[0] == boundary.first_step:
                move = self._move[1]  # the step asked for again (a re-plan after a shift): its move stands
            else:
                move = self.rebalancer.decide(boundary.first_step)
                self._move = (boundary.first_step, move)
            # The step's latencies come after the next plan: keep its ranks a few steps (none come for a step
            # whose run failed).
            self._stage_ranks = {t: v for t, v in self._stage_ranks.items() if t > boundary.first_step - 8}
            self._stage_ranks[boundary.first_step] = list(plan.stage_rank) if plan.stage_rank is not None else None
        self.plan_s += time.perf_counter() - t0
        self.plans += 1
        return MicroBatchPlan(version=-1, effective_step=-1, plan=plan,
                              record=record.to_dict() if record is not None else None, layer_move=move)

    def stats(self) -> PipelineAxisStats | None:
        if self.shape is None or self.schedule is None:
            return None
        record = self.schedule.last_decision
        return PipelineAxisStats(schedule=self.pipeline.schedule, stages=self.shape["stages"],
                                 replicas=tuple(self.shape["replicas"]), microbatches=self.shape["microbatches"],
                                 steps_observed=self.steps_observed, plans=self.plans, plan_s=self.plan_s,
                                 observations_rejected=self.observations_rejected,
                                 last_decision=record.to_dict() if record is not None else None,
                                 cuts=self.rebalancer.cuts if self.rebalancer is not None else None,
                                 layer_moves=self.rebalancer.moves if self.rebalancer is not None else 0)

    def state_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "steps_observed": self.steps_observed, "plans": self.plans,
                "schedule": self.schedule.state_dict() if self.schedule is not None else None,
                "rebalance": self.rebalancer.state_dict() if self.rebalancer is not None else None,
                "stage_ranks": [[t, v] for t, v in sorted(self._stage_ranks.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not {"shape", "steps_observed", "schedule"} <= set(state):
            raise StateError("saved pipeline axis state must hold shape, steps_observed and schedule, as "
                             "PipelineDeriver.state_dict() writes it")
        if state["shape"] is None:
            self.shape, self.schedule = None, None
            return
        self.on_shape(state["shape"])
        assert self.schedule is not None
        self.schedule.load_state_dict(state["schedule"])
        self.steps_observed = int(state["steps_observed"])
        self.plans = int(state.get("plans", 0))
        if self.rebalancer is not None and state.get("rebalance") is not None:
            self.rebalancer.load_state_dict(state["rebalance"])
            try:
                self._stage_ranks = {int(t): [int(k) for k in v] if v is not None else None
                                     for t, v in state.get("stage_ranks", [])}
            except (TypeError, ValueError):
                raise StateError("saved pipeline axis stage_ranks must be [step, ranks or null] pairs, as "
                                 "PipelineDeriver.state_dict() writes them") from None


def _index(x: object, n: int) -> bool:
    """An integer (not a bool) in [0, n)."""
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n
