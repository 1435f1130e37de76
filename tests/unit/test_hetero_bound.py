"""``bench hetero``'s ideal speedup is an upper bound on the measured one, Ray-free on its formula
(``figures``): runs are modelled as a step of ``max_i b_i / r_i + extras``, where a worker's rate
``r_i`` depends on the run, as with more workers than cores, where the fast workers compute partly
alone once the slow ones are done under node priorities but all at once under uniform shares."""

import numpy as np
import pytest

from pdml_ray.bench.hetero import figures, settling_steps


def _summary(rates, batch_sizes, extras_s):
    step_s = max(b / r for b, r in zip(batch_sizes, rates)) + extras_s
    return {"step_s": step_s, "rates": list(rates), "loss": 1.0, "extras_s": extras_s, "overhead_fraction": 0.0,
            "scheduler_cpu_s_per_step": 0.0, "comm_s": 0.005, "batch_sizes": list(batch_sizes)}


def _pair(uniform_rates, pdml_rates, global_batch, extras_uniform, extras_pdml):
    n = len(uniform_rates)
    uniform = _summary(uniform_rates, [global_batch / n] * n, extras_uniform)
    # node priorities split in proportion to the rates they meet (a perfect split)
    shares = np.asarray(pdml_rates) / np.sum(pdml_rates)
    return uniform, _summary(pdml_rates, global_batch * shares, extras_pdml)


def test_contended_uniform_rates_no_longer_give_an_ideal_below_the_measured_speedup():
    # speeds 1, 0.5, 0.5, 0.25 on 2 cores: under uniform shares all four compute at once (fast
    # workers ~5,000 samples/s), under node priorities the fast one computes partly alone (~8,000)
    uniform, pdml = _pair([5000, 2500, 2500, 1250], [8000, 2600, 2600, 1250], 1024, 0.012, 0.012)
    f = figures(uniform, pdml, 1024)
    assert f["speedup_predicted_uniform_rates"] < f["speedup_vs_uniform"]  # the old estimate: 1.91 < 2.21 in kind
    assert f["speedup_vs_uniform"] <= f["ideal_speedup"] + 1e-12
    assert f["efficiency"] <= 1.0 + 1e-12
    assert f["efficiency"] == pytest.approx(1.0)  # the split was perfect for the rates it met


@pytest.mark.parametrize("seed", range(200))
def test_the_ideal_bounds_every_consistent_pair_of_runs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    uniform_rates = rng.uniform(500, 8000, n)
    pdml_rates = uniform_rates * rng.uniform(0.5, 2.0, n)  # contention moves each worker either way
    uniform, pdml = _pair(uniform_rates, pdml_rates, 1024, *rng.uniform(0.0, 0.03, 2))
    # any split, not only the perfect one, is slower than the bound
    sizes = rng.dirichlet(np.ones(n)) * 1024
    pdml = _summary(pdml_rates, sizes, pdml["extras_s"])
    f = figures(uniform, pdml, 1024)
    assert f["speedup_vs_uniform"] <= f["ideal_speedup"] * (1 + 1e-12)
    assert f["efficiency"] <= 1.0 + 1e-12


def test_the_fsdp_share_gap_against_ddp_is_a_target_that_fails_on_a_miss():
    from pdml_ray.bench.hetero import share_gap, targets

    assert share_gap([0.66, 0.34], [2 / 3, 1 / 3]) == pytest.approx(0.02)
    uniform, pdml = _pair([1000, 500], [1000, 500], 96, 0.01, 0.01)
    result = figures(uniform, pdml, 96)
    for gap, met in ((0.02, True), (0.2, False)):  # shares drifting towards equal: 0.4 / (1/3) - 1
        checked = targets({**result, "fsdp_share_gap_vs_ddp": gap}, "real")
        assert checked["FSDP2 shares within 5% of DDP's"] == {"value": gap, "target": 0.05, "met": met}
    assert "FSDP2 shares within 5% of DDP's" not in targets(result, "real")  # DDP runs: no such target


