"""Straggler models: seeded, order-independent, with the distributions and labels they claim."""

from __future__ import annotations

import numpy as np
import pytest

from pdml_ray.errors import ConfigError
from pdml_ray.stragglers.delays import (STRAGGLER_MODELS, Correlated, Death, FixedSlowdown, Pareto, ShiftedExponential,
                                        make_straggler_model)


def test_same_seed_same_draws_whatever_the_call_order():
    a, b = ShiftedExponential(1.0, seed=5), ShiftedExponential(1.0, seed=5)
    forward = [a.factor(w, t) for w in range(4) for t in range(10)]
    backward = [b.factor(w, t) for w in reversed(range(4)) for t in reversed(range(10))][::-1]
    assert forward == backward
    assert forward != [ShiftedExponential(1.0, seed=6).factor(w, t) for w in range(4) for t in range(10)]


def test_shifted_exponential_has_the_stated_shift_and_mean():
    m = ShiftedExponential(mean_extra=0.5, seed=0)
    f = np.array([m.factor(w, t) for w in range(20) for t in range(500)])
    assert f.min() >= 1.0
    assert abs(f.mean() - 1.5) < 0.03
    assert "shifted-exp" in m.label and "0.5" in m.label


def test_pareto_is_heavy_tailed_with_minimum_one():
    m = Pareto(alpha=2.0, seed=1)
    f = np.array([m.factor(w, t) for w in range(20) for t in range(1000)])
    assert f.min() >= 1.0
    # P(factor > x) = x^-alpha: at x = 4, 1/16
    assert abs((f > 4).mean() - 1 / 16) < 0.01
    assert f.max() > 20  # a heavy tail shows up in 20k draws
    with pytest.raises(ConfigError, match="alpha"):
        Pareto(alpha=1.0)


def test_fixed_slowdown_slows_only_the_chosen_workers():
    m = FixedSlowdown((2,), 3.0)
    assert [m.factor(w, 7) for w in range(4)] == [1.0, 1.0, 3.0, 1.0]
    assert m.label == "fixed(workers=[2], x3)"
    with pytest.raises(ConfigError):
        FixedSlowdown((0,), 0.5)


def test_correlated_slowness_persists_across_steps():
    m = Correlated(p_slow=0.1, p_recover=0.2, slowdown=4.0, seed=2)
    chains = np.array([[m.factor(w, t) > 1 for t in range(2000)] for w in range(5)])
    slow_fraction = chains.mean()
    assert abs(slow_fraction - 0.1 / 0.3) < 0.05  # stationary slow fraction p_slow / (p_slow + p_recover)
    # persistence: P(slow at t+1 | slow at t) = 1 - p_recover = 0.8, far above the marginal 1/3
    stay = (chains[:, 1:] & chains[:, :-1]).sum() / chains[:, :-1].sum()
    assert abs(stay - 0.8) < 0.05
    fresh = Correlated(p_slow=0.1, p_recover=0.2, slowdown=4.0, seed=2)
    assert fresh.factor(3, 1500) == m.factor(3, 1500)  # a jump ahead gives the same chain


def test_death_names_its_workers_and_step():
    m = Death((1,), 4, ShiftedExponential(1.0, seed=0))
    assert m.death_step(1) == 4 and m.death_step(0) is None
    assert m.factor(0, 3) == ShiftedExponential(1.0, seed=0).factor(0, 3)
    assert "death(workers=[1] at step 4)" in m.label


def test_factory_knows_every_name_and_refuses_others():
    for name in STRAGGLER_MODELS:
        m = make_straggler_model(name, workers=8, stragglers=1, seed=0)
        assert m.label and all(m.factor(w, 0) >= 1.0 for w in range(8))
    death = make_straggler_model("death", workers=8, stragglers=2, seed=0, death_step=3)
    assert sum(death.death_step(w) == 3 for w in range(8)) == 2
    with pytest.raises(ConfigError, match="valid names"):
        make_straggler_model("lognormal", workers=8, stragglers=1)
