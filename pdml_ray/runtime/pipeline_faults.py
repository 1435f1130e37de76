"""Pipeline runtime faults: surviving replicas that die during a step, and the step state that allows it.

``PipelineRuntime`` (``pdml_ray.runtime.pipeline``) drives a step; this module holds what it needs to
survive a death: ``_StepState`` (every ref the driver keeps until the optimizer step), ``FaultHandling``
(its methods that notice dead replicas and re-run their micro-batches on survivors), the reroute
bookkeeping in launch-time ids (``_in_ids``) and ``PipelineFaultError``.

A replica that dies (its call fails with ``RayActorError``: a crash, an OOM kill, ``ray.kill``) is
noticed, never waited on; the step completes on the survivors of its stage and its update equals
the one without the death. The driver keeps, until the step's optimizer step, the ObjectRef of every
stage's input activations and output gradient of every micro-batch (boundary tensors only, in the
object store; the autograd state stays in the actors), so any micro-batch can be re-run at any
stage. Which ones are re-run is decided wholesale (``Dispatcher.drop_replica``,
``pdml_ray.pipeline.faults``): the dead replica's accumulated gradients died with it, so EVERY
micro-batch it held at its stage this step runs its forward and backward again on a survivor,
whether it had not started, had run its forward there (a replayed forward, from the kept inputs)
or had finished its backward there (a redone backward: its gradient was lost). Its consumers that
already used its outputs keep them (the replicas hold identical parameters, so a replay produces
the same values); those not started yet wait for the re-run. After a death the rest of the step
runs as dataflow (no deadlock, memory limit not enforced). A death noticed during the gradient
exchange is handled the same way: the exchange sums first (``sum_grads``) and steps only once
every stage has summed, and a stage whose sum lacks a dead replica's gradients has the micro-batches
that replica held re-run on survivors first. The runtime tracks which replica holds each
(stage, micro-batch)'s gradient and checks before stepping that each is held by exactly one live
replica (``StepResult.backward_counts``). Later steps exclude the dead replica: the scheduler's
plan is moved onto the survivors (``exclude_replicas``; ``StepResult.replan`` is the plan that
ran, with fewer replicas); measurements keep the launch-time replica ids. When a stage has no
replica left, ``PipelineFaultError`` names the stage and the step; every wait is bounded
(``action_timeout_s``), so a hung actor is an error too, never a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError

from pdml_ray.errors import PDMLError
from pdml_ray.pipeline.faults import Reroute, pick_survivor
from pdml_ray.pipeline.plan import Action, Kind, Measurement


class PipelineFaultError(PDMLError, RuntimeError):
    """A step cannot complete: every replica of a stage died, or nothing finished within the timeout."""


@dataclass
class _StepState:
    """What the driver keeps during one step; every ref is held until the step's optimizer step."""

    step: int
    ids: tuple[tuple[int, ...], ...]
    """Per stage, the launch-time id of the plan's replica r (identity unless replicas died before)."""
    y_refs: list[ray.ObjectRef]
    scales: list[float]
    inputs: dict[tuple[int, int], ray.ObjectRef] = field(default_factory=dict)
    """(stage, micro-batch) -> that stage's input activations (stage 0: the micro-batch itself)."""
    grad_outputs: dict[tuple[int, int], ray.ObjectRef] = field(default_factory=dict)
    """(stage, micro-batch) -> d loss / d that stage's output (from the next stage's backward)."""
    owner: dict[tuple[int, int], int] = field(default_factory=dict)
    """(stage, micro-batch) -> the replica whose accumulated gradients hold that micro-batch's."""
    losses: dict[int, float] = field(default_factory=dict)
    """Micro-batch -> its scaled loss (a replayed last-stage forward overwrites, never adds)."""
    measurements: list[Measurement] = field(default_factory=list)
    reroutes: list[Reroute] = field(default_factory=list)
    compute_s: float = 0.0
    emulated_s: float = 0.0

    def record(self, measurement: Measurement, timing: Any, replay: bool = False) -> None:
        self.measurements.append(measurement)
        self.compute_s += timing.compute_s
        self.emulated_s += timing.emulated_s
        if timing.loss is not None and not replay:
            self.losses[measurement.microbatch] = timing.loss


def _in_ids(reroute: Reroute, ids: tuple[int, ...]) -> Reroute:
    """``reroute`` (in the running plan's replica numbers of its stage) in launch-time replica ids."""
    return replace(reroute, replica=ids[reroute.replica], moved=tuple((m, ids[r]) for m, r in reroute.moved))


