"""FR and CR gradient codes: every set of n - s arrivals decodes the sum of all partition gradients, in
float64 and within the stated bound in float32 (or the code is refused); decoders refuse bad input."""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import pytest
import torch

from pdml_ray.config.stragglers import StragglerConfig
from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.stragglers.coding import GradientCode, cr_support, fr_groups, straggler_sets

CASES = [(n, s, scheme) for n in range(1, 9) for s in range(n) for scheme in ("fr", "cr")
         if scheme == "cr" or n % (s + 1) == 0]


def _check_decodes(code: GradientCode, arrived: tuple[int, ...], G: np.ndarray) -> float:
    d = code.decode(arrived)
    assert d is not None, f"{code}: {arrived} did not decode"
    assert set(d.workers) <= set(arrived)
    messages = code.encode(G)  # float64
    decoded = sum(c * messages[w] for w, c in zip(d.workers, d.coefficients))
    exact = G.sum(axis=0)
    return float(np.linalg.norm(decoded - exact) / np.linalg.norm(exact))


@pytest.mark.parametrize("n,s,scheme", CASES)
def test_every_set_of_n_minus_s_decodes_exactly_in_float64(n, s, scheme):
    code = GradientCode(n, s, scheme, seed=0)
    G = np.random.default_rng(n * 10 + s).standard_normal((n, 32))
    worst = max(_check_decodes(code, a, G) for a in straggler_sets(n, s))
    assert worst < 1e-6
    # each worker holds exactly s + 1 partitions and every partition is held by s + 1 workers
    assert all(len(sup) == s + 1 for sup in code.supports)
    assert (code.matrix != 0).sum(axis=0).tolist() == [s + 1] * n


@pytest.mark.parametrize("n", [9, 12, 16])
def test_random_straggler_sets_up_to_16_workers(n):
    rng = np.random.default_rng(n)
    for s in (1, 2, 3):
        for scheme in ("fr", "cr"):
            if scheme == "fr" and n % (s + 1):
                continue
            if (n, s, scheme) == (16, 3, "cr"):  # no draw from seed 1 is accurate in float32
                with pytest.raises(ConfigError, match="error bound"):
                    GradientCode(n, s, scheme, seed=1)
                continue
            code = GradientCode(n, s, scheme, seed=1)
            G = rng.standard_normal((n, 16))
            for _ in range(25):
                arrived = tuple(sorted(rng.choice(n, size=n - s, replace=False).tolist()))
                assert _check_decodes(code, arrived, G) < 1e-6


