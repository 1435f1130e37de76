"""Ray-actor pipeline runtime: stages x replicas of stage actors, driven by a scheduler's plan.

One actor per (stage, replica) holds a copy of that stage (``pdml_ray.actors.pipeline`` around
``StageWorker``). ``run_step`` asks the scheduler for the step's ``Plan`` and carries it out with the
same ``Dispatcher`` rule the simulator uses: every idle replica asks the dispatcher for its next
action, the driver submits it, and a ``ray.wait`` loop ``complete``s actions as they finish.
Activations and their gradients move between actors as ObjectRefs passed straight into the next
actor call; the driver only fetches each call's small ``CallTiming``. After the last backward every
replica of a stage receives the gradients of all replicas of that stage, sums them in one fixed order
and steps, so the replicas stay identical and the update equals one step of the unsplit model on the
global batch.

Speeds below 1.0 are EMULATED (``pdml_ray.emulation``): the replica sleeps after real compute.
With ``compute="sleep"`` the compute time itself is EMULATED: each action runs the real (small)
forward/backward and then sleeps samples x ``per_sample_s`` / speed (twice that for a backward), so
that many stage actors on a few cores still run at their configured speeds.

Layer re-balancing: where the plans come from the run's scheduler (``ScheduledPlans``, told this runtime's
``layer_costs`` and ``cuts``) with ``PipelineConfig.rebalance`` on, a step whose plan carries a
``LayerMove`` first moves those layers between neighbouring stages (``apply_layer_move``): the layers'
parameters and optimizer state go from one replica of the giving stage to every replica of the
receiving one through the object store, and every replica of both rebuilds its stage, so training goes
on exactly as without the move.

A replica that dies during a step is survived (the step completes on its stage's survivors, with
the same update); how, and when a step fails with ``PipelineFaultError`` instead, is described in
``pdml_ray.runtime.pipeline_faults``, which holds that half of the runtime (``FaultHandling``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import ray
import torch
from ray.exceptions import RayActorError
from torch import Tensor, nn

from pdml_ray.actors.pipeline import DEFAULT_STAGE_NUM_CPUS, launch_stage
from pdml_ray.emulation import COMPUTE_MODES, EMULATION_NOTE, SLEEP_COMPUTE_NOTE, check_speed
from pdml_ray.errors import ConfigError, PlanError, StateError, UsageError
from pdml_ray.metrics import PriorityGauges, export_or_warn
from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.faults import Replan, Reroute, exclude_replicas
from pdml_ray.pipeline.partition import layer_param_counts, split_sequential
from pdml_ray.pipeline.plan import Action, Kind, Measurement, Plan, PlanSource, validate
from pdml_ray.pipeline.rebalance import LayerMove
from pdml_ray.pipeline.stats import PipelineRunStats
from pdml_ray.runtime.pipeline_faults import FaultHandling, PipelineFaultError, _in_ids, _StepState
from pdml_ray.runtime.pipeline_plans import ScheduledPlans

Speeds = Mapping[tuple[int, int], float] | Sequence[Sequence[float]]

DEFAULT_ACTION_TIMEOUT_S = 120.0
"""Longest the driver waits for any running action (or exchange call) to finish before giving up."""


@dataclass(frozen=True)
class StepResult:
    """What one global step did and how long it took (measured on this machine, seconds)."""

    step: int
    step_time_s: float
    """Driver wall time from asking the scheduler for the plan to the last replica's optimizer step."""
    loss: float
    """Mean loss over the global batch (sum of the micro-batches' scaled losses)."""
    measurements: tuple[Measurement, ...]
    """Per action: worker-side latency (real compute + emulated sleep), in completion order."""
    schedule: str = ""
    compute_s: float = 0.0
    """Seconds of real forward/backward compute summed over all actions (CPU work, not wall time)."""
    emulated_s: float = 0.0
    """Seconds of emulated slowdown (sleep) summed over all actions of the step."""
    forward_counts: dict[tuple[int, int], int] = field(default_factory=dict)
    """(stage, replica) -> forwards that ran there (replays after a death included): where the work went."""
    backward_counts: dict[tuple[int, int], int] = field(default_factory=dict)
    """(stage, live replica) -> micro-batches whose gradient that replica contributed to the update;
    per stage they sum to the number of micro-batches (each accounted for exactly once)."""
    reroutes: tuple[Reroute, ...] = ()
    """One per replica that died during this step: where its micro-batches went, what was re-run."""
    replan: Replan | None = None
    """The scheduler's plan moved onto the survivors of earlier deaths (None: no replica was missing)."""
    replicas: tuple[int, ...] = ()
    """Live replicas per stage after the step."""
    layer_move: LayerMove | None = None
    """The layers moved between stages before this step ran (None: none moved)."""


