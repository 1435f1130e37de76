"""A pipeline stage replica dies: the step completes on the survivors, every micro-batch's gradient counts once.

Real Ray actors, real deaths: ``inject_death`` makes a replica's process ``os._exit`` when it starts a
given call (deterministic), and one test ``ray.kill``s a replica from outside while a step runs.
Starting actors is what costs on 2 shared cores, so ONE runtime of 3 stages x replicas (2, 2, 3)
serves the whole module and the tests run in file order, each losing replicas for good (dead actors
are not replaced): stage 1 loses one under 1f1b, stage 2 one under osprey and one in the gradient
exchange, stage 0 one to ``ray.kill``; the last test kills stage 1's last replica.
Each test resets the parameters and compares with the unsplit model stepped in one process.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import pytest
import ray
import torch
from torch import nn

from pdml_ray.pipeline.faults import Reroute, exclude_replicas
from pdml_ray.pipeline.plan import Kind, Measurement, Plan
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.runtime.pipeline import PipelineRuntime
from pdml_ray.runtime.pipeline_faults import PipelineFaultError

pytestmark = pytest.mark.ray

STAGES, REPLICAS, MICROBATCHES, LR = 3, (2, 2, 3), 6, 0.1


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))


INITIAL = [p.detach().clone() for p in _model().parameters()]


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4 * MICROBATCHES, 32, generator=g), torch.randn(4 * MICROBATCHES, 8, generator=g)


def _reference(steps: int) -> tuple[list[list[torch.Tensor]], list[float]]:
    """Parameters after each of ``steps`` SGD steps of the unsplit model on ``_batch(step)``, no faults; losses."""
    model, params, losses = _model(), [], []
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for s in range(steps):
        x, y = _batch(s)
        opt.zero_grad()
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
        losses.append(float(loss.detach()))
    return params, losses


class _Fixed:
    """A scheduler that runs a plan the test looked at first (so it knows which replica holds what)."""

    def __init__(self, inner: Any, plan: Plan) -> None:
        self.inner, self.name, self._plan = inner, inner.name, plan

    def plan(self, step: int) -> Plan:
        return self._plan

    def observe(self, measurements: Sequence[Measurement]) -> None:
        self.inner.observe(measurements)


def _assert_params(runtime: PipelineRuntime, want: list[torch.Tensor]) -> None:
    for got, ref in zip(runtime.parameters(), want, strict=True):
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()
    assert runtime.replicas_identical()


def _assert_every_gradient_once(result: Any, runtime: PipelineRuntime) -> None:
    """Per stage, the live replicas' gradients cover each micro-batch once; none is on a dead replica."""
    for k in range(STAGES):
        assert sum(n for (stage, _), n in result.backward_counts.items() if stage == k) == MICROBATCHES
    assert not set(result.backward_counts) & set(runtime.dead)


@pytest.fixture(scope="module")
def runtime(ray_local):
    rt = PipelineRuntime(_model(), STAGES, REPLICAS, nn.MSELoss(), lr=LR, num_cpus_per_actor=0.5,
                         action_timeout_s=30)
    yield rt
    rt.shutdown()


