"""P3 slicing: every element in exactly one slice, exact reassembly, priorities in forward order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.p3.slicing import (Slice, SlicePlan, cut, flatten_layer, plan_slices, reassemble,
                                 unflatten_layer)


@settings(max_examples=60, deadline=None)
@given(numels=st.lists(st.integers(0, 300), min_size=1, max_size=8), size=st.integers(1, 70))
def test_every_element_lies_in_exactly_one_slice(numels, size):
    plan = plan_slices(numels, size)
    plan.validate()
    for layer, numel in enumerate(numels):
        covered = torch.zeros(numel, dtype=torch.int64)
        for s in plan.slices_of(layer):
            covered[s.start:s.stop] += 1
            assert 0 < s.numel <= size and s.nbytes == 4 * s.numel
        assert bool((covered == 1).all())
        assert len(plan.slices_of(layer)) == -(-numel // size)  # ceil
    assert sum(s.numel for s in plan.slices) == sum(numels)


@settings(max_examples=40, deadline=None)
@given(numels=st.lists(st.integers(1, 200), min_size=1, max_size=6), size=st.integers(1, 50),
       seed=st.integers(0, 10_000))
def test_cut_and_reassemble_are_exact_inverses_in_any_arrival_order(numels, size, seed):
    plan = plan_slices(numels, size)
    g = torch.Generator().manual_seed(seed)
    layers = [torch.randn(n, generator=g) for n in numels]
    parts = cut(plan, layers)
    order = torch.randperm(len(parts), generator=g).tolist()  # slices arrive in any order
    arrived: list[torch.Tensor | None] = [None] * len(parts)
    for i in order:
        arrived[i] = parts[i].clone()
    back = reassemble(plan, [a for a in arrived if a is not None])
    assert all(torch.equal(a, b) for a, b in zip(layers, back))


def test_priorities_follow_forward_order_and_slices_never_cross_layers():
    plan = plan_slices([100, 0, 250, 40], 100)
    assert [(s.layer, s.priority, s.start, s.stop) for s in plan.slices] == [
        (0, 0, 0, 100), (2, 2, 0, 100), (2, 2, 100, 200), (2, 2, 200, 250), (3, 3, 0, 40)]
    assert [s.index for s in plan.slices] == list(range(5))
    assert plan.total_bytes == 390 * 4 and plan.layer_bytes(2) == 1000
    assert "5 slices" in str(plan)


def test_layer_tensors_flatten_and_unflatten_exactly():
    w, b = torch.randn(3, 5), torch.randn(5)
    flat = flatten_layer([w, b])
    assert flat.shape == (20,)
    w2, b2 = unflatten_layer(flat, [w, b])
    assert torch.equal(w, w2) and torch.equal(b, b2)
    with pytest.raises(PlanError):
        unflatten_layer(torch.zeros(19), [w, b])


def test_bad_inputs_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="40000"):
        plan_slices([10], 0)
    with pytest.raises(ConfigError):
        plan_slices([-1], 10)
    plan = plan_slices([10, 10], 4)
    with pytest.raises(PlanError):
        cut(plan, [torch.zeros(10)])
    with pytest.raises(PlanError):
        cut(plan, [torch.zeros(10), torch.zeros(9)])
    with pytest.raises(PlanError):
        reassemble(plan, [torch.zeros(4)] * len(plan.slices))  # the last slices are smaller
    gap = SlicePlan((10,), 5, 4, (Slice(0, 0, 0, 0, 5, 20), Slice(1, 0, 0, 6, 10, 16)))
    with pytest.raises(PlanError, match="gap"):
        gap.validate()
    short = SlicePlan((10,), 5, 4, (Slice(0, 0, 0, 0, 5, 20),))
    with pytest.raises(PlanError, match="cover"):
        short.validate()