class PipelineRuntime(FaultHandling):
    """Launches ``num_stages`` x replicas stage actors for ``model`` and runs global steps on them."""

    def __init__(self, model: nn.Sequential | Sequence[nn.Module], num_stages: int,
                 replicas_per_stage: int | Sequence[int], loss_fn: Callable[[Tensor, Tensor], Tensor],
                 lr: float = 0.1, speeds: Speeds | None = None, *, cuts: Sequence[int] | None = None,
                 optimizer: Callable[..., torch.optim.Optimizer] | None = None,
                 num_cpus_per_actor: float = DEFAULT_STAGE_NUM_CPUS, name_prefix: str | None = None,
                 compute: str = "real", per_sample_s: float = 0.0,
                 action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S, metrics_name: str | None = "pdml-pipeline") -> None:
        if not ray.is_initialized():
            raise UsageError("PipelineRuntime needs a running Ray cluster: call ray.init() first")
        if compute not in COMPUTE_MODES:
            raise ConfigError(f"compute must be one of {list(COMPUTE_MODES)}, got {compute!r}")
        if compute == "sleep" and not 0.0 < per_sample_s < float("inf"):
            raise ConfigError(f"compute='sleep' needs per_sample_s > 0 seconds per sample (e.g. 0.0005), "
                              f"got {per_sample_s!r}")
        if not 0.0 < action_timeout_s < float("inf"):
            raise ConfigError(f"action_timeout_s must be a positive number of seconds, got {action_timeout_s!r}")
        self.compute, self.per_sample_s = compute, float(per_sample_s)
        self.action_timeout_s = float(action_timeout_s)
        self.num_stages = num_stages
        self.dead: dict[tuple[int, int], int] = {}
        """(stage, replica) -> step at which its death was noticed; dead replicas get no more work."""
        self.replicas: tuple[int, ...] = ((int(replicas_per_stage),) * num_stages
                                          if isinstance(replicas_per_stage, int)
                                          else tuple(int(r) for r in replicas_per_stage))
        if len(self.replicas) != num_stages or min(self.replicas) < 1:
            raise PlanError(f"replicas_per_stage must be a positive int or one positive count per stage "
                            f"({num_stages}), got {replicas_per_stage!r}")
        self.speeds = _speed_table(speeds, self.replicas)
        needed, total = sum(self.replicas) * num_cpus_per_actor, ray.cluster_resources().get("CPU", 0.0)
        if needed > total:  # the actors would wait for resources forever
            raise ConfigError(f"{sum(self.replicas)} stage actors x num_cpus_per_actor={num_cpus_per_actor} need "
                              f"{needed:g} CPUs but the Ray cluster has {total:g}; lower num_cpus_per_actor or "
                              "give Ray more CPUs (ray.init(num_cpus=...))")
        stages = split_sequential(model, num_stages, cuts)
        self.stage_sizes = [len(s) for s in stages]  # layers per stage
        layers = [layer for s in stages for layer in s]
        self._layer_tensors = [len(list(layer.parameters())) for layer in layers]
        self.layer_costs: list[float] = [float(c) for c in layer_param_counts(layers)]
        """Each layer's relative cost for layer re-balancing (its parameter count): announce it with ``cuts``
        to the scheduler (``ScheduledPlans(layers=runtime.layer_costs, cuts=runtime.cuts)``)."""
        # actors[k][r]: replica r of stage k. Ray pickles the module per call: each actor owns a copy.
        self._actors = [[launch_stage(k, r, num_stages, stages[k], loss_fn=loss_fn if k == num_stages - 1 else None,
                                      lr=lr, optimizer=optimizer, speed=self.speeds[(k, r)],
                                      num_cpus=num_cpus_per_actor, compute=compute, per_sample_s=per_sample_s,
                                      name_prefix=name_prefix)
                         for r in range(self.replicas[k])] for k in range(num_stages)]
        ray.get([a.describe.remote() for row in self._actors for a in row])  # fail fast if one cannot start
        self.stats = PipelineRunStats(emulated=self._emulated_tag())
        """This runtime's figures over its steps (``pdml_ray.pipeline.stats``), exported after every step
        as ``pdml_pipeline_*`` metrics tagged ``run=<metrics_name>-<id>`` (``metrics_name=None``: not exported)."""
        self._gauges = PriorityGauges(metrics_name) if metrics_name is not None else None

    @property
    def cuts(self) -> tuple[int, ...]:
        """The first layer of stages 1..S-1 as the stages are cut now."""
        return tuple(itertools.accumulate(self.stage_sizes[:-1]))

    @property
    def _tensors_per_stage(self) -> list[int]:
        edges = [0, *self.cuts, len(self._layer_tensors)]
        return [sum(self._layer_tensors[a:b]) for a, b in zip(edges, edges[1:])]

    @property
    def emulated(self) -> bool:
        return self.compute == "sleep" or any(s < 1.0 for s in self.speeds.values())

    def emulation_note(self) -> str:
        slow = {f"s{k}r{r}": s for (k, r), s in sorted(self.speeds.items()) if s < 1.0}
        if self.compute == "sleep":
            return (f"{SLEEP_COMPUTE_NOTE} (here: {1e3 * self.per_sample_s:g} ms per sample per forward, twice that "
                    f"per backward); slow replicas: {slow or 'none'}")
        return f"{EMULATION_NOTE}; slow replicas: {slow}" if slow else "no emulation: all replicas at full speed"

    # -- one global step --------------------------------------------------------------------------

    def run_step(self, scheduler: PlanSource, inputs: Tensor, targets: Tensor, step: int) -> StepResult:
        """One global step on the batch ``inputs`` (B, ...) / ``targets`` (B, ...) under ``scheduler``'s plan.

        The batch is cut into the plan's micro-batches (``tensor_split``: sizes differ by at most one);
        micro-batch m's loss is scaled by size_m / B. Each completed action becomes a ``Measurement``;
        the step's measurements go to ``scheduler.observe`` once, after the step, as in the simulator
        (``simulate_schedule``): schedulers fold one step at a time into their estimates.
        The step time counts planning too (an adaptive scheduler's decisions are part of its cost).
        A replica that dies is survived (``pdml_ray.runtime.pipeline_faults``); ``PipelineFaultError``
        when a stage has none left. If an action fails otherwise, every live replica drops the step's
        activations and gradients and the error propagates; parameters are unchanged and the next step
        can run.
        """
        start = time.perf_counter()
        plan = scheduler.plan(step)
        self._check_plan(plan)
        lost = [k for k in range(self.num_stages) if not self._alive(k)]
        if lost:
            raise PipelineFaultError(f"step {step}: stage {lost[0]} has no live replica (all of "
                                     f"{self.replicas[lost[0]]} died: {self._deaths(lost[0])}); this runtime "
                                     "cannot run more steps: start a new one")
        move = scheduler.layer_move(step) if isinstance(scheduler, ScheduledPlans) else None
        if move is not None:
            self.apply_layer_move(move)
        m_count, batch = plan.num_microbatches, inputs.shape[0]
        if targets.shape[0] != batch or batch < m_count:
            raise PlanError(f"a batch of {batch} inputs and {targets.shape[0]} targets cannot feed "
                            f"{m_count} micro-batches; use at least one sample per micro-batch")
        replan = exclude_replicas(plan, [self._alive(k) for k in range(self.num_stages)]) if self.dead else None
        xs, ys = inputs.tensor_split(m_count), targets.tensor_split(m_count)
        st = _StepState(step, replan.alive if replan is not None else tuple(tuple(range(n)) for n in self.replicas),
                        [ray.put(y) for y in ys], [x.shape[0] / batch for x in xs])
        for m, x in enumerate(xs):
            st.inputs[(0, m)] = ray.put(x)
        try:
            self._drive(replan.plan if replan is not None else plan, st)
            self._exchange(st)
        except BaseException:
            # Each actor runs this after the calls already queued on it (actor calls run in order).
            try:
                ray.get([self._actors[k][r].discard_step.remote()
                         for k in range(self.num_stages) for r in self._alive(k)], timeout=60)
            except Exception:  # noqa: BLE001 - a dead actor must not hide the original error
                pass
            raise
        step_time_s = time.perf_counter() - start
        scheduler.observe(st.measurements)
        counts = {key: 0 for key in plan.orders}
        for meas in st.measurements:
            if meas.kind is Kind.FORWARD:
                counts[(meas.stage, meas.replica)] += 1
        backward_counts = {(k, r): 0 for k in range(self.num_stages) for r in self._alive(k)}
        for (k, _), r in st.owner.items():  # a replica that died while stepping had delivered its gradients
            backward_counts[(k, r)] = backward_counts.get((k, r), 0) + 1
        self.stats.observe(plan.schedule, step_time_s, st.measurements, sum(self.live_replicas),
                           deaths=len(st.reroutes), reruns=sum(len(r.moved) for r in st.reroutes))
        export_or_warn(self._gauges, self.stats)
        return StepResult(step, step_time_s, sum(st.losses.values()), tuple(st.measurements), plan.schedule,
                          st.compute_s, st.emulated_s, counts, backward_counts, tuple(st.reroutes), replan,
                          self.live_replicas, move)

    def apply_layer_move(self, move: LayerMove) -> None:
        """Move layers between neighbouring stages, between steps: from the first live replica of each giving
        stage, copies of the layers with their optimizer state go to every live replica of the receiving
        stage; every live replica of both rebuilds its stage (``StageWorker.move_layers``). StateError if
        the move was decided for other cuts than this runtime's."""
        if move.cuts_before != self.cuts or move.num_layers != len(self._layer_tensors):
            raise StateError(f"layer move from cuts {list(move.cuts_before)} of {move.num_layers} layers, but this runtime "
                             f"is cut at {list(self.cuts)} of {len(self._layer_tensors)}: announce the runtime's layers "
                             "and cuts to the scheduler (ScheduledPlans(layers=runtime.layer_costs, cuts=runtime.cuts))")
        give = {k: [0, 0] for k in range(self.num_stages)}  # stage -> layers it gives from its [front, back]
        for t in move.transfers():
            give[t.source][0 if t.target < t.source else 1] += t.stop - t.start
        exported: dict[int, Any] = {}
        for k, (front, back) in give.items():
            if front or back:
                call: Any = self._actors[k][self._alive(k)[0]].export_layers.options(num_returns=2)
                exported[k] = call.remote(front, back)  # (front payload, back payload) refs
        calls = []
        for k in range(self.num_stages):
            add_front = exported[k - 1][1] if k - 1 in exported and give[k - 1][1] else None
            add_back = exported[k + 1][0] if k + 1 in exported and give[k + 1][0] else None
            if give[k] != [0, 0] or add_front is not None or add_back is not None:
                # Actor calls run in submission order: each giving replica exported before it drops.
                calls += [self._actors[k][r].move_layers.remote(give[k][0], give[k][1], add_front, add_back)
                          for r in self._alive(k)]
        ray.get(calls, timeout=self.action_timeout_s)
        self.stage_sizes = [b - a for a, b in zip((0, *move.cuts_after), (*move.cuts_after, move.num_layers))]

    def _drive(self, plan: Plan, st: "_StepState") -> None:
        """Run every action of ``plan`` (replica r of stage k is ``st.ids[k][r]``) under the Dispatcher."""
        dispatcher = Dispatcher(plan)
        in_flight: dict[ray.ObjectRef, Action] = {}
        idle = set(plan.orders)
        start = time.perf_counter()
        while not dispatcher.done():
            for key in sorted(idle):
                action = dispatcher.next_action(*key)
                if action is None:
                    continue
                dispatcher.start(action)
                idle.discard(key)
                in_flight[self._submit(action, st.ids[action.stage][action.replica], st)] = action
            if not in_flight:
                raise PlanError(f"step {st.step}: the {plan.schedule or 'plan'} dispatch stalled with work left "
                                "and nothing running (plan not validated?)")
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=self.action_timeout_s)
            if not ready:
                raise PipelineFaultError(f"step {st.step}: no pipeline action finished within action_timeout_s="
                                         f"{self.action_timeout_s:g} s; running: "
                                         f"{sorted(str(a) for a in in_flight.values())}")
            action = in_flight.pop(ready[0])
            k, r = action.stage, st.ids[action.stage][action.replica]
            try:
                timing = ray.get(ready[0])  # raises the actor's error if the call failed
            except RayActorError as err:
                for dk, dr in self._notice_deaths(st, (k, r), err):
                    rank = st.ids[dk].index(dr)
                    reroute = dispatcher.drop_replica(dk, rank, st.step)
                    st.reroutes.append(_in_ids(reroute, st.ids[dk]))
                    idle.discard((dk, rank))
                    for ref, a in list(in_flight.items()):
                        if (a.stage, a.replica) == (dk, rank):
                            del in_flight[ref]  # its call fails too; its work was moved
                continue
            dispatcher.complete(action, at=time.perf_counter() - start)
            idle.add((action.stage, action.replica))
            st.record(Measurement(k, r, action.kind, action.microbatch, timing.latency_s), timing)
            if action.kind is Kind.BACKWARD:
                st.owner[(k, action.microbatch)] = r
        missing = [key for key, r in st.owner.items() if (key[0], r) in self.dead]
        if missing:  # drop_replica re-runs everything a dead replica held: a bug if this fires
            raise PipelineFaultError(f"step {st.step}: gradients of (stage, micro-batch) {missing} are on dead replicas")

    def _submit(self, action: Action, replica: int, st: "_StepState") -> ray.ObjectRef:
        """Submit ``action`` to replica ``replica`` (a launch-time id) of its stage; returns its CallTiming's ref.

        Inputs and gradients are looked up in ``st`` and kept there for the whole step, so that a
        micro-batch can be re-run on another replica if this one dies.
        """
        k, m = action.stage, action.microbatch
        actor = self._actors[k][replica]
        last = k == self.num_stages - 1
        if action.kind is Kind.FORWARD:
            call: Any = actor.forward.options(num_returns=2)
            x = st.inputs[(k, m)]
            out, timing = call.remote(m, x, st.y_refs[m], st.scales[m]) if last else call.remote(m, x)
            if not last:
                st.inputs[(k + 1, m)] = out
        else:
            backward: Any = actor.backward.options(num_returns=2)
            grad_input, timing = backward.remote(m, None if last else st.grad_outputs[(k, m)])
            if k > 0:
                st.grad_outputs[(k - 1, m)] = grad_input
        return timing

    def _exchange(self, st: "_StepState") -> None:
        """Every live replica of a stage sums the stage's live replicas' gradients (same order everywhere),
        then, once every stage has summed, all step. A replica found dead meanwhile: its micro-batches
        are re-run on survivors of its stage (``_make_up``) and that stage sums again."""
        todo = list(range(self.num_stages))
        for _ in range(sum(self.replicas) + 1):  # every round that does not finish loses a replica
            if not todo:
                break
            calls: dict[ray.ObjectRef, tuple[int, int]] = {}
            for k in todo:
                alive = self._alive(k)
                grads = [self._actors[k][r].grads.remote() for r in alive]
                calls.update({self._actors[k][r].sum_grads.remote(*grads): (k, r) for r in alive})
            failed = self._settle(st, calls, "summing gradients")
            if not failed:
                break
            err = next(iter(failed.values()))
            dead = self._dead_among(sorted(failed))
            if not dead:
                raise err
            self._mark_dead_mid_step(dead, st.step, err, " during the gradient exchange")
            todo = []
            for k in sorted({k for k, _ in failed}):
                if any((k, r) in failed for r in self._alive(k)):  # survivors did not sum: a gradient is missing
                    self._make_up(st, k)
                    todo.append(k)
        else:
            raise PipelineFaultError(f"step {st.step}: the gradient exchange did not settle")
        calls = {self._actors[k][r].step.remote(): (k, r) for k in range(self.num_stages) for r in self._alive(k)}
        for (k, r), err in self._settle(st, calls, "stepping").items():
            if not isinstance(err, RayActorError):
                raise err
            self._mark_dead([(k, r)], st.step)  # it had summed: its stage's survivors hold every gradient

    @property
    def live_replicas(self) -> tuple[int, ...]:
        """Live replicas per stage (``replicas`` is what the runtime was launched with, and what plans use)."""
        return tuple(len(self._alive(k)) for k in range(self.num_stages))

    def inject_death(self, stage: int, replica: int, call: str, microbatch: int | None = None) -> None:
        """TEST-ONLY fault injection: replica ``replica`` of ``stage`` exits its process (``os._exit``) when it
        next starts ``call`` ('F' or 'B' of ``microbatch``, or 'grads' in the gradient exchange)."""
        ray.get(self._actors[stage][replica].die_at.remote(call, microbatch))

    def _check_plan(self, plan: Plan) -> None:
        if plan.num_stages != self.num_stages or tuple(plan.replicas) != self.replicas:
            raise PlanError(f"plan is for {plan.num_stages} stages x replicas {list(plan.replicas)} but the runtime "
                            f"has {self.num_stages} stages x replicas {list(self.replicas)}; build the scheduler "
                            "with the runtime's stages and replicas")
        if plan.split_backward or plan.stage_rank is not None:
            raise PlanError(f"plan {plan.schedule!r} has split backward (I, W) or virtual stages, which the Ray-actor "
                            "runtime does not run; give it a plan of F and B with one stage per rank")
        validate(plan)

    # -- parameters and lifetime ------------------------------------------------------------------

    def _live_keys(self) -> set[tuple[int, int]]:
        return {(k, r) for k in range(self.num_stages) for r in self._alive(k)}

    def parameters(self, replica: int = 0) -> list[Tensor]:
        """The full model's parameters in ``model.parameters()`` order, taken from ``replica`` of each stage
        (or its first live replica where ``replica`` is dead or missing)."""
        picks = [replica if (k, replica) in self._live_keys() else self._alive(k)[0] for k in range(self.num_stages)]
        per_stage: list[list[Tensor]] = ray.get([self._actors[k][r].get_parameters.remote() for k, r in enumerate(picks)])
        return [p for stage in per_stage for p in stage]

    def set_parameters(self, params: Sequence[Tensor]) -> None:
        """Load the full model's parameters (``model.parameters()`` order) into every replica; resets optimizers."""
        sizes = self._tensors_per_stage
        if sum(sizes) != len(params):
            raise StateError(f"set_parameters got {len(params)} tensors; the model has {sum(sizes)} "
                             "(pass them in model.parameters() order)")
        calls, offset = [], 0
        for k, n in enumerate(sizes):
            chunk = ray.put([p.detach().cpu() for p in params[offset:offset + n]])
            calls += [self._actors[k][r].set_parameters.remote(chunk) for r in self._alive(k)]
            offset += n
        ray.get(calls)

    def replicas_identical(self) -> bool:
        """True when every live replica of every stage holds bitwise the same parameters."""
        for k in range(self.num_stages):
            copies: list[list[Tensor]] = ray.get([self._actors[k][r].get_parameters.remote() for r in self._alive(k)])
            if any(not torch.equal(p, q) for c in copies[1:] for p, q in zip(copies[0], c)):
                return False
        return True

    def set_speed(self, stage: int, replica: int, speed: float) -> None:
        """Change one replica's EMULATED speed factor (0, 1]."""
        ray.get(self._actors[stage][replica].set_speed.remote(speed))
        self.speeds[(stage, replica)] = float(speed)
        self.stats.emulated = self._emulated_tag()

    def _emulated_tag(self) -> str:
        """The ``emulated`` tag of this runtime's series: what its step times EMULATE."""
        emulated = [what for what, on in (("compute", self.compute == "sleep"),
                                          ("speeds", any(v < 1.0 for v in self.speeds.values()))) if on]
        return ",".join(emulated) or "none"

    def shutdown(self) -> None:
        if self._gauges is not None:
            self._gauges.close()
        for row in self._actors:
            for actor in row:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - a dead actor is already gone
                    pass
        self._actors = []

    def __enter__(self) -> "PipelineRuntime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _speed_table(speeds: Speeds | None, replicas: tuple[int, ...]) -> dict[tuple[int, int], float]:
    """{(stage, replica): speed} for every replica; missing entries run at 1.0."""
    table = {(k, r): 1.0 for k, n in enumerate(replicas) for r in range(n)}
    if speeds is None:
        return table
    given = (dict(speeds) if isinstance(speeds, Mapping)
             else {(k, r): s for k, row in enumerate(speeds) for r, s in enumerate(row)})
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise PlanError(f"speeds name replicas {unknown} that do not exist (replicas per stage {list(replicas)})")
    for key, s in given.items():
        table[key] = check_speed(s, f"speed of stage {key[0]} replica {key[1]}")
    return table
