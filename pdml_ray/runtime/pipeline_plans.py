"""The pipeline runtime's client of the run's scheduler: every step's plan from its ``pipeline`` axis.

``ScheduledPlans`` is what ``PipelineRuntime.run_step`` plans with: ``plan(step)`` returns the scheduler's
``MicroBatchPlan`` for that step, ``observe(measurements)`` sends the step's action latencies back. It
reaches the scheduler through ``SchedulerClient``, by default over the run's named Ray actor (so the run
shows in ``pdml-ray status``, the metrics and the dashboard like a Ray Train run), or in this process
(``in_process=True``, for when planning latency matters: the same calls on the same code path, answered
synchronously).

Planning never sits on the step's critical path: ``plan(t)`` takes the plan requested at the previous
step and at once requests step t+1's, which the scheduler derives while step t runs. Step t's latencies
are sent after it, so the plan of t+1 rests on measurements through step t-1 (an adaptive schedule sees
one step late; ``pdml-ray bench pipeline`` measures what that costs). With
``OspreyConfig.replan_on_shift``, a step that ran far from its plan's prediction (a replica throttled or
recovered: ``pdml_ray.pipeline.prediction``) has the next step's plan asked for again after its
latencies, and that step waits for it (``replans`` counts them). ``wait_s`` is the driver's time
blocked waiting for plans; with the actor it is the part of planning (plus the call) that step t did
not hide, and the whole of each re-plan.

If the scheduler cannot be reached (restarting, gone), the runtime keeps running the newest plan it has
(``fallbacks`` counts those steps): a plan is a placement and an order, valid for any step of the same
shape.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pdml_ray.actors.scheduler_transport import RunScheduler
from pdml_ray.client import PlansAhead
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import MicroBatchPlan
from pdml_ray.errors import ConfigError, SchedulerUnavailableError
from pdml_ray.pipeline.plan import DecisionRecord, Measurement, Plan
from pdml_ray.pipeline.rebalance import LayerMove
from pdml_ray.pipeline.sizes import check_sizes
from pdml_ray.scheduler import Scheduler


class _Record:
    """The schedule's decision record as it came over the wire (a dict): ``last_decision`` for callers."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


class ScheduledPlans:
    """Plans from the ``pipeline`` axis of the run's scheduler, fetched one step ahead."""

    def __init__(self, config: PDMLConfig, *, stages: int, replicas: int | Sequence[int], microbatches: int,
                 in_process: bool = False, layers: Sequence[float] | None = None,
                 cuts: Sequence[int] | None = None) -> None:
        """``layers`` (a relative cost per layer) and ``cuts`` (the first layer of stages 1..S-1) announce the
        model's layers for layer re-balancing (``PipelineConfig.rebalance``; ``layer_move`` says when)."""
        if config.pipeline is None:
            raise ConfigError("the pipeline runtime plans with the scheduler's pipeline axis: set "
                              "PDMLConfig(pipeline=PipelineConfig(schedule=...))")
        reps = [int(replicas)] * stages if isinstance(replicas, int) else [int(r) for r in replicas]
        self.name = config.pipeline.schedule
        self.shape: dict[str, Any] = {"stages": int(stages), "replicas": reps, "microbatches": int(microbatches)}
        if layers is not None or cuts is not None:
            self.shape.update(layers=[float(w) for w in layers or ()], cuts=[int(c) for c in cuts or ()])
        self.microbatches = int(microbatches)
        self._sizes: dict[int, tuple[float, ...]] = {}  # step -> micro-batch sizes told, sent with its request
        self._run = RunScheduler(config, sum(reps), in_process=in_process, name_prefix="pdml-pipeline")
        self.config, self.client = self._run.config, self._run.client
        self.scheduler: Scheduler | None = self._run.scheduler
        self.client.call("set_shape", "pipeline", self.shape)
        self.wait_s = 0.0
        """Seconds the driver was blocked waiting for plans, summed over steps."""
        self.steps = 0
        osprey = config.pipeline.osprey
        self.ahead = PlansAhead(self.client, osprey.jump_threshold if osprey.replan_on_shift else 0.0,
                                before_request=self._send_sizes)
        """The fetch one step ahead, and its counts (``fallbacks``, ``replans``)."""
        self.last_decision: DecisionRecord | None = None
        self._step = -1

    @property
    def scheduler_name(self) -> str | None:
        """The scheduler actor's name (``pdml-ray status --name``), None in-process."""
        return self._run.name

    def tell_sizes(self, step: int, sizes: Sequence[float]) -> None:
        """Step ``step``'s micro-batch sizes, relative to the nominal micro-batch (its tokens over the
        nominal micro-batch's, say; ``pdml_ray.pipeline.sizes``), for the schedule to plan that step
        with (osprey predicts each micro-batch's cost from its size and keeps the sum of held sizes
        within the memory limit; static schedules ignore them). They go to the scheduler just before
        the step's plan is requested, which is one step ahead: tell step t + 1's before ``plan(t)`` (a
        data loader that prefetches a batch), and steps 0 and 1's before ``plan(0)``; sizes told later
        than that are dropped."""
        self._sizes[int(step)] = check_sizes(sizes, self.microbatches)

    @property
    def decision(self) -> MicroBatchPlan | None:
        """The newest decision the scheduler sent."""
        return self.ahead.decision

    @property
    def fallbacks(self) -> int:
        """Steps that ran the newest plan again because the scheduler's answer did not come."""
        return self.ahead.fallbacks

    @property
    def replans(self) -> int:
        """Steps whose plan was asked for again after the step before ran far from its prediction."""
        return self.ahead.replans

    def _send_sizes(self, step: int) -> None:
        """Step ``step``'s micro-batch sizes told, to the scheduler just before its plan is asked for."""
        sizes = self._sizes.pop(step, None)
        self._sizes = {t: v for t, v in self._sizes.items() if t > step}
        if sizes is not None:
            self.client.observe("pipeline", step, [("size", m, s) for m, s in enumerate(sizes)])

    def plan(self, step: int) -> Plan:
        """Step ``step``'s plan (requested one step ahead); step ``step + 1``'s is requested before it returns."""
        t0 = time.perf_counter()
        decision = self.ahead.take(step)
        if decision is not None:
            self.last_decision = _Record(dict(decision.record)) if decision.record is not None else None
        if self.ahead.decision is None:
            raise SchedulerUnavailableError(f"no plan for step {step} from the pdml-ray scheduler (pipeline axis); "
                                            "check that its actor is alive (`pdml-ray status`)")
        self._step = step
        self.wait_s += time.perf_counter() - t0
        self.steps += 1
        return self.ahead.decision.plan

    def layer_move(self, step: int) -> LayerMove | None:
        """The layers that move between stages before step ``step`` (carried in its plan), or None."""
        move = self.decision.layer_move if self.decision is not None and self._step == step else None
        return move if move is not None and move.effective_step == step else None

    def observe(self, measurements: Sequence[Measurement]) -> None:
        """The planned step's action latencies, to the scheduler (fire-and-forget). Where they ran far from
        the plan's prediction (``replan_on_shift``), the next step's plan is asked for again after them."""
        rows = [(m.stage, m.replica, m.kind.value, m.microbatch, float(m.latency_s)) for m in measurements]
        self.ahead.observe(self._step, rows)

    def stats(self) -> Any:
        """The scheduler's stats record (its ``pipeline`` axis among them)."""
        return self.client.call("stats")

    def close(self) -> None:
        """End the run's scheduler actor (its snapshot deleted first); in-process there is nothing to end."""
        self._run.close()

