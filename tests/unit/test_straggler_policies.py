"""Each straggler policy's decisions, what pipelined decodes contain, and convergence on a convex
problem (simulated clock, no Ray)."""

from __future__ import annotations

import pytest
import torch

from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.stragglers.delays import Death, NoStragglers, ShiftedExponential
from pdml_ray.stragglers.policy import Arrival, WorkerTask, make_combination
from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model, make_workers
from pdml_ray.stragglers.registry import POLICIES, make_policy
from pdml_ray.stragglers.run import FullObjective, minimize
from pdml_ray.stragglers.simulate import simulate

N, S, DIM, L2 = 8, 1, 8, 1e-2


def arrivals(policy, step, workers):
    """Arrivals as a worker would send them when every partition it holds is fresh at ``step``."""
    out = {}
    for w in workers:
        task = policy.task(w, step)
        out[w] = Arrival(w, step, tuple((p, c, step) for p, c in task.send))
    return out


@pytest.fixture(scope="module")
def problem():
    x, y = logistic_data(N * (N + S) * 16, DIM, seed=0)  # divisible by n and by n + b
    return x, y, FullObjective(logistic_model(DIM), logistic_loss, x, y, L2)


def test_registry_builds_every_policy_and_refuses_unknown_names():
    for name in POLICIES:
        policy = make_policy(name, workers=N, stragglers=S)
        assert policy.name == name
    with pytest.raises(ConfigError, match="valid names"):
        make_policy("fastest-m", workers=N, stragglers=S)
    with pytest.raises(ConfigError, match=r"\(s \+ 1\) \| n"):
        make_policy("pgc-fr", workers=7, stragglers=1)


def test_sync_waits_for_everyone_and_cannot_survive_a_death():
    p = make_policy("sync", workers=N, stragglers=S)
    alive = frozenset(range(N))
    assert not p.ready(0, arrivals(p, 0, range(N - 1)), alive)
    arr = arrivals(p, 0, range(N))
    assert p.ready(0, arr, alive)
    c = p.combine(0, list(arr.values()))
    assert c.exact and dict(c.weights) == {w: 1 / N for w in range(N)}
    assert not p.feasible(alive - {3})


def test_ignore_stragglers_rescales_the_first_n_minus_s():
    p = make_policy("ignore-stragglers", workers=N, stragglers=2)
    alive = frozenset(range(N))
    assert not p.ready(0, arrivals(p, 0, range(5)), alive)
    arr = arrivals(p, 0, [7, 0, 1, 2, 3, 4])
    assert p.ready(0, arr, alive)
    c = p.combine(0, list(arr.values()))
    assert not c.exact and c.missing == (5, 6)
    assert dict(c.weights) == {w: pytest.approx(1 / 6) for w in [0, 1, 2, 3, 4, 7]}
    assert p.feasible(alive - {1, 2}) and not p.feasible(alive - {1, 2, 3})


def test_backup_uses_n_plus_b_workers_and_the_first_n():
    p = make_policy("backup", workers=N, stragglers=2)
    assert p.num_workers == p.num_partitions == N + 2
    alive = frozenset(range(N + 2))
    assert not p.ready(0, arrivals(p, 0, range(N - 1)), alive)
    arr = arrivals(p, 0, range(2, N + 2))
    assert p.ready(0, arr, alive)
    c = p.combine(0, list(arr.values()))
    assert dict(c.weights) == {w: pytest.approx(1 / N) for w in range(2, N + 2)} and c.missing == (0, 1)


def test_gc_fr_is_ready_once_every_group_has_arrived():
    p = make_policy("gc-fr", workers=N, stragglers=S)
    alive = frozenset(range(N))
    assert p.task(3, 5).compute == (2, 3)  # group (2, 3): both partitions every step
    assert not p.ready(0, arrivals(p, 0, [0, 1, 2, 3, 4, 5]), alive)
    arr = arrivals(p, 0, [1, 2, 5, 6])  # one per group: enough, before n - s arrived
    assert p.ready(0, arr, alive)
    c = p.combine(0, list(arr.values()))
    assert c.exact and c.max_staleness == 0 and c.mix == pytest.approx(1.0)


def test_gc_cr_decodes_any_n_minus_s_exactly():
    p = make_policy("gc-cr", workers=N, stragglers=2)
    alive = frozenset(range(N))
    assert len(p.task(0, 0).compute) == 3
    assert not p.ready(0, arrivals(p, 0, range(5)), alive)
    for missing in [(0, 1), (3, 7), (2, 5)]:
        arr = arrivals(p, 0, [w for w in range(N) if w not in missing])
        assert p.ready(0, arr, alive)
        c = p.combine(0, list(arr.values()))
        assert c.exact and 0 < c.decode_error <= 1e-4, c.describe()  # the float32 bound (coding)
    with pytest.raises(PlanError, match="cannot decode"):
        p.combine(0, list(arrivals(p, 0, range(4)).values()))


