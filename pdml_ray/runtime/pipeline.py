"""Ray-actor pipeline runtime: stages x replicas of stage actors, driven by a scheduler's plan.

One actor per (stage, replica) holds a copy of that stage (``pdml_ray.actors.stage`` around
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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import ray
import torch
from torch import Tensor, nn

from pdml_ray.actors.stage import DEFAULT_STAGE_NUM_CPUS, launch_stage
from pdml_ray.emulation import COMPUTE_MODES, EMULATION_NOTE, SLEEP_COMPUTE_NOTE, check_speed
from pdml_ray.errors import ConfigError, PlanError, StateError, UsageError
from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.partition import split_sequential
from pdml_ray.pipeline.plan import Action, Kind, Measurement, PipelineScheduler, Plan, validate

Speeds = Mapping[tuple[int, int], float] | Sequence[Sequence[float]]


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
    """(stage, replica) -> micro-batches whose forward ran there: where the plan put the work."""


class PipelineRuntime:
    """Launches ``num_stages`` x replicas stage actors for ``model`` and runs global steps on them."""

    def __init__(self, model: nn.Sequential | Sequence[nn.Module], num_stages: int,
                 replicas_per_stage: int | Sequence[int], loss_fn: Callable[[Tensor, Tensor], Tensor],
                 lr: float = 0.1, speeds: Speeds | None = None, *, cuts: Sequence[int] | None = None,
                 optimizer: Callable[..., torch.optim.Optimizer] | None = None,
                 num_cpus_per_actor: float = DEFAULT_STAGE_NUM_CPUS, name_prefix: str | None = None,
                 compute: str = "real", per_sample_s: float = 0.0) -> None:
        if not ray.is_initialized():
            raise UsageError("PipelineRuntime needs a running Ray cluster: call ray.init() first")
        if compute not in COMPUTE_MODES:
            raise ConfigError(f"compute must be one of {list(COMPUTE_MODES)}, got {compute!r}")
        if compute == "sleep" and not 0.0 < per_sample_s < float("inf"):
            raise ConfigError(f"compute='sleep' needs per_sample_s > 0 seconds per sample (e.g. 0.0005), "
                              f"got {per_sample_s!r}")
        self.compute, self.per_sample_s = compute, float(per_sample_s)
        self.num_stages = num_stages
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
        self._tensors_per_stage = [len(list(s.parameters())) for s in stages]
        # actors[k][r]: replica r of stage k. Ray pickles the module per call: each actor owns a copy.
        self._actors = [[launch_stage(k, r, num_stages, stages[k], loss_fn=loss_fn if k == num_stages - 1 else None,
                                      lr=lr, optimizer=optimizer, speed=self.speeds[(k, r)],
                                      num_cpus=num_cpus_per_actor, compute=compute, per_sample_s=per_sample_s,
                                      name_prefix=name_prefix)
                         for r in range(self.replicas[k])] for k in range(num_stages)]
        ray.get([a.describe.remote() for row in self._actors for a in row])  # fail fast if one cannot start

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

    def run_step(self, scheduler: PipelineScheduler, inputs: Tensor, targets: Tensor, step: int) -> StepResult:
        """One global step on the batch ``inputs`` (B, ...) / ``targets`` (B, ...) under ``scheduler``'s plan.

        The batch is cut into the plan's micro-batches (``tensor_split``: sizes differ by at most one);
        micro-batch m's loss is scaled by size_m / B. Each completed action becomes a ``Measurement``;
        the step's measurements go to ``scheduler.observe`` once, after the step, as in the simulator
        (``simulate_schedule``): schedulers fold one step at a time into their estimates.
        The step time counts planning too (an adaptive scheduler's decisions are part of its cost).
        If an action fails, every replica drops the step's activations and gradients and the error
        propagates; parameters are unchanged and the next step can run.
        """
        start = time.perf_counter()
        plan = scheduler.plan(step)
        self._check_plan(plan)
        m_count, batch = plan.num_microbatches, inputs.shape[0]
        if targets.shape[0] != batch or batch < m_count:
            raise PlanError(f"a batch of {batch} inputs and {targets.shape[0]} targets cannot feed "
                            f"{m_count} micro-batches; use at least one sample per micro-batch")
        xs, ys = inputs.tensor_split(m_count), targets.tensor_split(m_count)
        scales = [x.shape[0] / batch for x in xs]
        x_refs, y_refs = [ray.put(x) for x in xs], [ray.put(y) for y in ys]
        measurements: list[Measurement] = []
        try:
            loss, compute_s, emulated_s = self._drive(plan, step, x_refs, y_refs, scales, measurements)
        except BaseException:
            # Each actor runs this after the calls already queued on it (actor calls run in order).
            try:
                ray.get([a.discard_step.remote() for row in self._actors for a in row], timeout=60)
            except Exception:  # noqa: BLE001 - a dead actor must not hide the original error
                pass
            raise
        self._sum_grads_and_step()
        step_time_s = time.perf_counter() - start
        scheduler.observe(measurements)
        counts = {key: 0 for key in plan.orders}
        for m in measurements:
            if m.kind is Kind.FORWARD:
                counts[(m.stage, m.replica)] += 1
        return StepResult(step, step_time_s, loss, tuple(measurements), plan.schedule, compute_s, emulated_s, counts)

    def _drive(self, plan: Plan, step: int, x_refs: list[ray.ObjectRef], y_refs: list[ray.ObjectRef],
               scales: list[float], measurements: list[Measurement]) -> tuple[float, float, float]:
        """Run every action of ``plan`` under the Dispatcher; returns (loss, compute_s, emulated_s) sums."""
        dispatcher = Dispatcher(plan)
        # (stage, microbatch) -> ObjectRef of that stage's output activations / input gradient.
        outputs: dict[tuple[int, int], ray.ObjectRef] = {}
        input_grads: dict[tuple[int, int], ray.ObjectRef] = {}
        in_flight: dict[ray.ObjectRef, Action] = {}
        idle = set(plan.orders)
        loss, compute_s, emulated_s = 0.0, 0.0, 0.0
        start = time.perf_counter()
        while not dispatcher.done():
            for key in sorted(idle):
                action = dispatcher.next_action(*key)
                if action is None:
                    continue
                dispatcher.start(action)
                idle.discard(key)
                in_flight[self._submit(action, x_refs, y_refs, scales, outputs, input_grads)] = action
            if not in_flight:
                raise PlanError(f"step {step}: the {plan.schedule or 'plan'} dispatch stalled with work left "
                                "and nothing running (plan not validated?)")
            (ready,), _ = ray.wait(list(in_flight), num_returns=1)
            action = in_flight.pop(ready)
            timing = ray.get(ready)  # raises the actor's error if the call failed
            dispatcher.complete(action, at=time.perf_counter() - start)
            idle.add((action.stage, action.replica))
            if timing.loss is not None:
                loss += timing.loss
            compute_s += timing.compute_s
            emulated_s += timing.emulated_s
            measurements.append(Measurement(action.stage, action.replica, action.kind, action.microbatch,
                                            timing.latency_s))
        return loss, compute_s, emulated_s

    def _submit(self, action: Action, x_refs: list[ray.ObjectRef], y_refs: list[ray.ObjectRef], scales: list[float],
                outputs: dict[tuple[int, int], ray.ObjectRef],
                input_grads: dict[tuple[int, int], ray.ObjectRef]) -> ray.ObjectRef:
        """Submit ``action`` to its actor; returns the ref of its CallTiming."""
        k, m = action.stage, action.microbatch
        actor = self._actors[k][action.replica]
        last = k == self.num_stages - 1
        if action.kind is Kind.FORWARD:
            # The producer's ref is dropped here: the submitted call holds it until it has run.
            x = x_refs[m] if k == 0 else outputs.pop((k - 1, m))
            call: Any = actor.forward.options(num_returns=2)
            out, timing = call.remote(m, x, y_refs[m], scales[m]) if last else call.remote(m, x)
            if not last:
                outputs[(k, m)] = out
        else:
            grad_output = None if last else input_grads.pop((k + 1, m))
            backward: Any = actor.backward.options(num_returns=2)
            grad_input, timing = backward.remote(m, grad_output)
            if k > 0:
                input_grads[(k, m)] = grad_input
        return timing

    def _sum_grads_and_step(self) -> None:
        """Every replica of a stage sums all replicas' gradients (same order everywhere) and steps."""
        done = []
        for row in self._actors:
            grads = [a.grads.remote() for a in row]
            done += [a.sum_grads_and_step.remote(*grads) for a in row]
        ray.get(done)

    def _check_plan(self, plan: Plan) -> None:
        if plan.num_stages != self.num_stages or tuple(plan.replicas) != self.replicas:
            raise PlanError(f"plan is for {plan.num_stages} stages x replicas {list(plan.replicas)} but the runtime "
                            f"has {self.num_stages} stages x replicas {list(self.replicas)}; build the scheduler "
                            "with the runtime's stages and replicas")
        validate(plan)

    # -- parameters and lifetime ------------------------------------------------------------------

    def parameters(self, replica: int = 0) -> list[Tensor]:
        """The full model's parameters in ``model.parameters()`` order, taken from ``replica`` of each stage."""
        per_stage: list[list[Tensor]] = ray.get([row[min(replica, len(row) - 1)].get_parameters.remote() for row in self._actors])
        return [p for stage in per_stage for p in stage]

    def set_parameters(self, params: Sequence[Tensor]) -> None:
        """Load the full model's parameters (``model.parameters()`` order) into every replica; resets optimizers."""
        sizes = self._tensors_per_stage
        if sum(sizes) != len(params):
            raise StateError(f"set_parameters got {len(params)} tensors; the model has {sum(sizes)} "
                             "(pass them in model.parameters() order)")
        calls, offset = [], 0
        for row, n in zip(self._actors, sizes):
            chunk = ray.put([p.detach().cpu() for p in params[offset:offset + n]])
            calls += [a.set_parameters.remote(chunk) for a in row]
            offset += n
        ray.get(calls)

    def replicas_identical(self) -> bool:
        """True when every replica of every stage holds bitwise the same parameters."""
        for row in self._actors:
            copies: list[list[Tensor]] = ray.get([a.get_parameters.remote() for a in row])
            if any(not torch.equal(p, q) for c in copies[1:] for p, q in zip(copies[0], c)):
                return False
        return True

    def set_speed(self, stage: int, replica: int, speed: float) -> None:
        """Change one replica's EMULATED speed factor (0, 1]."""
        ray.get(self._actors[stage][replica].set_speed.remote(speed))
        self.speeds[(stage, replica)] = float(speed)

    def shutdown(self) -> None:
        for row in self._actors:
            for actor in row:
                ray.kill(actor)
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
