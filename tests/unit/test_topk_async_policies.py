"""The ``topk`` and ``async`` straggler policies' decisions (priority choice, rescaling, no starvation,
staleness bound and weights) and the in-process gradient feed, on the simulated clock (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pdml_ray.config import GradientPriorityConfig
from pdml_ray.decisions import GradientDecision, WorkerReport
from pdml_ray.errors import ConfigError
from pdml_ray.stragglers.delays import FixedSlowdown, ShiftedExponential
from pdml_ray.stragglers.gradient_feed import GradientFeed
from pdml_ray.stragglers.policies.async_updates import AsyncPolicy
from pdml_ray.stragglers.policies.topk import TopKPolicy
from pdml_ray.stragglers.policy import Arrival
from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model, make_workers
from pdml_ray.stragglers.registry import make_policy
from pdml_ray.stragglers.run import FullObjective
from pdml_ray.stragglers.simulate import simulate

N, S, DIM, L2 = 8, 1, 8, 1e-2


def decision(priorities, k=0.5, max_wait=4, max_staleness=2):
    return GradientDecision(version=1, effective_step=0, priorities=tuple(float(p) for p in priorities),
                            k_fraction=k, weights=(0.5, 0.3, 0.2), max_wait=max_wait, max_staleness=max_staleness)


def arrive(workers, step, computed=None):
    return [Arrival(w, computed if computed is not None else step, ((w, 1.0, computed if computed is not None else step),))
            for w in workers]


# -- topk -------------------------------------------------------------------------------------------
def test_registry_builds_both_with_the_gradient_config():
    for name in ("topk", "async"):
        p = make_policy(name, workers=N, stragglers=S)
        assert p.name == name and isinstance(p.gradient_priority, GradientPriorityConfig)
    assert make_policy("sync", workers=N, stragglers=S).gradient_priority is None


def test_topk_applies_the_highest_priorities_rescaled_to_the_arrived_mean():
    p = TopKPolicy(N, S)
    p.adopt(decision([8, 1, 7, 2, 6, 3, 5, 4], k=0.5))
    arrived = [0, 1, 2, 3, 4, 5, 7]  # worker 6 (priority 5) straggles: m = 7, k = ceil(3.5) = 4
    assert p.ready(0, {a.worker: a for a in arrive(arrived, 0)}, frozenset(range(N)))
    c = p.combine(0, arrive(arrived, 0))
    w = dict(c.weights)
    assert sorted(w) == [0, 2, 4, 7]  # priorities 8, 7, 6, 4: the top 4 of the arrived
    assert all(x == pytest.approx(1 / 4) for x in w.values()) and sum(w.values()) == pytest.approx(1.0)
    assert "biased" in c.note and not c.exact


def test_topk_before_any_decision_is_ignore_stragglers():
    p, ref = TopKPolicy(N, S), make_policy("ignore-stragglers", workers=N, stragglers=S)
    arr = arrive([7, 0, 1, 2, 3, 4, 5], 0)
    assert dict(p.combine(0, arr).weights) == pytest.approx(dict(ref.combine(0, arr).weights))


def test_topk_due_workers_stand_for_themselves_and_the_rest_for_the_others():
    p = TopKPolicy(N, S)
    p.adopt(decision([8, 1, 7, 2, 6, 3, 5, 4], k=0.5, max_wait=3))
    p.last_applied = np.array([5, 2, 5, 2, 5, 5, 5, 5])  # at step 5 workers 1 and 3 are due (5 - 2 >= 3)
    arrived = [0, 1, 2, 3, 4, 5, 7]
    w = dict(p.combine(5, arrive(arrived, 5)).weights)
    m, d, r = 7, 2, 2
    assert w[1] == w[3] == pytest.approx(1 / m)
    assert sorted(set(w) - {1, 3}) == [0, 2] and w[0] == w[2] == pytest.approx((m - d) / (m * r))
    assert sum(w.values()) == pytest.approx(1.0)
    assert list(p.last_applied) == [5, 5, 5, 5, 5, 5, 5, 5]


def test_topk_at_random_is_unbiased_for_the_arrived_mean():
    """Horvitz-Thompson: E[weight] = 1/m for every arrived worker, due or not."""
    p = TopKPolicy(N, S, seed=3, selection="random")
    p.adopt(decision([8, 1, 7, 2, 6, 3, 5, 4], k=0.5, max_wait=3))
    arrived, total, trials = [0, 1, 2, 3, 4, 5, 7], np.zeros(N), 4000
    for t in range(trials):
        p.last_applied = np.array([t, t - 3, t, t, t, t, t, t])  # worker 1 due, the others not
        for w, x in p.combine(t, arrive(arrived, t)).weights:
            total[w] += x
    mean = total / trials
    assert mean[6] == 0 and mean[1] == pytest.approx(1 / 7)  # 6 did not arrive; 1 is always in, at 1/m
    assert np.allclose(mean[[0, 2, 3, 4, 5, 7]], 1 / 7, rtol=0.06)


def test_topk_no_starvation_applies_every_arriving_worker_within_max_wait():
    p = TopKPolicy(N, S)
    p.adopt(decision([1, 9, 9, 9, 9, 9, 9, 9], k=0.25, max_wait=3))  # worker 0: always the lowest priority
    applied_at = []
    for step in range(30):
        arrived = [w for w in range(N) if w != step % N]  # one straggler per step, in turn
        if 0 in dict(p.combine(step, arrive(arrived, step)).weights):
            applied_at.append(step)
    gaps = np.diff([-1] + applied_at)
    assert applied_at and gaps.max() <= 3 + 1  # +1: a step at which worker 0 was the straggler


def test_topk_wait_for_due_waits_for_a_due_straggler():
    p = TopKPolicy(N, S, wait_for_due=True)
    p.adopt(decision([1] * N, k=0.5, max_wait=2))
    p.last_applied = np.array([3, 3, 3, 3, 3, 3, 3, 1])  # worker 7 due at step 3
    without_7 = {a.worker: a for a in arrive(range(7), 3)}
    assert not p.ready(3, without_7, frozenset(range(N)))
    assert p.ready(3, without_7, frozenset(range(7)))  # dead: not waited for
    assert TopKPolicy(N, S).ready(3, without_7, frozenset(range(N)))  # default: arrivals only


# -- async ------------------------------------------------------------------------------------------
def test_async_weights_by_staleness_and_refuses_beyond_the_bound():
    p = AsyncPolicy(N, N - 3)  # 3 per update
    p.adopt(decision([1] * N, max_staleness=2))
    arr = arrive([0, 1], 10) + arrive([2], 10, computed=9) + arrive([3], 10, computed=7)  # staleness 0, 0, 1, 3
    by = {a.worker: a for a in arr}
    assert p.ready(10, by, frozenset(range(N)))
    assert not p.ready(10, {w: by[w] for w in (0, 3)}, frozenset(range(N)))  # 3 is too stale to count
    c = p.combine(10, arr)
    assert dict(c.weights) == pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 0.5 / 3})
    assert c.max_staleness == 1 and 3 not in dict(c.weights)


def test_async_gives_tasks_to_idle_workers_and_abandons_only_unusable_ones():
    p = AsyncPolicy(N, S)
    p.adopt(decision([1] * N, max_staleness=2))
    assert p.gives_task(0, 5, None) and not p.gives_task(0, 5, 3) and p.gives_task(0, 5, 2)
    assert make_policy("topk", workers=N, stragglers=S).gives_task(0, 5, 4)  # synchronous: always


@pytest.fixture(scope="module")
def problem():
    x, y = logistic_data(N * 64, DIM, seed=0)
    return x, y, FullObjective(logistic_model(DIM), logistic_loss, x, y, L2)


def test_async_applies_a_slow_workers_gradient_late_within_the_bound(problem):
    x, y, evaluate = problem
    p = make_policy("async", workers=N, stragglers=4)  # 4 per update
    r = simulate(p, make_workers(p, x, y, l2=L2, straggler_model=FixedSlowdown((2,), 3.0), per_sample_s=1e-3),
                 torch.zeros(DIM + 1), lr=1.0, steps=30, evaluate=evaluate)
    assert r.stalled is None and r.final_loss < r.initial_loss - 0.2
    used_2 = [rec.combination for rec in r.records if 2 in dict(rec.combination.weights)]
    assert used_2 and all(c.max_staleness <= p.max_staleness for c in r.records for c in [c.combination])
    assert max(c.max_staleness for c in used_2) >= 1  # the 3x straggler's gradients arrive steps later
    assert sum(t.step_time_s for t in r.records) < 30 * 3 * 64e-3 * 0.6  # never waits for the straggler


def test_topk_in_the_simulator_adopts_the_derivers_k_and_converges(problem):
    x, y, evaluate = problem
    p = make_policy("topk", workers=N, stragglers=S)
    r = simulate(p, make_workers(p, x, y, l2=L2, straggler_model=ShiftedExponential(1.0, seed=0), per_sample_s=1e-3),
                 torch.zeros(DIM + 1), lr=1.0, steps=40, evaluate=evaluate)
    assert r.stalled is None and r.final_loss < r.initial_loss - 0.2
    sizes = [len(rec.combination.weights) for rec in r.records]
    assert sizes[0] == N - S and min(sizes) < N - S  # K = k_max until the deriver measured progress


# -- the feed ---------------------------------------------------------------------------------------
def test_feed_derives_from_reports_and_pins_fixed_weights():
    p = TopKPolicy(4, 1, fixed_weights=(1.0, 0.0, 0.0))
    feed = GradientFeed.for_policy(p)
    assert feed is not None
    for step in range(11):
        reports = [WorkerReport(worker_id=w, step=step, samples=16, compute_s=0.1, loss=1.0 / (1 + step),
                                grad_norm=float(w + 1)) for w in range(4)]
        feed.observe(step, reports, p)
    assert [s for s, _ in feed.k_history] == [5, 10] and feed.cost_s > 0
    assert feed.decision is not None and feed.decision.weights == (1.0, 0.0, 0.0)
    assert list(np.argsort(p.priorities)) == [0, 1, 2, 3]  # grad term only: priority follows the norm
    assert feed.stats()["high_low_grad_norm_ratio"] > 1.5


def test_a_request_a_slow_scheduler_could_not_take_is_sent_once_its_answer_is_in():
    from pdml_ray.client import LocalSchedulerTransport
    from pdml_ray.scheduler import Scheduler

    class Slow(LocalSchedulerTransport):  # an in-process scheduler whose answers take ``lag`` polls to arrive
        def __init__(self, scheduler, lag):
            super().__init__(scheduler)
            self.lag, self.waited, self.asked = lag, 0, []

        def submit(self, method, *args):
            if method == "bundle":
                self.asked.append(args[0].first_step)
                self.waited = 0
            return super().submit(method, *args)

        def ready(self, pending, timeout_s):
            self.waited += 1
            return self.waited > self.lag

    p = TopKPolicy(4, 1)
    probe = GradientFeed.for_policy(p)
    transport = Slow(Scheduler(probe.pdml_config, 4), lag=7)  # answered at the 8th poll: 6 steps later
    feed = GradientFeed.for_policy(p, transport=transport)
    for step in range(21):
        feed.observe(step, [WorkerReport(worker_id=w, step=step, samples=16, compute_s=0.1, loss=1.0 / (1 + step),
                                         grad_norm=float(w + 1)) for w in range(4)], p)
    # step 10's request waited for step 5's answer (step 11) and went out then; step 15's for that one (18)
    assert transport.asked == [5, 11, 18] and feed.requests_sent == 3
    assert [s for s, _ in feed.k_history] == [11, 18]


def test_a_pdml_config_carries_the_straggler_run_with_its_gradient_rule_and_interval():
    from pdml_ray.config import GradientPriorityConfig, PDMLConfig, StragglerConfig
    from pdml_ray.stragglers.gradient_feed import GradientFeed
    from pdml_ray.stragglers.registry import make_policy

    config = PDMLConfig.from_dict({"decision_interval": 3, "gradient_priority": {"max_wait": 7},
                                   "stragglers": {"policy": "topk", "workers": 4, "stragglers": 1}})
    assert config.stragglers == StragglerConfig(policy="topk", workers=4, stragglers=1)
    assert config.node_priority is None and config.pipeline is None  # only the axes it configures
    policy = make_policy("topk", workers=4, stragglers=1, gradient_priority=config.gradient_priority)
    assert policy.gradient_priority.max_wait == 7
    feed = GradientFeed.for_policy(policy, interval=config.decision_interval)
    assert feed is not None and feed.interval == 3 and feed.pdml_config.decision_interval == 3
    assert list(feed.scheduler.derivers) == ["gradient"]
    # a policy that uses no gradient priority is refused one, naming where it acts
    with pytest.raises(ConfigError, match=r"gc-fr uses no gradient priorities.*\['async', 'topk'\]"):
        make_policy("gc-fr", workers=4, stragglers=1, gradient_priority=GradientPriorityConfig())
    with pytest.raises(ConfigError, match="stragglers must be a StragglerConfig or None"):
        PDMLConfig(stragglers={"policy": "topk"})