@pytest.mark.parametrize("schedule, stage", [("1f1b", 1), ("osprey", 2)])
def test_a_replica_dying_mid_step_loses_no_gradient_and_later_steps_run_on_the_survivors(runtime, schedule, stage):
    (ref1, ref2, ref3), losses = _reference(3)
    runtime.set_parameters(INITIAL)
    dead_before = dict(runtime.dead)
    scheduler = make_schedule(schedule, stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    ok = runtime.run_step(scheduler, *_batch(0), step=0)
    assert ok.reroutes == () and (ok.replan is None) == (not dead_before)
    _assert_params(runtime, ref1)

    # Step 1: the victim dies when it starts the last backward of its order, after all its forwards and
    # (in order; osprey may let that one overtake blocked ones) the backwards of its other micro-batches,
    # whose gradients die with it.
    plan = scheduler.plan(1)
    running = exclude_replicas(plan, [runtime._alive(k) for k in range(STAGES)])  # what the runtime will run
    k = stage  # the victim: the replica of the stage with the most micro-batches (osprey's split is measured)
    rank = max(range(running.plan.replicas[k]), key=lambda i: (len(running.plan.orders[(k, i)]), -i))
    r, order = running.alive[k][rank], running.plan.orders[(k, rank)]
    victim = (k, r)
    mine = sorted(a.microbatch for a in order if a.kind is Kind.FORWARD)
    dying = order[-1].microbatch
    assert len(mine) >= 2 and order[-1].kind is Kind.BACKWARD
    runtime.inject_death(k, r, "B", dying)
    died = runtime.run_step(_Fixed(scheduler, plan), *_batch(1), step=1)

    (reroute,) = died.reroutes
    assert isinstance(reroute, Reroute) and (reroute.step, reroute.stage, reroute.replica) == (1, k, r)
    assert [m for m, _ in reroute.moved] == mine and all(to != r for _, to in reroute.moved)
    assert set(reroute.replayed_forwards) == set(mine)  # every forward had run there ...
    redone = set(reroute.redone_backwards)  # ... and every backward but the last (in order)
    assert redone == set(mine) - {dying} if not plan.reorder else redone <= set(mine) - {dying}
    assert died.forward_counts[victim] == len(mine)  # it ran them all, then died
    _assert_every_gradient_once(died, runtime)
    assert runtime.dead == {**dead_before, victim: 1} and died.replicas == runtime.live_replicas
    assert died.loss == pytest.approx(losses[1], rel=1e-5)  # replayed last-stage forwards do not add
    _assert_params(runtime, ref2)

    # Step 2: the scheduler's plan is moved onto the survivors; nothing is rerouted any more.
    later = runtime.run_step(scheduler, *_batch(2), step=2)
    assert later.reroutes == () and later.replan is not None
    assert later.replan.plan.replicas == runtime.live_replicas
    assert all((kk, rr) not in runtime.dead for kk, alive in enumerate(later.replan.alive) for rr in alive)
    assert later.forward_counts[victim] == 0
    assert sum(n for (kk, _), n in later.forward_counts.items() if kk == k) == MICROBATCHES
    _assert_every_gradient_once(later, runtime)
    _assert_params(runtime, ref3)


def test_a_replica_dying_in_the_gradient_exchange_is_made_up_for(runtime):
    (ref1, ref2), _ = _reference(2)
    runtime.set_parameters(INITIAL)
    scheduler = make_schedule("1f1b", stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    plan = scheduler.plan(0)
    running = exclude_replicas(plan, [runtime._alive(k) for k in range(STAGES)])
    victim, survivor = running.alive[2]  # one replica of stage 2 died under osprey
    mine = tuple(sorted(m for (k, m), rank in running.plan.placement.items() if k == 2 and running.alive[2][rank] == victim))
    runtime.inject_death(2, victim, "grads")  # after all its backwards: its gradients are lost in the exchange
    result = runtime.run_step(_Fixed(scheduler, plan), *_batch(0), step=0)
    (reroute,) = result.reroutes
    assert (reroute.phase, reroute.stage, reroute.replica) == ("exchange", 2, victim)
    assert reroute.moved == tuple((m, survivor) for m in mine) and len(mine) >= 2
    assert reroute.replayed_forwards == reroute.redone_backwards == mine
    assert result.backward_counts[(2, survivor)] == MICROBATCHES
    _assert_every_gradient_once(result, runtime)
    _assert_params(runtime, ref1)
    result = runtime.run_step(scheduler, *_batch(1), step=1)
    assert result.replan is not None and result.replan.alive[2] == (survivor,)
    _assert_params(runtime, ref2)


class _KillAfterPlanning(_Fixed):
    """Plans, then ``ray.kill``s ``victim`` ``delay_s`` later from another thread (a real, untimed death)."""

    def __init__(self, inner: Any, victim: Any, delay_s: float) -> None:
        super().__init__(inner, inner.plan(0))
        self.timer = threading.Timer(delay_s, ray.kill, args=(victim,))

    def plan(self, step: int) -> Plan:
        self.timer.start()
        return self._plan


def test_ray_kill_during_a_step_is_survived(runtime):
    (ref1,), _ = _reference(1)
    runtime.set_parameters(INITIAL)
    runtime.set_speed(0, 1, 0.01)  # EMULATED: s0r1 sleeps 99x its compute, so its work outlasts the kill's delay
    scheduler = _KillAfterPlanning(make_schedule("gpipe", stages=STAGES, replicas=REPLICAS,
                                                  microbatches=MICROBATCHES), runtime._actors[0][1], 0.05)
    try:
        result = runtime.run_step(scheduler, *_batch(0), step=7)
    finally:
        scheduler.timer.join()
    assert runtime.dead[(0, 1)] == 7
    # Noticed while running actions or, if the kill landed late, in the gradient exchange: same outcome.
    assert [(r.stage, r.replica) for r in result.reroutes] == [(0, 1)], result.reroutes
    assert result.backward_counts[(0, 0)] == MICROBATCHES
    _assert_every_gradient_once(result, runtime)
    _assert_params(runtime, ref1)


def test_a_stage_losing_every_replica_is_a_clear_error_not_a_hang(runtime):
    assert runtime.live_replicas == (1, 1, 1)  # after the tests above
    scheduler = make_schedule("1f1b", stages=STAGES, replicas=REPLICAS, microbatches=MICROBATCHES)
    (last,) = runtime._alive(1)
    runtime.inject_death(1, last, "F", 2)
    start = time.perf_counter()
    with pytest.raises(PipelineFaultError, match=r"step 4: every replica of stage 1 died"):
        runtime.run_step(scheduler, *_batch(0), step=4)
    assert time.perf_counter() - start < 20
    assert runtime.live_replicas == (1, 0, 1)
    with pytest.raises(PipelineFaultError, match=r"step 5: stage 1 has no live replica"):
        runtime.run_step(scheduler, *_batch(0), step=5)