@pytest.mark.parametrize("name,n,s", [("pgc-fr", 8, 1), ("pgc-cr", 8, 1), ("pgc-cr", 9, 2), ("pgc-fr", 6, 2)])
def test_pgc_schedule_one_partition_per_step_and_holders_aligned(name, n, s):
    p = make_policy(name, workers=n, stragglers=s)
    assert len(p.task(0, 0).compute) == s + 1  # warm-up fills the pipeline
    for step in range(1, 3 * (s + 1) + 1):
        computed = {w: p.task(w, step).compute for w in range(n)}
        assert all(len(c) == 1 for c in computed.values())
        for part in range(n):
            holders = [w for w in range(n) if part in p.placement(w)]
            doing = [w for w in holders if computed[w] == (part,)]
            assert doing in ([], holders), f"step {step}: holders {holders} of {part}, computing: {doing}"
    # every partition held comes round once every s + 1 steps
    assert sorted(p.task(0, t).compute[0] for t in range(1, s + 2)) == sorted(p.placement(0))


def test_pgc_decode_contents_without_stragglers(problem):
    """Each decode is (1/n) sum_p g_p at the last step p was scheduled: staleness 0..s, exact."""
    x, y, evaluate = problem
    for name in ("pgc-fr", "pgc-cr"):
        p = make_policy(name, workers=N, stragglers=S)
        r = simulate(p, make_workers(p, x, y, l2=L2, straggler_model=NoStragglers(), per_sample_s=1e-3),
                     torch.zeros(DIM + 1), lr=0.5, steps=8, evaluate=evaluate)
        for rec in r.records:
            c = rec.combination
            assert c.exact and c.mix == pytest.approx(1.0), c.describe()
            versions = {t.partition: t.computed_step for t in c.contents}
            for part, v in versions.items():
                expected = 0 if rec.step == 0 else max(t for t in range(0, rec.step + 1)
                                                       if t == 0 or (t >= 1 and part % (S + 1) == t % (S + 1)))
                assert v == expected, (name, rec.step, part, v, expected)
            assert c.max_staleness <= S


def test_pgc_cr_catch_up_keeps_decodes_exact_where_mixing_would_not(problem):
    x, y, evaluate = problem
    model = ShiftedExponential(1.0, seed=3)
    runs = {}
    for catch_up in (False, True):
        p = make_policy("pgc-cr", workers=N, stragglers=S)
        p.catch_up = catch_up  # type: ignore[attr-defined]
        runs[catch_up] = simulate(p, make_workers(p, x, y, l2=L2, straggler_model=model, per_sample_s=1e-3),
                                  torch.zeros(DIM + 1), lr=0.5, steps=20, evaluate=evaluate)
    mixed = [r.combination for r in runs[False].records if not r.combination.exact]
    assert mixed and max(c.mix for c in mixed) > 1.05  # versions of a partition mix with both signs
    assert runs[True].exact_fraction == 1.0
    assert runs[True].partitions_per_step == 1.0 and 1.0 < runs[True].partitions_per_step_mean < 1.5


def test_combination_contents_of_mixed_versions():
    arr = [Arrival(0, 5, ((0, 2.0, 5), (1, -1.0, 3))), Arrival(1, 5, ((1, 1.0, 5),))]
    c = make_combination(5, {0: 0.25, 1: 0.75}, arr, num_partitions=2)
    got = {(t.partition, t.computed_step): t.weight for t in c.contents}
    assert got == {(0, 5): 0.5, (1, 3): -0.25, (1, 5): 0.75}
    assert not c.exact and c.mix == pytest.approx(2.0) and c.max_staleness == 2
    with pytest.raises(PlanError, match="did not arrive"):
        make_combination(5, {2: 1.0}, arr, num_partitions=2)


def test_every_policy_converges_to_syncs_optimum(problem):
    """Shifted-exponential stragglers; after 150 steps of lr 1.0 every policy's loss is within 1e-3
    of sync's and its parameters within 0.05 (sync itself is within 1e-4 of the L-BFGS optimum)."""
    x, y, evaluate = problem
    best, _ = minimize(evaluate, DIM, max_iter=300)
    finals = {}
    for name in POLICIES:
        p = make_policy(name, workers=N, stragglers=S)
        r = simulate(p, make_workers(p, x, y, l2=L2, straggler_model=ShiftedExponential(1.0, seed=0),
                                     per_sample_s=1e-3),
                     torch.zeros(DIM + 1), lr=1.0, steps=150, evaluate=evaluate)
        assert r.stalled is None and len(r.records) == 150
        finals[name] = r
    sync = finals["sync"]
    assert sync.final_loss - best < 1e-4
    for name, r in finals.items():
        assert abs(r.final_loss - sync.final_loss) < 1e-3, (name, r.final_loss, sync.final_loss)
        assert float((r.params - sync.params).norm()) < 0.05 * float(sync.params.norm()), name
    for name in ("gc-fr", "gc-cr"):  # exact codes: the same trajectory as sync, to float rounding
        assert float((finals[name].params - sync.params).norm()) < 1e-4


