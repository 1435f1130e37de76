"""The weight tuner: discounted UCB over points of the weight simplex."""

import numpy as np
import pytest

from pdml_ray.errors import StateError
from pdml_ray.priority.bandit import WeightBandit, simplex_arms

PRIOR = (0.5, 0.3, 0.2)


def test_arms_are_the_prior_then_the_simplex_grid_without_duplicates():
    arms = simplex_arms(PRIOR, 2)
    assert arms[0] == PRIOR and len(arms) == 7
    assert set(arms[1:]) == {(1.0, 0.0, 0.0), (0.5, 0.5, 0.0), (0.5, 0.0, 0.5), (0.0, 1.0, 0.0), (0.0, 0.5, 0.5),
                             (0.0, 0.0, 1.0)}
    assert all(min(a) >= 0 and abs(sum(a) - 1) < 1e-12 for a in arms)
    on_grid = simplex_arms((0.5, 0.5, 0.0), 2)  # a prior on the grid is not repeated
    assert len(on_grid) == 6 and on_grid[0] == (0.5, 0.5, 0.0)
    assert len(simplex_arms(PRIOR, 4)) == 1 + 15


def _synthetic(arms, target, rng, noise=0.05):
    """Reward peaks at ``target`` on the simplex: 1 - squared distance, plus noise."""
    return lambda a: 1.0 - float(np.sum((np.array(arms[a]) - target) ** 2)) + noise * rng.standard_normal()


@pytest.mark.parametrize("discount", [1.0, 0.98])
def test_the_bandit_finds_the_best_arm_of_a_synthetic_reward(discount):
    arms = simplex_arms(PRIOR, 2)
    best = arms.index((0.0, 0.5, 0.5))
    reward = _synthetic(arms, np.array([0.0, 0.5, 0.5]), np.random.default_rng(1))
    bandit = WeightBandit(arms, discount=discount, exploration=1.0)
    for _ in range(400):
        arm = bandit.select()
        bandit.update(arm, reward(arm))
    assert bandit.best_arm() == best
    assert bandit.pulls[best] == bandit.pulls.max() and bandit.pulls[best] > 0.3 * bandit.pulls.sum()


def test_untried_arms_go_first_starting_with_the_prior():
    bandit = WeightBandit(simplex_arms(PRIOR, 1))
    order = []
    for _ in range(4):
        order.append(bandit.select())
        bandit.update(order[-1], 0.0)
    assert order == [0, 1, 2, 3]


def test_discounting_follows_a_reward_that_moves():
    arms = simplex_arms(PRIOR, 2)
    rng = np.random.default_rng(2)
    bandit = WeightBandit(arms, discount=0.95)
    for target in ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0)):
        reward = _synthetic(arms, np.array(target), rng)
        for _ in range(300):
            arm = bandit.select()
            bandit.update(arm, reward(arm))
        assert arms[bandit.best_arm()] == target


def test_the_exploration_is_unit_free():
    arms = simplex_arms(PRIOR, 2)
    pulls = []
    for scale in (1.0, 1e-6):
        reward = _synthetic(arms, np.array([1.0, 0.0, 0.0]), np.random.default_rng(3))
        bandit = WeightBandit(arms)
        seq = []
        for _ in range(100):
            arm = bandit.select()
            bandit.update(arm, scale * reward(arm))
            seq.append(arm)
        pulls.append(seq)
    assert pulls[0] == pulls[1]


def test_reset_returns_to_the_prior_and_forgets():
    bandit = WeightBandit(simplex_arms(PRIOR, 2))
    for _ in range(10):
        arm = bandit.select()
        bandit.update(arm, float(arm))
    assert bandit.current != 0
    bandit.reset()
    assert bandit.current == 0 and bandit.weights == PRIOR and bandit.resets == 1
    assert bandit.counts.sum() == 0 and np.isnan(bandit.means()).all()
    assert bandit.select() == 0  # everything untried again: the prior first


def test_state_round_trip_continues_the_same_pulls_and_refuses_other_arms():
    arms = simplex_arms(PRIOR, 2)
    a, rng = WeightBandit(arms), np.random.default_rng(4)
    for _ in range(20):
        arm = a.select()
        a.update(arm, rng.normal())
    b = WeightBandit(arms)
    b.load_state_dict(a.state_dict())
    for _ in range(20):
        r = rng.normal()
        arm = a.select()
        assert b.select() == arm
        a.update(arm, r)
        b.update(arm, r)
    with pytest.raises(StateError, match="simplex_resolution"):
        WeightBandit(simplex_arms(PRIOR, 3)).load_state_dict(a.state_dict())
