"""SumTree: sums stay exact, draws follow the scores, edge cases behave as documented."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdml_ray.errors import ReportError
from pdml_ray.priority.sumtree import SumTree


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    keep = expected > 0
    assert counts[~keep].sum() == 0, "drew an item of probability 0"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_draw_frequencies_match_scores_chi_square():
    rng = np.random.default_rng(0)
    scores = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 10.0, 0.0, 4.5, 1.0] * 3)  # N = 27: two levels, padded to 32 leaves
    tree = SumTree(len(scores), scores)
    draws = tree.draw(2_000_000, rng)
    counts = np.bincount(draws, minlength=len(scores))
    # 20 degrees of freedom (21 non-zero cells - 1): the 99.9% quantile is 45.31.
    assert _chi_square(counts, scores / scores.sum()) < 45.31
    assert counts[0] == 0 and counts[6] == 0 and counts[15] == 0


def test_update_changes_distribution_and_total():
    rng = np.random.default_rng(1)
    tree = SumTree(1000, 1.0)
    assert tree.total == pytest.approx(1000.0)
    tree.update(np.arange(10), np.full(10, 99.0))
    assert tree.total == pytest.approx(990 + 990.0)
    draws = tree.draw(100_000, rng)
    frac_hot = np.mean(draws < 10)
    assert frac_hot == pytest.approx(0.5, abs=0.01)


def test_duplicates_in_update_last_write_wins():
    tree = SumTree(5, 1.0)
    tree.update(np.array([2, 3, 2, 2]), np.array([7.0, 4.0, 8.0, 9.0]))
    np.testing.assert_array_equal(tree.values(), [1.0, 1.0, 9.0, 4.0, 1.0])
    assert tree.total == pytest.approx(16.0)


def test_zeros_are_never_drawn_and_all_zero_raises():
    rng = np.random.default_rng(2)
    tree = SumTree(100, 0.0)
    with pytest.raises(ValueError, match="all scores are 0"):
        tree.draw(1, rng)
    tree.update(np.array([37]), np.array([1e-300]))  # a denormal-sized score is still a distribution
    assert np.all(tree.draw(1000, rng) == 37)


def test_single_huge_score_dominates_but_small_ones_survive():
    rng = np.random.default_rng(3)
    scores = np.ones(1 << 12)
    scores[123] = 1e12
    tree = SumTree(len(scores), scores)
    draws = tree.draw(10_000, rng)
    assert np.all((draws >= 0) & (draws < len(scores)))
    assert np.mean(draws == 123) > 0.999
    tree.update(np.array([123]), np.array([0.0]))
    assert tree.total == pytest.approx(len(scores) - 1.0)  # recomputed sums: no cancellation error
    assert 123 not in set(tree.draw(10_000, rng).tolist())


def test_single_item():
    rng = np.random.default_rng(4)
    tree = SumTree(1, 2.5)
    assert tree.total == 2.5
    np.testing.assert_array_equal(tree.draw(7, rng), np.zeros(7, dtype=np.int64))
    tree.update(np.array([0, 0]), np.array([3.0, 0.0]))
    assert tree.total == 0.0


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="num_items >= 1"):
        SumTree(0)
    tree = SumTree(4)
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([1]), np.array([-1.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([1]), np.array([np.nan]))
    with pytest.raises(ReportError, match="indices must lie"):
        tree.update(np.array([4]), np.array([1.0]))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    ops=st.lists(st.tuples(st.lists(st.integers(0, 299), min_size=1, max_size=20),
                           st.floats(0.0, 1e6, allow_nan=False)), max_size=10),
)
def test_property_internal_sums_match_leaves(n, ops):
    tree = SumTree(n, 1.0)
    reference = np.ones(n)
    for raw_idx, value in ops:
        idx = np.array([i % n for i in raw_idx])
        vals = value * (1.0 + np.arange(len(idx)))
        tree.update(idx, vals)
        for i, v in zip(idx, vals):  # sequential reference: last write wins
            reference[i] = v
    np.testing.assert_allclose(tree.values(), reference)
    for d in range(tree.depth):  # every internal node is the sum of its children
        sums = tree.levels[d + 1].reshape(-1, 16).sum(axis=1)
        np.testing.assert_allclose(tree.levels[d][:len(sums)], sums, rtol=1e-12)
        assert not tree.levels[d][len(sums):].any()  # padding stays 0
    assert tree.total == pytest.approx(reference.sum(), rel=1e-12)
    if reference.sum() > 0:
        draws = tree.draw(200, np.random.default_rng(0))
        assert np.all(reference[draws] > 0)


def test_a_copied_tree_keeps_its_sums_consistent():
    """Scheduler.load_state_dict loads into deep copies of the derivers: a copied tree's row views were
    arrays of their own, so its rebuilt sums never reached its levels (total 0 over non-zero leaves)."""
    import copy
    import pickle

    tree = SumTree(1000, 1.0)
    for clone in (copy.deepcopy(tree), pickle.loads(pickle.dumps(tree))):
        clone.set_all(np.arange(1000.0))
        clone.update(np.array([3, 999]), np.array([10.0, 0.0]))
        assert clone.total == pytest.approx(float(clone.values().sum())) and clone.total == pytest.approx(498_508.0)
        assert tree.total == 1000.0
