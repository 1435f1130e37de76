"""Layer re-balancing's decision: a stage slowed persistently loses layers to its neighbours and the stage
times level; a one-step spike moves nothing; the decision rides in the pipeline axis's plan, replays and
restores exactly (no Ray)."""

from __future__ import annotations

import pytest

from pdml_ray.config import PDMLConfig, PipelineConfig, RebalanceConfig
from pdml_ray.decisions import Boundary, MicroBatchPlan
from pdml_ray.errors import ConfigError, PlanError, ReportError
from pdml_ray.pipeline.partition import stage_bounds
from pdml_ray.pipeline.rebalance import LayerMove, LayerTransfer, Rebalancer, stage_seconds
from pdml_ray.replay import recorded, replay
from pdml_ray.scheduler import Scheduler

STAGES, LAYERS, MICROBATCHES = 4, 16, 4
CUTS = (4, 8, 12)  # four equal layers per stage


def _rows(cuts, slow: dict[int, float], replicas: int = 1) -> list[tuple]:
    """One step's latency rows on ``cuts``: a layer takes 1 ms forward, 2 ms backward, / the stage's speed."""
    rows = []
    for k, (a, b) in enumerate(stage_bounds(LAYERS, list(cuts))):
        per_layer = 1e-3 / slow.get(k, 1.0)
        for r in range(replicas):
            for m in range(MICROBATCHES):
                rows += [(k, r, "F", m, per_layer * (b - a)), (k, r, "B", m, 2 * per_layer * (b - a))]
    return rows


def _scheduler(**rebalance) -> Scheduler:
    config = PDMLConfig(pipeline=PipelineConfig(schedule="1f1b", rebalance=RebalanceConfig(enabled=True, **rebalance)),
                        replay_log=10_000)
    s = Scheduler(config, STAGES)
    s.set_shape("pipeline", {"stages": STAGES, "replicas": 1, "microbatches": MICROBATCHES,
                             "layers": [1.0] * LAYERS, "cuts": list(CUTS)})
    return s


def _run(s: Scheduler, steps: int, slow_at) -> list[MicroBatchPlan]:
    """Plan and 'run' ``steps`` steps: each step's latencies follow the cuts its plan's moves left."""
    cuts, plans = CUTS, []
    for t in range(steps):
        d = s.bundle(Boundary(t, 1, ()), {}).get("pipeline")
        assert isinstance(d, MicroBatchPlan)
        if d.layer_move is not None:
            assert d.layer_move.effective_step == t and d.layer_move.cuts_before == cuts
            cuts = d.layer_move.cuts_after
        plans.append(d)
        s.observe("pipeline", t, _rows(cuts, slow_at(t)))
    return plans


def test_stage_seconds_combine_replicas_as_rates():
    rows = [(0, 0, "F", 0, 1.0), (0, 0, "B", 0, 2.0), (0, 1, "F", 1, 2.0), (0, 1, "B", 1, 4.0)]
    # replica 0: 3 s per micro-batch, replica 1: 6 s; together 1 / (1/3 + 1/6) = 2 s per micro-batch
    assert stage_seconds(rows, 1) == pytest.approx((2.0,))
    assert stage_seconds(rows, 2) is None  # stage 1 ran nothing: the step says nothing about it
    assert stage_seconds([(2, 0, "F", 0, 1.0)], 2) is None  # a plan of virtual stages, their ranks not told
    # A V of two chunks per rank (virtual stages 0 and 3 on rank 0, 1 and 2 on rank 1): a micro-batch's
    # chunks add up on their rank, 3 s on rank 0 and 6 s on rank 1.
    v = [(0, 0, "F", 0, 0.5), (1, 0, "F", 0, 1.0), (2, 0, "F", 0, 1.0), (3, 0, "F", 0, 0.5),
         (3, 0, "B", 0, 1.0), (2, 0, "B", 0, 2.0), (1, 0, "B", 0, 2.0), (0, 0, "B", 0, 1.0)]
    assert stage_seconds(v, 2, (0, 1, 1, 0)) == pytest.approx((3.0, 6.0))


