"""Layer moves between stage replicas (no Ray): parameters and optimizer state go with the layers, and
training after a move equals training without one."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.partition import balanced_cuts, split_sequential
from pdml_ray.pipeline.simulate import ClusterProfile, LayerCosts, PipelineSimulator
from pdml_ray.pipeline.stage import StageWorker

ADAM = functools.partial(torch.optim.Adam, lr=0.01)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def _step(workers: list[StageWorker], x: torch.Tensor, y: torch.Tensor) -> None:
    """One global step of two micro-batches through the stage workers in order."""
    for m, (xm, ym) in enumerate(zip(x.tensor_split(2), y.tensor_split(2))):
        h = xm
        for w in workers[:-1]:
            h, _ = w.forward(m, h)
        workers[-1].forward(m, h, ym, xm.shape[0] / x.shape[0])
        g = None
        for w in reversed(workers):
            g, _ = w.backward(m, g)
    for w in workers:
        w.step()


def test_training_after_a_move_equals_training_without_one():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)

    def workers(cuts):
        stages = split_sequential(_model(), 2, cuts)
        return [StageWorker(k, 0, 2, s, loss_fn=nn.MSELoss() if k == 1 else None, optimizer=ADAM)
                for k, s in enumerate(stages)]

    fixed = workers((2,))
    for _ in range(4):
        _step(fixed, x, y)
    moved = workers((2,))
    for _ in range(2):
        _step(moved, x, y)
    # Stage 1 gives its first two layers (Linear 16-16, Tanh) to stage 0, as the rebalancer's move (2,) -> (4,)
    front, back = moved[1].export_layers(2, 0)
    assert back is None and len(front[0]) == 2 and set(front[1][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert moved[0].move_layers(0, 0, None, front) == 4 and moved[1].move_layers(2, 0, None, None) == 1
    for _ in range(2):
        _step(moved, x, y)
    want = [p for w in fixed for p in w.get_parameters()]
    got = [p for w in moved for p in w.get_parameters()]
    assert [p.shape for p in got] == [p.shape for p in want]
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), (a - b).abs().max()
    # Adam's step count travelled with the layer (restarted state would make the updates differ above).
    assert int(moved[0].optimizer.state[list(moved[0].module.parameters())[-1]]["step"]) == 4


def test_a_move_keeps_a_layer_and_waits_for_the_step_to_end():
    w = StageWorker(0, 0, 2, nn.Sequential(nn.Linear(2, 2), nn.Tanh()), optimizer=ADAM)
    with pytest.raises(PlanError, match="keeps at least one layer"):
        w.export_layers(1, 1)
    w.forward(0, torch.ones(1, 2))
    with pytest.raises(PlanError, match="between steps"):
        w.move_layers(1, 0, None, None)


def test_cuts_balance_stage_times_within_ranges_and_the_simulator_recuts():
    # Stage 1 runs at half speed (2 s per unit): its share shrinks; each cut stays within its range.
    assert balanced_cuts([1.0] * 12, 3) == (4, 8)
    assert balanced_cuts([1.0] * 12, 3, rates=[1.0, 2.0, 1.0]) == (5, 7)
    assert balanced_cuts([1.0] * 12, 3, rates=[1.0, 2.0, 1.0], cut_ranges=[(4, 4), (4, 12)]) == (4, 6)
    with pytest.raises(PlanError, match="within the cut ranges"):
        balanced_cuts([1.0] * 4, 2, cut_ranges=[(0, 0)])
    layers = LayerCosts(forward_s=(0.25,) * 8, backward_s=(0.5,) * 8)
    sim = PipelineSimulator(ClusterProfile.build(2, 1))
    sim.recut(layers, (5,))
    assert sim.profile.forward_s == (1.25, 0.75) and sim.profile.backward_s == (2.5, 1.5)
