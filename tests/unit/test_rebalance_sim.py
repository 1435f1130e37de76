"""Layer re-balancing in the simulator and in ``bench pipeline``'s slow-stage scenario (SIMULATED, no Ray)."""

from __future__ import annotations

import pytest

from pdml_ray.config import PDMLConfig, PipelineConfig, RebalanceConfig
from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.pipeline.scenarios import scenario_layers, scenario_profile
from pdml_ray.pipeline.simulate import PipelineSimulator, simulate_schedule
from pdml_ray.runtime.pipeline_plans import ScheduledPlans

STAGES, MICROBATCHES, STEPS = 4, 8, 12


def test_slow_stage_is_slowed_for_good_and_rebalancing_levels_it():
    profile = scenario_profile("slow-stage", STAGES, 2, seed=0, steps=STEPS)
    (window,) = {(w.stage, w.factor, w.start_step, w.steps) for w in profile.slow_windows}
    slow, factor, start, length = window
    assert {w.replica for w in profile.slow_windows} == {0, 1} and factor == 0.5 and start + length == STEPS

    layers, cuts = scenario_layers(STAGES)
    assert cuts == (4, 8, 12) and layers.stage_costs(cuts) == ((1.0,) * 4, (2.0,) * 4)
    profile = scenario_profile("slow-stage", STAGES, 1, seed=0, steps=STEPS)
    config = PDMLConfig(pipeline=PipelineConfig(schedule="1f1b", rebalance=RebalanceConfig(enabled=True)))
    plans = ScheduledPlans(config, stages=STAGES, replicas=1, microbatches=MICROBATCHES, in_process=True,
                           layers=[f + b for f, b in zip(layers.forward_s, layers.backward_s)], cuts=cuts)
    moves: list = []
    try:
        results = simulate_schedule(plans, PipelineSimulator(profile, 0), STEPS, layers=layers,
                                    moves=lambda t: moves.append(plans.layer_move(t)) or moves[-1])
    finally:
        plans.close()
    made = [m for m in moves if m is not None]
    # Slow from step 3; three slow steps measured, planned a step ahead: the move is effective at step 7.
    assert [m.effective_step for m in made] == [start + 3 + 1] and made[0].stage == slow
    assert max(made[0].stage_s_after) == pytest.approx(0.625 * max(made[0].stage_s_before))
    static = simulate_schedule(make_schedule("1f1b", stages=STAGES, replicas=1, microbatches=MICROBATCHES),
                               PipelineSimulator(profile, 0), STEPS)
    ms, base = [r.makespan_s for r in results], [r.makespan_s for r in static]
    assert ms[:made[0].effective_step] == base[:made[0].effective_step]  # same plans, same cuts: same steps
    assert ms[-1] < 0.8 * base[-1]  # the bottleneck stage: from 2x the nominal time to 1.25x
    with pytest.raises(ConfigError, match="layers=LayerCosts"):
        simulate_schedule(make_schedule("1f1b", stages=STAGES, replicas=1, microbatches=MICROBATCHES),
                          PipelineSimulator(profile, 0), 1, moves=lambda t: made[0])


def test_the_bench_record_reports_rebalancing_as_ratios():
    from pdml_ray.bench.pipeline_scenarios import cell_record, default_scenarios, rebalance_lines, summarize

    assert "slow-stage" in default_scenarios(quick=False) and "slow-stage" not in default_scenarios(quick=True)

    def run(seed: int, ratio: float) -> dict:
        entry = {"makespan_s": 10.0, "rebalanced_makespan_s": 10 * ratio, "moves": [{"step": 5}],
                 "rebalanced_over_not": ratio, "rebalanced_over_not_last_step": ratio - 0.1,
                 "rebalanced_over_best_static": ratio * 1.2}
        return {"seed": seed, "makespan_s": {"osprey": 9.0, "1f1b": 10.0}, "lower_bound_s": {"osprey": 8.0, "1f1b": 8.0},
                "memory_violations": {"osprey": 0, "1f1b": 0}, "not_applicable": {}, "best_static": "1f1b",
                "osprey_over_best_static": 0.9, "osprey_over_lower_bound": 9 / 8,
                "rebalance": {"osprey-fb": entry, "1f1b": entry}}

    record = cell_record("slow-stage", (4, 1, 16), [run(s, r) for s, r in enumerate([0.8, 0.9, 0.7])])
    entry = record["rebalance"]["1f1b"]
    assert entry["rebalanced_over_not"] == pytest.approx(0.8) and entry["rebalanced_over_not_worst"] == 0.9
    assert entry["rebalanced_over_not_last_step"] == pytest.approx(0.7) and entry["moves_per_seed"] == [1, 1, 1]
    assert entry["rebalanced_over_best_static"] == pytest.approx(0.96)
    summary = summarize([record])["slow-stage"]["rebalance"]["osprey-fb"]
    assert summary["rebalanced_over_not_median"] == pytest.approx(0.8)
    assert rebalance_lines([record])[0].startswith("slow-stage 4x1x16 osprey-fb: re-balanced / not 0.800 (0.900)")