def test_a_death_stalls_sync_and_not_the_codes(problem):
    x, y, evaluate = problem
    model = Death((3,), 4, ShiftedExponential(1.0, seed=0))
    for name in POLICIES:
        p = make_policy(name, workers=N, stragglers=S)
        r = simulate(p, make_workers(p, x, y, l2=L2, straggler_model=model, per_sample_s=1e-3),
                     torch.zeros(DIM + 1), lr=1.0, steps=12, evaluate=evaluate)
        if name == "sync":
            assert r.stalled is not None and "[3]" in r.stalled and len(r.records) == 4
        else:
            assert r.stalled is None and len(r.records) == 12, (name, r.stalled)
            assert r.final_loss < r.initial_loss - 0.1
            assert all(3 not in rec.arrived for rec in r.records[4:])


def test_a_cut_short_gradient_is_resumed_not_restarted(problem):
    """pgc catch-up asks for (partition, step) a worker was cut off computing: it sleeps only the rest."""
    x, y, _ = problem
    p = make_policy("pgc-cr", workers=N, stragglers=S)
    worker = make_workers(p, x, y, l2=L2, per_sample_s=1e-3)[0]
    send = p.task(0, 0).send
    part, other = p.placement(0)
    theta0, theta1 = torch.zeros(DIM + 1), torch.full((DIM + 1,), 0.1)
    first = worker.compute(1, theta0, WorkerTask(0, 1, (part,), send))
    size = first.work_samples
    worker.cut(first, 0.75)
    resumed = worker.compute(2, theta1, WorkerTask(0, 2, (other,), send, ((part, 1),)), {1: theta0})
    assert resumed.work[part] == pytest.approx(0.25 * size) and resumed.work[other] == size  # a quarter left
    assert torch.equal(resumed.fresh[part][0], first.fresh[part][0]) and resumed.fresh[part][1] == 1
    _, reply = worker.commit(resumed)
    assert reply.arrival.versions() == {part: 1, other: 2}
    again = worker.compute(3, theta1, WorkerTask(0, 3, (other,), send, ((part, 1),)), {1: theta0})
    assert again.work[part] == size  # nothing unfinished any more: a full recompute


def test_pgc_cr_is_refused_when_s_plus_1_does_not_divide_n():
    """Its holders of a partition would compute it at different steps: no decode after the warm-up was
    exact at n=10, s=3, with a partition's versions weighted up to 344x its share."""
    for n, s in [(10, 3), (7, 2), (5, 1)]:
        with pytest.raises(ConfigError, match=r"pipelined CR .*\(s \+ 1\) \| n"):
            make_policy("pgc-cr", workers=n, stragglers=s)
    assert make_policy("gc-cr", workers=10, stragglers=3).s == 3  # plain CR has no such condition


class _Alternating:
    """Worker w is 10x slow at the steps where w + step is odd: each of a pgc-fr group's two members
    is cut off at every other step, always when the same partition is scheduled."""

    label = "alternating"

    def factor(self, worker: int, step: int) -> float:
        return 10.0 if (worker + step) % 2 else 1.0

    def death_step(self, worker: int) -> int | None:
        return None


def test_pgc_fr_staleness_is_unbounded_without_catch_up_and_at_most_s_with_it(problem):
    """pgc-fr's default (no catch-up) decodes every partition once, but a member that is always cut off
    when p is scheduled keeps its warm-up g_p, and the group's only arrival is that member: staleness
    grows with the step (the benchmark measured 11 at s=1). catch_up=True bounds it at s."""
    x, y, evaluate = problem
    staleness = {}
    for catch_up in (False, True):
        p = make_policy("pgc-fr", workers=N, stragglers=S)
        p.catch_up = catch_up  # type: ignore[attr-defined]
        r = simulate(p, make_workers(p, x, y, l2=L2, straggler_model=_Alternating(), per_sample_s=1e-3),
                     torch.zeros(DIM + 1), lr=0.5, steps=16, evaluate=evaluate)
        staleness[catch_up] = [rec.combination.max_staleness for rec in r.records]
        if catch_up:
            assert all(rec.combination.exact for rec in r.records), [rec.combination.describe() for rec in r.records]
    # even steps use the even members, whose odd partitions are the warm-up's (odd steps lack the
    # partitions the odd members never finished: Combination.missing)
    assert staleness[False][2::2] == list(range(2, 16, 2)), staleness[False]
    assert max(staleness[True]) <= S, staleness[True]