def test_a_stage_slowed_2x_persistently_loses_layers_and_the_predicted_times_level():
    r = Rebalancer(RebalanceConfig(enabled=True, window=3), layer_costs=[1.0] * LAYERS, cuts=CUTS)
    before = (4.0, 8.0, 4.0, 4.0)  # stage 1 at half speed: 2x the others per micro-batch
    for t in range(2):
        r.observe(t, before)
        assert r.decide(t + 1) is None  # not yet a window of slow steps
    r.observe(2, before)
    move = r.decide(3)
    assert move is not None and move.stage == 1 and move.effective_step == 3
    # stage 1 gives one layer to each neighbour: 5, 2, 5, 4 layers, predicted 5, 4, 5, 4 (from 4, 8, 4, 4)
    assert move.cuts_after == (5, 7, 12)
    assert move.stage_s_after == pytest.approx((5.0, 4.0, 5.0, 4.0))
    assert max(move.stage_s_after) == pytest.approx(0.625 * max(before))
    assert move.transfers() == [LayerTransfer(4, 5, 1, 0), LayerTransfer(7, 8, 1, 2)]
    assert r.cuts == (5, 7, 12) and r.moves == 1
    r.observe(2, before)  # a step measured on the old cuts, arriving late: ignored
    assert r.streak == [] and r.decide(4) is None


def test_through_the_axis_a_persistent_slowdown_moves_once_and_the_measured_times_level():
    s = _scheduler(window=3)
    plans = _run(s, 12, lambda t: {1: 0.5} if t >= 2 else {})
    moves = [p.layer_move for p in plans if p.layer_move is not None]
    # Steps 2, 3, 4 are slow; their latencies reach step 5's decision; then the new cuts hold (no oscillation).
    assert [m.effective_step for m in moves] == [5] and moves[0].cuts_after == (5, 7, 12)
    measured = stage_seconds(_rows(moves[0].cuts_after, {1: 0.5}), STAGES)
    assert measured == pytest.approx(moves[0].stage_s_after)  # the prediction is what the new cuts measure
    assert max(measured) / min(measured) == pytest.approx(1.25)  # from 2.0 before the move
    stats = s.derivers["pipeline"].stats()
    assert stats.cuts == (5, 7, 12) and stats.layer_moves == 1
    assert "layer re-balancing: cuts [5, 7, 12], 1 moves" in "\n".join(stats.summary_lines())


def test_a_step_planned_again_keeps_the_move_decided_for_it():
    """A runtime re-plans a step after a shift (``OspreyConfig.replan_on_shift``): the step's layer move
    was decided with its first plan, and the second plan carries the same move without deciding again."""
    s = _scheduler(window=3)
    _run(s, 5, lambda t: {1: 0.5} if t >= 2 else {})
    first, again = (s.bundle(Boundary(5, 1, ()), {}).get("pipeline") for _ in range(2))
    assert isinstance(first, MicroBatchPlan) and isinstance(again, MicroBatchPlan)
    assert first.layer_move is not None and again.layer_move == first.layer_move and again.version > first.version
    assert s.derivers["pipeline"].stats().layer_moves == 1


def test_a_one_step_spike_moves_nothing():
    s = _scheduler(window=3)
    plans = _run(s, 10, lambda t: {1: 0.3} if t == 3 else {})
    assert all(p.layer_move is None for p in plans)
    plans = _run(_scheduler(window=3), 10, lambda t: {1: 0.5} if t in (2, 3, 5, 6) else {})  # never 3 in a row
    assert all(p.layer_move is None for p in plans)