class FaultHandling:
    """The fault-handling half of ``PipelineRuntime``: notice replicas that died (and kill them), wait on
    calls with a bound, re-run on survivors the micro-batches a dead replica held. A mixin: the state
    below is the runtime's, set up by ``PipelineRuntime.__init__``."""

    num_stages: int
    replicas: tuple[int, ...]
    dead: dict[tuple[int, int], int]
    action_timeout_s: float
    _actors: list[list[Any]]

    if TYPE_CHECKING:
        def _submit(self, action: Action, replica: int, st: "_StepState") -> ray.ObjectRef: ...

    def _notice_deaths(self, st: "_StepState", suspect: tuple[int, int], err: Exception) -> list[tuple[int, int]]:
        """After a ``RayActorError`` from ``suspect``'s call: the replicas now dead, marked in ``self.dead``.

        Pings ``suspect`` (and, if it answers, every live replica: the error came from elsewhere); a
        replica whose ping fails with ``RayActorError`` is dead (and killed, so it cannot come back
        with stale parameters). Raises ``PipelineFaultError`` if a stage has no replica left, and
        re-raises the original error if nobody is found dead.
        """
        dead = self._dead_among([suspect])
        if not dead:
            dead = self._dead_among([(k, r) for k in range(self.num_stages) for r in self._alive(k)])
        if not dead:
            raise err
        self._mark_dead_mid_step(dead, st.step, err)
        return dead

    def _mark_dead(self, keys: list[tuple[int, int]], step: int) -> None:
        """Record deaths noticed at ``step`` and kill the actors, so that none comes back with stale parameters."""
        for k, r in keys:
            self.dead.setdefault((k, r), step)
            try:
                ray.kill(self._actors[k][r])
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _mark_dead_mid_step(self, keys: list[tuple[int, int]], step: int, err: BaseException,
                            during: str = "") -> None:
        """``_mark_dead``, then ``PipelineFaultError`` (from ``err``, the failed call's error) when one of
        their stages has no replica left: the step cannot complete (``during``: where, for the message)."""
        self._mark_dead(keys, step)
        for k in sorted({k for k, _ in keys}):
            if not self._alive(k):
                raise PipelineFaultError(f"step {step}: every replica of stage {k} died ({self._deaths(k)}){during}; "
                                         "the step cannot complete and this runtime cannot run more steps") from err

    def _dead_among(self, keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Which of the replicas ``keys`` fail a ping with ``RayActorError`` (bounded by ``action_timeout_s``)."""
        refs = {self._actors[k][r].describe.remote(): (k, r) for k, r in keys}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.action_timeout_s)
        dead = []
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                dead.append(refs[ref])
        return sorted(dead)

    def _settle(self, st: "_StepState", calls: dict[ray.ObjectRef, tuple[int, int]],
                what: str) -> dict[tuple[int, int], Exception]:
        """Wait (bounded) for ``calls``; (stage, replica) -> error of each that failed."""
        ready, not_ready = ray.wait(list(calls), num_returns=len(calls), timeout=self.action_timeout_s)
        if not_ready:
            raise PipelineFaultError(f"step {st.step}: replicas {sorted(calls[r] for r in not_ready)} did not finish "
                                     f"{what} within action_timeout_s={self.action_timeout_s:g} s")
        failed: dict[tuple[int, int], Exception] = {}
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - sorted out by the caller
                failed[calls[ref]] = e
        return failed

    def _make_up(self, st: "_StepState", k: int) -> None:
        """Re-run, on live replicas of stage ``k``, every micro-batch whose gradient there was on a dead one."""
        for _ in range(self.replicas[k]):
            lost = sorted(m for (kk, m), r in st.owner.items() if kk == k and (k, r) in self.dead)
            if not lost:
                return
            alive = self._alive(k)
            if not alive:
                raise PipelineFaultError(f"step {st.step}: every replica of stage {k} died ({self._deaths(k)}) "
                                         "during the gradient exchange; the step cannot complete")
            load = {r: 0 for r in alive}
            calls: dict[ray.ObjectRef, tuple[int, Action]] = {}
            by_dead: dict[int, list[tuple[int, int]]] = {}
            for m in lost:
                r = pick_survivor(load)
                load[r] += 1
                by_dead.setdefault(st.owner[(k, m)], []).append((m, r))
                for kind in (Kind.FORWARD, Kind.BACKWARD):  # one caller's calls to an actor run in order: F, then its B
                    a = Action(k, r, kind, m)
                    calls[self._submit(a, r, st)] = (r, a)
            for dead_r, moved in sorted(by_dead.items()):
                ms = tuple(m for m, _ in moved)
                st.reroutes.append(Reroute(st.step, k, dead_r, tuple(moved), ms, ms, "exchange"))
            ready, not_ready = ray.wait(list(calls), num_returns=len(calls), timeout=self.action_timeout_s)
            if not_ready:
                raise PipelineFaultError(f"step {st.step}: re-running stage {k}'s lost micro-batches did not finish "
                                         f"within action_timeout_s={self.action_timeout_s:g} s")
            for ref in ready:
                r, a = calls[ref]
                try:
                    timing = ray.get(ref)
                except RayActorError:
                    if self._dead_among([(k, r)]):
                        self._mark_dead([(k, r)], st.step)
                        continue
                    raise
                st.record(Measurement(k, r, a.kind, a.microbatch, timing.latency_s), timing, replay=True)
                if a.kind is Kind.BACKWARD and (k, r) not in self.dead:
                    st.owner[(k, a.microbatch)] = r
        raise PipelineFaultError(f"step {st.step}: stage {k}'s lost micro-batches could not be re-run")

    def _alive(self, stage: int) -> list[int]:
        """Live replicas of ``stage`` (launch-time ids), ascending."""
        return [r for r in range(self.replicas[stage]) if (stage, r) not in self.dead]

    def _deaths(self, stage: int) -> str:
        return ", ".join(f"replica {r} at step {s}" for (k, r), s in sorted(self.dead.items()) if k == stage)