def test_fr_decodes_with_zero_one_coefficients_one_per_group():
    code = GradientCode(8, 1, "fr")
    assert fr_groups(8, 1) == ((0, 1), (2, 3), (4, 5), (6, 7))
    d = code.decode([1, 2, 3, 4, 6, 7, 5])
    assert d is not None and set(d.coefficients) == {1.0} and len(d.workers) == 4
    assert [w // 2 for w in d.workers] == [0, 1, 2, 3]
    assert set(np.unique(code.matrix)) == {0.0, 1.0}
    assert code.decode([0, 1, 2, 3, 4, 5]) is None  # group 3 is missing entirely


def test_cr_placement_is_cyclic_and_decode_is_cached():
    code = GradientCode(5, 2, "cr", seed=3)
    assert [set(s) for s in code.supports] == [set(s) for s in cr_support(5, 2)]
    first = code.decode([0, 2, 4])
    assert first is not None and code.decode([4, 2, 0]) is first  # same set, same cached object
    assert 0 < first.error_bound < 1e-5
    assert code.decode([0, 2]) is None  # fewer than n - s: generically not decodable


def test_half_precision_messages_are_refused():
    with pytest.raises(PlanError, match="float32"):
        GradientCode(4, 1, "cr").encode(np.ones((4, 3), dtype=np.float16))


@pytest.mark.parametrize("n,s,scheme,match", [(7, 1, "fr", r"\(s \+ 1\) \| n"), (4, 4, "cr", "below the number"),
                                              (4, 5, "fr", "below the number"), (4, -1, "cr", ">= 0"),
                                              (4, 1, "xx", "scheme")])
def test_invalid_codes_are_refused_with_a_clear_error(n, s, scheme, match):
    with pytest.raises(ConfigError, match=match):
        GradientCode(n, s, scheme)


def test_config_validates_policy_names_and_codes():
    assert StragglerConfig(policy="gc-fr", workers=8, stragglers=3).workers == 8
    with pytest.raises(ConfigError, match="does not divide"):
        StragglerConfig(policy="pgc-fr", workers=8, stragglers=2)
    with pytest.raises(ConfigError, match="valid|must be one of"):
        StragglerConfig(policy="gc")
    with pytest.raises(ConfigError, match="workers=4"):
        StragglerConfig(policy="ignore-stragglers", workers=4, stragglers=4)
    StragglerConfig(policy="gc-cr", workers=7, stragglers=2)  # CR has no divisibility condition
    for n, s in [(7, 2), (10, 3)]:  # pipelined CR does: its holders would mix versions (up to 344x at n=10, s=3)
        with pytest.raises(ConfigError, match=r"pipelined CR .*needs \(s \+ 1\) \| n.*mixes its versions"):
            StragglerConfig(policy="pgc-cr", workers=n, stragglers=s)
    StragglerConfig(policy="pgc-cr", workers=9, stragglers=2)


# -- float32 accuracy: accepted by a bound from the matrix alone, or refused (coding's module doc) -----

LIMIT = 1e-4  # the acceptance bound on a decode's float32 error, x the mean partition-gradient norm


def _float32_messages(code: GradientCode, G: np.ndarray) -> np.ndarray:
    """(n, d) float32 messages built as a worker builds them: ``c * g`` summed in float32, in support order."""
    m = np.zeros_like(G)
    for i, support in enumerate(code.supports):
        for p in support:
            m[i] = m[i] + np.float32(code.matrix[i, p]) * G[p]
    return m


@functools.lru_cache(maxsize=1)
def _default_codes() -> dict[tuple[int, int, str], GradientCode | str]:
    """Every default code (seed 0) for n <= 12 and every valid s, or its refusal's message."""
    out: dict[tuple[int, int, str], GradientCode | str] = {}
    for n in range(1, 13):
        for s in range(n):
            for scheme in ("fr", "cr"):
                if scheme == "fr" and n % (s + 1):
                    continue
                try:
                    out[(n, s, scheme)] = GradientCode(n, s, scheme)
                except ConfigError as e:
                    out[(n, s, scheme)] = str(e)
    return out


def test_every_default_code_up_to_12_workers_decodes_within_the_bound_in_float32_or_is_refused():
    rng = np.random.default_rng(7)
    refused, worst, bounds = [], 0.0, []
    for (n, s, scheme), code in _default_codes().items():
        if isinstance(code, str):
            found = re.search(r"survivors \(([\d, ]+)\) have an error bound of ([\d.e+-]+)", code)
            assert found and float(found.group(2)) > LIMIT and scheme == "cr", code
            assert len(found.group(1).split(",")) == n - s
            refused.append((n, s))
            continue
        G = rng.standard_normal((n, 64)).astype(np.float32)
        m = _float32_messages(code, G).astype(np.float64)
        exact = G.astype(np.float64).sum(axis=0)
        scale = np.linalg.norm(G.astype(np.float64), axis=1).sum()  # sum_p ||g_p||
        for arrived in straggler_sets(n, s):
            d = code.decode(arrived)
            assert d is not None, (code, arrived)
            err = float(np.linalg.norm(np.asarray(d.coefficients) @ m[list(d.workers)] - exact) / scale)
            worst = max(worst, err)
            bounds.append((err, d, code, arrived))
    assert worst <= LIMIT  # the float32 decode itself, whatever a bound says (the issue's n=10, s=6: 0.09)
    for err, d, code, arrived in bounds:
        assert err <= d.error_bound <= LIMIT, (code, arrived, err, d.error_bound)
    # FR and most CR codes are accepted; the refusals are CR codes of n >= 10 with a middling s
    assert refused and all(n >= 10 and 3 <= s <= 8 for n, s in refused), refused


def test_the_issues_example_is_redrawn_n10_s6_seed0():
    """Its first draw decodes survivors (5, 6, 8, 9) with coefficients up to 2.3e6: ~28% off in float32."""
    from pdml_ray.stragglers.coding import _draw_cr, decode_bounds

    first = _draw_cr(10, 6, np.random.default_rng(0))
    a, bound = decode_bounds(first, np.array([(5, 6, 8, 9)]), 6)
    assert np.abs(a).max() > 1e6 and bound[0] > 1.0
    code = GradientCode(10, 6, "cr", seed=0)
    assert not np.array_equal(code.matrix, first)
    assert np.array_equal(code.matrix, GradientCode(10, 6, "cr", seed=0).matrix)  # reproducible from the seed
    d = code.decode((5, 6, 8, 9))
    assert d is not None and d.error_bound <= LIMIT


def test_an_inaccurate_code_is_refused_at_config_time_naming_its_worst_survivors():
    from pdml_ray.stragglers.coding import MAX_DECODE_BOUND

    assert MAX_DECODE_BOUND == LIMIT
    with pytest.raises(ConfigError, match=r"survivors \(.*\) have an error bound of .* code_seed"):
        StragglerConfig(policy="gc-cr", workers=12, stragglers=6)
    with pytest.raises(ConfigError, match="code_seed must be an integer >= 0"):
        StragglerConfig(policy="gc-cr", code_seed=-1)


# -- decoders refuse bad input with the project's error (issue 22, item 11) ---------------------------

FUZZ_SEED, FUZZ_INPUTS = 20261203, 2400


def _fuzz_id(rng: np.random.Generator, n: int) -> object:
    kind = int(rng.integers(12))
    return [lambda: int(rng.integers(n)), lambda: np.int64(rng.integers(n)), lambda: float(rng.integers(n)) + 0.5,
            lambda: float(rng.integers(n)), lambda: float("nan"), lambda: float("inf"), lambda: None,
            lambda: bool(rng.integers(2)), lambda: str(int(rng.integers(n))), lambda: int(rng.integers(-3, 0)),
            lambda: n + int(rng.integers(10**6)), lambda: 10**30][kind]()


def _fuzz_case(rng: np.random.Generator, code: GradientCode) -> tuple[str, object, bool]:
    """(target, input, valid): an input for decode (ids of every type, duplicates, too few or too many),
    encode (arrays of wrong shapes, dtypes, NaN) or combine_messages (messages likewise)."""
    from pdml_ray.stragglers.policy import Combination

    n, target = code.n, ["decode", "encode", "combine"][int(rng.integers(3))]
    if target == "decode":
        ids = [_fuzz_id(rng, n) if rng.random() < 0.3 else int(rng.integers(n)) for _ in range(int(rng.integers(0, n + 4)))]
        if rng.random() < 0.1:
            return target, rng.choice(["0,1", None, 3, 2.5]), False  # not a collection of ids at all
        valid = all(type(w) in (int, np.int64) and 0 <= w < n for w in ids)  # type: ignore[operator]
        return target, ids, valid
    shape = [(n, 5), (n,), (n + 1, 5), (n, 0), (), (2, n, 3)][int(rng.integers(6))]
    dtype = [np.float32, np.float64, np.float16, np.int64, np.complex64][int(rng.integers(5))]
    G = rng.standard_normal(shape).astype(dtype)
    if G.size and rng.random() < 0.3:
        G.flat[int(rng.integers(G.size))] = np.nan if np.issubdtype(dtype, np.floating) else 0
    if target == "encode":
        return target, G, dtype in (np.float32, np.float64) and len(shape) == 2 and shape[0] == n
    weights = tuple((w, 1.0) for w in range(n))
    msgs = {w: torch.from_numpy(np.ascontiguousarray(G.reshape(n, -1)[w] if G.ndim and G.shape[0] == n else G))
            for w in range(n)}
    if rng.random() < 0.2:
        msgs[int(rng.integers(n))] = torch.zeros(7, dtype=torch.float32)  # one message of another length
    ok_types = all(m.dtype in (torch.float32, torch.float64) and m.dim() == 1 for m in msgs.values())
    same = len({m.shape for m in msgs.values()}) == 1
    finite = all(bool(torch.isfinite(m).all()) for m in msgs.values()) if ok_types else False
    return target, (Combination(0, weights, (), n, True), msgs), ok_types and same and finite


def _run_fuzz_case(code: GradientCode, target: str, value: object) -> None:
    from pdml_ray.stragglers.policy import combine_messages

    if target == "decode":
        code.decode(value)  # type: ignore[arg-type]
    elif target == "encode":
        code.encode(value)  # type: ignore[arg-type]
    else:
        combine_messages(*value)  # type: ignore[misc]


def test_decoders_refuse_every_bad_input_with_a_short_project_error():
    """Seeded fuzz over decode / encode / combine_messages: a crash is any exception that is not a
    PDMLError with a message of one or two lines, or a bad input accepted. Before the fix, 808 of the
    2,400: 438 raised TypeError/ValueError/OverflowError/RuntimeError (decode 274, encode 114, combine
    50) and 370 bad inputs were accepted (decode 112: 1.5, True, "0" read as ids; encode 114; combine
    144: NaN sums); after: 0."""
    from pdml_ray.errors import PDMLError

    rng = np.random.default_rng(FUZZ_SEED)
    codes = [GradientCode(4, 1, "fr"), GradientCode(5, 2, "cr"), GradientCode(6, 0, "cr")]
    crashes: list[str] = []
    for i in range(FUZZ_INPUTS):
        code = codes[i % len(codes)]
        target, value, valid = _fuzz_case(rng, code)
        try:
            _run_fuzz_case(code, target, value)
        except PDMLError as e:
            if valid or str(e).count("\n") > 1:
                crashes.append(f"{target} {value!r}: {e}")
        except Exception as e:  # noqa: BLE001 - every other exception is a crash
            crashes.append(f"{target} {value!r}: {type(e).__name__}: {e}")
        else:
            if not valid:
                crashes.append(f"{target} {value!r}: accepted")
    assert not crashes, f"{len(crashes)} of {FUZZ_INPUTS} crashed (seed {FUZZ_SEED}); first: {crashes[:3]}"


@pytest.mark.parametrize("bad", [[0, float("nan")], [0, float("inf")], [None, 1], [1.5, 0], [True, 0], ["0", 1],
                                 [0, -1], [0, 9]])
def test_decode_refuses_ids_that_are_not_integers_in_range(bad):
    with pytest.raises(PlanError, match="worker id"):
        GradientCode(4, 1, "cr").decode(bad)