def test_a_recovered_stage_gets_layers_back_and_a_small_gain_moves_nothing():
    s = _scheduler(window=2)
    plans = _run(s, 16, lambda t: {1: 0.5} if 1 <= t < 6 else {})
    moves = [p.layer_move for p in plans if p.layer_move is not None]
    assert len(moves) == 2 and moves[0].stage == 1 and moves[1].stage == 0
    assert moves[1].cuts_before == (5, 7, 12) and moves[1].cuts_after == CUTS  # layers flow back: level again
    # 10% slower is under the threshold; at half speed the best move gains 37.5% (stage 2 from 8 to 5 ms):
    # made with min_gain 0.3, not with 0.5
    assert not any(p.layer_move for p in _run(_scheduler(window=2), 8, lambda t: {2: 0.9}))
    assert any(p.layer_move for p in _run(_scheduler(window=2, min_gain=0.3), 8, lambda t: {2: 0.5}))
    assert not any(p.layer_move for p in _run(_scheduler(window=2, min_gain=0.5), 8, lambda t: {2: 0.5}))


def test_decisions_are_deterministic_replay_and_restore():
    slow = {0: 0.5}
    a, b = _scheduler(window=2), _scheduler(window=2)
    pa, pb = _run(a, 8, lambda t: slow), _run(b, 8, lambda t: slow)
    assert [p.to_dict() for p in pa] == [p.to_dict() for p in pb]
    assert any(p.layer_move is not None and p.layer_move.stage == 0 for p in pa)
    replay(recorded(a))  # raises PlanError at the first decision that differs
    moved = next(p for p in pa if p.layer_move is not None)
    assert MicroBatchPlan.from_dict(moved.to_dict()).layer_move == moved.layer_move

    # A restored axis decides what the original decides.
    c = _scheduler(window=2)
    _run(c, 3, lambda t: slow)
    fresh = _scheduler(window=2)
    fresh.load_state_dict(c.state_dict())
    assert fresh.derivers["pipeline"].rebalancer.state_dict() == c.derivers["pipeline"].rebalancer.state_dict()


def test_bad_moves_shapes_and_configs_are_refused_with_the_fix():
    with pytest.raises(PlanError, match="past a neighbouring stage"):
        LayerMove(effective_step=1, stage=1, cuts_before=(4, 8, 12), cuts_after=(9, 10, 12), num_layers=16,
                  stage_s_before=(1.0,) * 4, stage_s_after=(1.0,) * 4)
    with pytest.raises(PlanError, match="as LayerMove.to_dict writes it"):
        LayerMove.from_dict({"stage": 1})
    s = Scheduler(PDMLConfig(pipeline=PipelineConfig(rebalance=RebalanceConfig(enabled=True))), 4)
    with pytest.raises(ReportError, match="announce them"):
        s.set_shape("pipeline", {"stages": 4, "replicas": 1, "microbatches": 4})
    with pytest.raises(ReportError, match="cuts 3 integer layer indices"):
        s.set_shape("pipeline", {"stages": 4, "replicas": 1, "microbatches": 4, "layers": [1.0] * 16, "cuts": [4, 8]})
    with pytest.raises(ReportError, match="strictly increasing"):
        s.set_shape("pipeline", {"stages": 4, "replicas": 1, "microbatches": 4, "layers": [1.0] * 16,
                                 "cuts": [8, 4, 12]})
    # off (the default), layers are taken and nothing moves
    off = Scheduler(PDMLConfig(pipeline=PipelineConfig()), 4)
    off.set_shape("pipeline", {"stages": 4, "replicas": 1, "microbatches": 4, "layers": [1.0] * 16, "cuts": list(CUTS)})
    assert off.derivers["pipeline"].rebalancer is None
    for bad, match in (({"window": 0}, "window"), ({"threshold": 1.0}, "threshold"), ({"min_gain": 1.0}, "min_gain"),
                       ({"enabled": "yes"}, "enabled")):
        with pytest.raises(ConfigError, match=f"pipeline.rebalance.{match}"):
            RebalanceConfig(**bad)
    loaded = PDMLConfig.from_dict({"pipeline": {"rebalance": {"enabled": True, "window": 4}}})
    assert loaded.pipeline.rebalance == RebalanceConfig(enabled=True, window=4)
