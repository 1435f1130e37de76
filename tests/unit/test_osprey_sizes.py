"""Micro-batch sizes told before the step: the size model, sized memory, osprey's plans on them, and the
sizes' way through the scheduler (no Ray)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from pdml_ray.config import OspreyConfig, PDMLConfig, PipelineConfig
from pdml_ray.errors import PlanError, ReportError
from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.listsched import single_pipeline_schedule
from pdml_ray.pipeline.plan import Action, Kind, Plan, validate
from pdml_ray.pipeline.registry import STATIC_SCHEDULES, TORCH_SCHEDULES, make_schedule
from pdml_ray.pipeline.scenarios import scenario_profile
from pdml_ray.pipeline.simulate import PipelineSimulator, simulate_schedule
from pdml_ray.pipeline.sizes import SizeModel, orders_to_try, relabel
from pdml_ray.runtime.pipeline_plans import ScheduledPlans

F, B = Kind.FORWARD, Kind.BACKWARD
STEPS = 8


def test_the_size_model_learns_fixed_per_token_and_attention_shares_per_stage() -> None:
    rng = np.random.default_rng(0)
    model = SizeModel(2, alpha=0.5)
    for _ in range(3):
        s = rng.lognormal(-0.32, 0.8, size=32)
        # Stage 0 costs 0.5 s + 0.5 s^2 (attention half), stage 1 is all per-token (linear), both x 1.7 of the estimate.
        stage = np.repeat([0, 1], 32)
        ratio = 1.7 * np.concatenate([0.5 * s + 0.5 * s * s, s])
        model.update(stage, np.concatenate([s, s]), ratio)
    g = model.relative_cost([0.5, 1.0, 3.0])
    assert g[0] == pytest.approx([0.375, 1.0, 6.0], rel=1e-3)  # (0.5 s + 0.5 s^2) / 1
    assert g[1] == pytest.approx([0.5, 1.0, 3.0], rel=1e-3)
    equal = SizeModel(1, alpha=0.5)
    equal.update(np.zeros(8, dtype=int), np.ones(8), np.full(8, 2.0))  # sizes that never vary teach nothing
    assert equal.relative_cost([1.0, 2.0])[0][0] == pytest.approx(1.0)


def test_sized_activations_bound_memory_in_validation_dispatch_and_list_scheduling() -> None:
    orders = {(0, 0): (Action(0, 0, F, 0), Action(0, 0, F, 1), Action(0, 0, B, 0), Action(0, 0, B, 1))}
    counted = Plan(1, (1,), 2, orders, memory_limit=2)
    validate(counted)  # two activations of one unit each
    sized = Plan(1, (1,), 2, orders, memory_limit=2, activation_sizes=(1.5, 1.0))
    with pytest.raises(PlanError, match="holds 2.5 activations"):
        validate(sized)
    assert Plan.from_dict(counted.to_dict()) == counted and "activation_sizes" not in counted.to_dict()
    reordered = Plan(1, (1,), 2, orders, memory_limit=2, activation_sizes=(1.5, 0.5), reorder=True)
    assert Plan.from_dict(reordered.to_dict()) == reordered
    d = Dispatcher(Plan(1, (1,), 2, orders, memory_limit=2, activation_sizes=(1.5, 1.0), reorder=True))
    d.start(d.next_action(0, 0))
    assert d.next_action(0, 0) is None  # F1 would hold 2.5 > 2: it waits for B0, and B0 is not next in order
    # List scheduling holds at most the cap in sizes: at stage 0, 0.5 + 1.0 fits a cap of 2 and F1 runs
    # while F0 is at stage 1; 1.5 + 1.0 does not, so F1 waits for B0.
    raw, _ = single_pipeline_schedule([1.0, 1.0], [2.0, 2.0], 2, [2, 2], sizes=[0.5, 1.0])
    assert raw[0] == [(F, 0), (F, 1), (B, 0), (B, 1)]
    raw, _ = single_pipeline_schedule([1.0, 1.0], [2.0, 2.0], 2, [2, 2], sizes=[1.5, 1.0])
    assert raw[0] == [(F, 0), (B, 0), (F, 1), (B, 1)]
    _, done = single_pipeline_schedule([1.0], [2.0], 2, [2], scale=[[1.0, 3.0]])
    assert done == [3.0, 12.0]  # F0 1 s, B0 2 s, F1 3 s, B1 6 s, one after the other


def test_orders_to_try_and_relabel() -> None:
    orders = orders_to_try([3.0, 1.0, 2.0, 0.5])
    assert orders == {"given": (0, 1, 2, 3), "ascending": (3, 1, 2, 0), "ends": (3, 2, 0, 1), "descending": (0, 2, 1, 3)}
    plan = make_schedule("1f1b", stages=2, replicas=1, microbatches=4).plan(0)
    moved = relabel(plan, orders["ascending"])
    validate(moved)
    assert moved.orders[(0, 0)][0] == Action(0, 0, F, 3) and moved.orders[(1, 0)][-1] == Action(1, 0, B, 0)


def _mean_makespans(scenario: str, stages: int, replicas: int, microbatches: int, seed: int) -> dict[str, float]:
    """Mean makespan over steps 2.. of osprey (sizes told, plans='any') and of every static order that fits."""
    profile = scenario_profile(scenario, stages, replicas, seed=seed, steps=STEPS)
    out = {}
    for name in ("osprey",) + STATIC_SCHEDULES + tuple(TORCH_SCHEDULES):
        config = PipelineConfig(memory_limit=profile.memory_limit, osprey=OspreyConfig(plans="any"))
        try:
            schedule = make_schedule(name, stages=stages, replicas=replicas, microbatches=microbatches, config=config)
        except Exception:  # noqa: BLE001 - torch's size rules: this shape does not fit it
            continue
        results = simulate_schedule(schedule, PipelineSimulator(profile, seed), STEPS, check=True)[2:]
        out[name] = statistics.fmean(r.makespan_s for r in results)
        out[f"{name}:violations"] = sum(r.memory_violations for r in results)
    return out


@pytest.mark.parametrize("shape", [(4, 1, 16), (4, 2, 16)])
def test_with_uneven_sizes_known_osprey_beats_the_best_static_order_where_reordering_helps(shape) -> None:
    times = _mean_makespans("uneven", *shape, seed=0)
    best = min(v for n, v in times.items() if n != "osprey" and ":" not in n)
    assert times["osprey"] < 0.95 * best, times


def test_osprey_with_sizes_is_deterministic() -> None:
    profile = scenario_profile("uneven", 4, 2, seed=1, steps=4)
    plans = []
    for _ in range(2):
        o = make_schedule("osprey", stages=4, replicas=2, microbatches=8,
                          config=PipelineConfig(memory_limit=4, osprey=OspreyConfig(plans="any")))
        simulate_schedule(o, PipelineSimulator(profile, 1), 4)
        o.tell_sizes(4, PipelineSimulator(profile, 1).sequence_lengths(4, 8).tolist())
        plans.append(o.plan(4).to_dict())
    assert plans[0] == plans[1] and plans[0]["activation_sizes"]


@pytest.mark.parametrize("shape", [(4, 1, 16), (4, 2, 16)])
def test_under_the_memory_cap_osprey_stays_within_it_where_every_static_order_exceeds_it(shape) -> None:
    times = _mean_makespans("memory-cap", *shape, seed=0)
    statics = [n for n in times if ":" not in n and n != "osprey"]
    assert all(times[f"{n}:violations"] > 0 for n in statics), times
    assert times["osprey:violations"] == 0


def test_sizes_reach_osprey_through_the_scheduler_a_step_ahead_and_bad_ones_are_refused() -> None:
    config = PDMLConfig(pipeline=PipelineConfig(schedule="osprey", memory_limit=2))
    plans = ScheduledPlans(config, stages=2, replicas=1, microbatches=4, in_process=True)
    osprey = plans.scheduler.derivers["pipeline"].schedule  # type: ignore[union-attr]
    plans.tell_sizes(0, [1.0, 0.5, 2.0, 1.0])
    plans.tell_sizes(1, [0.5, 0.5, 1.5, 1.0])
    plans.plan(0)  # requests step 0's plan, then step 1's: each after its sizes
    assert osprey.sizes == {0: (1.0, 0.5, 2.0, 1.0), 1: (0.5, 0.5, 1.5, 1.0)}
    with pytest.raises(ReportError, match="4 positive numbers"):
        plans.tell_sizes(2, [1.0, 0.0, 1.0, 1.0])
    scheduler = plans.scheduler
    assert scheduler is not None
    assert not scheduler.observe("pipeline", 2, [("size", 0, 1.0), ("size", 2, 1.0), ("size", 1, 1.0), ("size", 3, 1.0)])
    assert 2 not in osprey.sizes and scheduler.stats().reports_rejected == 1