def test_the_overhead_target_is_the_total_under_1_percent_unless_rays_idle_floor_alone_reaches_it():
    from pdml_ray.bench.hetero import targets

    uniform, pdml = _pair([1000, 500], [1000, 500], 96, 0.01, 0.01)
    step_s = pdml["step_s"]
    pdml = {**pdml, "overhead_fraction": 0.004, "scheduler_cpu_s_per_step": 0.012 * step_s}
    low = figures(uniform, {**pdml, "ray_idle_cpu_s_per_step": 0.008 * step_s}, 96)
    assert low["scheduler_overhead_fraction"] == pytest.approx(0.016)
    assert low["pdml_added_overhead_fraction"] == pytest.approx(0.008)  # 0.4% workers + 1.2% - 0.8% actor
    assert low["overhead_fraction_actor_on_head_node"] == pytest.approx(0.004)
    checked = targets(low, "real")
    assert checked["scheduler_overhead_fraction < 0.01"]["met"] is False  # the floor is below 1%: the total counts
    high = figures(uniform, {**pdml, "ray_idle_cpu_s_per_step": 0.0105 * step_s}, 96)
    checked = targets(high, "real")
    assert "scheduler_overhead_fraction < 0.01" not in checked
    added = checked["pdml_added_overhead_fraction < 0.005 (Ray's idle floor >= 0.01)"]
    assert added["value"] == pytest.approx(0.0055) and added["met"] is False
    assert added["ray_idle_floor_fraction"] == pytest.approx(0.0105)
    lighter = figures(uniform, {**pdml, "overhead_fraction": 0.002, "ray_idle_cpu_s_per_step": 0.0105 * step_s}, 96)
    assert targets(lighter, "real")["pdml_added_overhead_fraction < 0.005 (Ray's idle floor >= 0.01)"]["met"] is True
    # no floor measured (demo's runs): the total counts
    assert "scheduler_overhead_fraction < 0.01" in targets(figures(uniform, pdml, 96), "real")


def test_the_node_relays_cpu_is_in_series_and_each_actor_carries_rays_floor():
    uniform, pdml = _pair([1000, 500], [1000, 500], 96, 0.01, 0.01)
    step_s = pdml["step_s"]
    pdml = {**pdml, "overhead_fraction": 0.004, "scheduler_cpu_s_per_step": 0.012 * step_s,
            "relay_cpu_s_per_step": 0.009 * step_s, "relays": 1, "ray_idle_cpu_s_per_step": 0.006 * step_s}
    f = figures(uniform, pdml, 96)
    assert f["relay_cpu_fraction"] == pytest.approx(0.009)
    assert f["scheduler_overhead_fraction"] == pytest.approx(0.025)  # workers + scheduler + relay
    assert f["ray_idle_floor_fraction"] == pytest.approx(0.012)  # one idle actor's floor per actor: two
    assert f["pdml_added_overhead_fraction"] == pytest.approx(0.013)
    assert f["overhead_fraction_actor_on_head_node"] == pytest.approx(0.013)  # the relay stays on the node


def test_the_settling_window_grows_with_the_decision_interval():
    """A decision is adopted two or three boundaries in: at a wide interval a third of the run is not
    enough to leave the unadapted steps out (at interval 20 of 60 steps the efficiency read 0.74)."""
    assert settling_steps(60, 5) == 20 and settling_steps(30, 5) == 15  # the defaults, as before
    assert settling_steps(60, 10) == 30 and settling_steps(120, 20) == 60
    with pytest.raises(SystemExit, match=r"--steps must be above 65 .*boundaries every 20 steps"):
        settling_steps(60, 20)


def test_the_actors_cpu_per_step_spans_whole_intervals_between_calls_and_never_divides_by_zero():
    from pdml_ray.bench.hetero import actor_cpu_per_step

    # one report call a boundary, every 50 steps, 5 ms of CPU each; the window starts at step 120
    marks = [(50 * k, 0.005 * k) for k in range(1, 6)]  # steps 50..250
    assert actor_cpu_per_step(marks, 120) == pytest.approx(0.005 / 50)  # from step 100's call to 250's
    assert actor_cpu_per_step(marks[:3], 120) == pytest.approx(0.005 / 50)  # one call in the window: 100 -> 150
    assert np.isnan(actor_cpu_per_step([(100, 0.1), (100, 0.2)], 90))  # no step between the marks
    assert np.isnan(actor_cpu_per_step([], 0)) and np.isnan(actor_cpu_per_step([(10, 0.1)], 0))
