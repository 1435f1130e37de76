"""Bad arguments to every ``pdml-ray`` subcommand: exit status 2 (or 1), one clear line on stderr, no
traceback, no hang, and nothing started (no Ray, no simulation, no benchmark) for invalid input.

The property tests feed random bad values (out of range, nan/inf, non-numbers, empty and odd strings)
to ``pdml_ray.cli.main`` in-process. Whatever would start work is replaced by a tripwire that raises
``Started`` (a BaseException, which ``main`` does not catch): reaching it with an invalid argument
fails the test, as does a traceback or a call that takes longer than ``LIMIT_S``. Each property also
counts its inputs; ``pytest -s`` prints the counts per subcommand at the end of the module.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib
import math
import os
import re
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pdml_ray.cli.cluster as cluster
import pdml_ray.cli.simulate as simulate
from pdml_ray.cli import BENCH_HELP, COMMANDS, benchmarks, build_parser, main
from pdml_ray.cli.args import SEED_MAX, float_range, int_range, ray_address

LIMIT_S = 20  # per call: validation takes milliseconds; the first call of a verb imports its module
EXAMPLES = 120
COUNTS: collections.Counter[str] = collections.Counter()
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much,
                                           HealthCheck.too_slow])


class Started(BaseException):
    """Raised by the tripwires: work began although the arguments were invalid."""


class Hang(BaseException):
    pass


def _trip(*args, **kwargs):
    raise Started(f"work started with args={args!r} kwargs={kwargs!r}")


@pytest.fixture(autouse=True)
def tripwires(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "init", _trip)
    monkeypatch.setattr(cluster, "probe", _trip)
    monkeypatch.setattr(cluster, "connect", _trip)
    monkeypatch.setattr(simulate, "report", _trip)
    import pdml_ray.cli.simulate_stragglers as simulate_stragglers

    monkeypatch.setattr(simulate_stragglers, "report", _trip)
    for module_name in benchmarks().values():
        with contextlib.suppress(ImportError):
            monkeypatch.setattr(importlib.import_module(module_name), "run", _trip)


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    if COUNTS:
        print("\nfuzzed inputs per subcommand (crashes and hangs fail the test, so both are 0 when it passes):")
        for name, n in sorted(COUNTS.items()):
            print(f"  {name:28s} {n}")


def _alarm(signum, frame):
    raise Hang(f"no answer within {LIMIT_S} s")


def call(argv: list[str], capsys) -> tuple[int, str, float]:
    """(exit status, stderr, seconds) of ``main(argv)``, with a time limit."""
    capsys.readouterr()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    t0 = time.monotonic()
    try:
        status = main(argv)
    except (Started, Hang) as e:  # an AssertionError, so that hypothesis shrinks and shows the input
        raise AssertionError(f"{argv!r}: {type(e).__name__}: {e}") from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return status, capsys.readouterr().err, time.monotonic() - t0


def assert_refused(argv: list[str], capsys, label: str, statuses=(2,)) -> str:
    status, err, _ = call(argv, capsys)
    COUNTS[label] += 1
    assert status in statuses, (argv, status, err)
    assert "Traceback" not in err, (argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], (argv, err)  # one clear line
    return lines[0]


# ---- what is valid, written from the documented ranges (not from the implementation) --------------

def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _as_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def int_in(low: int, high: int):
    return lambda t: (v := _as_int(t)) is not None and low <= v <= high


def float_in(low: float, high: float, low_open: bool = False):
    return lambda t: (v := _as_float(t)) is not None and (v > low if low_open else v >= low) and v <= high


def valid_address(text: str) -> bool:
    if text in ("auto", "local"):
        return True
    m = re.fullmatch(r"(.+):([0-9]+)", text[len("ray://"):] if text.startswith("ray://") else text, flags=re.S)
    return bool(m) and bool(m.group(1).strip()) and m.group(2).isascii() and 1 <= int(m.group(2)) <= 65535


def valid_speeds(text: str) -> bool:
    parts = text.split(",")
    return 1 <= len(parts) <= 64 and all((v := _as_float(p)) is not None and 0 < v <= 1 for p in parts)


def valid_sim_replicas(text: str) -> bool:  # with the default 4 stages
    counts = text.split(",")
    return len(counts) in (1, 4) and all(int_in(1, 64)(c) for c in counts)


def valid_sim_speeds(text: str) -> bool:  # the default cluster: 4 stages x 2 replicas
    rows = [r.split(",") for r in text.split(";")]
    return [len(r) for r in rows] == [2, 2, 2, 2] and all(float_in(0, 1000, low_open=True)(x) for r in rows for x in r)


def valid_slow(text: str) -> bool:
    m = re.fullmatch(r"([^:=]*):([^:=]*)=(.*)", text, flags=re.S)
    return bool(m) and int_in(0, 3)(m.group(1)) and int_in(0, 1)(m.group(2)) and float_in(0, 1000, True)(m.group(3))


SCHEDULES = ("gpipe", "1f1b", "1f1b-weighted", "critical-path", "osprey", "auto")


def valid_schedules(text: str) -> bool:
    names = [n.strip() for n in text.split(",") if n.strip()]
    return bool(names) and all(n in SCHEDULES for n in names)


def one_of(*choices: str):
    return lambda t: t in choices


def non_blank(text: str) -> bool:
    return bool(text.strip())


# Per verb: option -> predicate of a valid value. Everything else must be refused.
SPECS: dict[str, dict[str, object]] = {
    "demo": {"--speeds": valid_speeds, "--steps": int_in(30, 100_000), "--global-batch": int_in(4, 10**7),
             "--hidden": int_in(1, 65_536), "--seed": int_in(0, SEED_MAX), "--device": one_of("cpu", "cuda"),
             "--address": valid_address, "--sync": one_of("ddp", "fsdp"), "--compute": one_of("real", "sleep"),
             "--per-sample-ms": float_in(0, 10_000, low_open=True)},
    "status": {"--address": valid_address, "--name": non_blank, "--namespace": non_blank},
    "watch": {"--address": valid_address, "--name": non_blank, "--namespace": non_blank,
              "--interval": float_in(0.1, 3600), "--count": int_in(0, 10**9)},
    "simulate": {"--stages": int_in(1, 64), "--replicas": valid_sim_replicas, "--microbatches": int_in(1, 4096),
                 "--profile": one_of("homogeneous", "heterogeneous", "noisy"), "--speeds": valid_sim_speeds,
                 "--slow": valid_slow, "--forward-s": float_in(0, 1e6, True), "--backward-s": float_in(0, 1e6, True),
                 "--noise": float_in(0, 3), "--mb-cv": float_in(0, 3), "--drift": float_in(0, 1),
                 "--transfer-s": float_in(0, 1e6), "--memory-limit": int_in(1, 10**6), "--steps": int_in(1, 10_000),
                 "--schedules": valid_schedules, "--seed": int_in(0, SEED_MAX),
                 "--scenario": lambda t: os.path.exists(t), "--json": non_blank},
}

_chars = st.characters(blacklist_categories=("Cs",))
BAD_TEXT = st.one_of(
    st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "+inf", "1e999", "-0", "0", "-1", "abc", "1,", ",",
                     ";", "1;;1", "0x10", "1_0", "--", "-", "=", ":", "0:0=", "0:0=nan", "9:9=1", "1e-400",
                     "\n", "1\n2", "é", "١", "None", "null", "[]"]),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=16).map(repr), min_size=1, max_size=5).map(",".join),
    st.text(_chars, max_size=12))


def bad_argument(verb: str):
    spec = SPECS[verb]
    return st.sampled_from(sorted(spec)).flatmap(
        lambda opt: BAD_TEXT.filter(lambda t: not spec[opt](t)).map(lambda t: [f"{opt}={t}"]))  # type: ignore[operator]


# ---- the properties ---------------------------------------------------------------------------------

@pytest.mark.parametrize("verb", sorted(SPECS))
def test_bad_values_are_one_line_and_status_2_and_start_nothing(verb, capsys):
    @SETTINGS
    @given(args=bad_argument(verb))
    def check(args):
        assert_refused([verb, *args], capsys, verb)

    check()


@SETTINGS
@given(stages=st.integers(1, 64), replicas=st.lists(st.integers(1, 64), min_size=2, max_size=8),
       slow=st.tuples(st.integers(0, 63), st.integers(0, 63)))
def test_simulate_refuses_shapes_that_do_not_fit_the_cluster(stages, replicas, slow, capsys):
    """Values each in range, together inconsistent: replica counts vs stages, --slow outside the cluster."""
    if len(replicas) != stages:
        line = assert_refused(["simulate", f"--stages={stages}", f"--replicas={','.join(map(str, replicas))}"],
                              capsys, "simulate (shapes)")
        assert "--replicas" in line
    k, r = slow
    if k >= stages or r >= 2:
        line = assert_refused(["simulate", f"--stages={stages}", f"--slow={k}:{r}=0.5"], capsys, "simulate (shapes)")
        assert "--slow" in line


def test_simulate_refuses_work_that_would_look_like_a_hang(capsys):
    line = assert_refused(["simulate", "--stages=64", "--microbatches=4096", "--steps=10000"], capsys, "simulate (size)")
    assert "simulated actions" in line


@SETTINGS
@given(doc=st.dictionaries(st.sampled_from(sorted(simulate.PIPELINE_TYPES) + ["kind", "bogus"]),
                           st.one_of(BAD_TEXT, st.lists(st.integers(-3, 99), max_size=4), st.none(), st.booleans()),
                           min_size=1, max_size=3))
def test_simulate_scenario_files_are_checked_like_the_flags(doc, tmp_path_factory, capsys, monkeypatch):
    import yaml

    import pdml_ray.cli.simulate_stragglers as simulate_stragglers

    monkeypatch.setattr(simulate, "report", lambda *a, **k: 0)  # a scenario that happens to be valid "runs"
    monkeypatch.setattr(simulate_stragglers, "report", lambda *a, **k: 0)
    path = tmp_path_factory.mktemp("scenario") / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    status, err, _ = call(["simulate", f"--scenario={path}"], capsys)
    COUNTS["simulate --scenario"] += 1
    assert status == 2 or (status == 0 and not err), (doc, status, err)  # 0 only if all happened to be valid
    if status:
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _pdml_sections():
    from pdml_ray.config import PDMLConfig

    return {f.name: f for f in dataclasses.fields(PDMLConfig)}


@SETTINGS
@given(data=st.data())
def test_validate_config_never_crashes_on_bad_pdml_values(data, tmp_path_factory, capsys):
    """Random bad values in random fields: exit 0 (valid after all) or 1 with each error on its own line."""
    import typing

    import yaml

    from pdml_ray.config import PDMLConfig

    sections = _pdml_sections()
    doc: dict[str, object] = {}
    for name in data.draw(st.lists(st.sampled_from(sorted(sections)), min_size=1, max_size=3, unique=True)):
        hint = typing.get_type_hints(PDMLConfig)[name]
        nested = next((c for c in (typing.get_args(hint) or (hint,)) if dataclasses.is_dataclass(c)), None)
        bad = st.one_of(st.sampled_from([float("nan"), float("inf"), -1, 0, 10**12, "", "abc", None, [], {}, True]),
                        st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text(_chars, max_size=6))
        if nested is None:
            doc[name] = data.draw(bad)
        else:
            fields = sorted(f.name for f in dataclasses.fields(nested))
            doc[name] = data.draw(st.dictionaries(st.sampled_from(fields + ["bogus"]), bad, max_size=3))
    path = tmp_path_factory.mktemp("cfg") / "pdml.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    status, err, _ = call(["validate-config", str(path)], capsys)
    COUNTS["validate-config (pdml)"] += 1
    assert "Traceback" not in err
    assert status in (0, 1), (doc, status, err)
    if status == 1:
        head, *errors = err.strip().splitlines()
        assert "invalid pdml-ray config" in head and errors and all(e.startswith("  ") and e.strip() for e in errors)


@SETTINGS
@given(path=st.text(_chars, max_size=20).filter(lambda p: not os.path.exists(p) or os.path.isdir(p)))
def test_validate_config_missing_file_is_bad_usage(path, capsys):
    assert_refused(["validate-config", path], capsys, "validate-config (path)")


def test_install_dashboard_refuses_a_missing_session_and_installs_into_a_real_one(tmp_path, capsys, monkeypatch):
    for var in ("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR", "RAY_METRICS_OUTPUT_ROOT"):
        monkeypatch.delenv(var, raising=False)
    assert_refused(["install-dashboard", "--session-dir", str(tmp_path / "missing")], capsys, "install-dashboard")
    assert main(["install-dashboard", "--session-dir", str(tmp_path)]) == 0
    installed = tmp_path / "metrics" / "grafana" / "dashboards" / "pdml_grafana_dashboard.json"
    assert str(installed) in capsys.readouterr().out and installed.read_bytes().startswith(b"{")


def _bench_numeric_and_choice_options(name: str) -> list[argparse.Action]:
    parser = build_parser(["bench", name])
    bench = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    leaf = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return [a for a in leaf._actions if a.option_strings and (a.type in (int, float) or a.choices)]


@pytest.mark.parametrize("name", sorted(benchmarks()))
def test_bench_flags_refuse_nan_inf_negatives_and_junk(name, capsys):
    """bench NAME: numbers must be finite and >= 0, choices among the listed ones; each benchmark checks
    its own finer ranges (its module is another component's)."""
    options = _bench_numeric_and_choice_options(name)  # a bench module that fails to import fails here

    def valid(action: argparse.Action, text: str) -> bool:
        if action.choices:
            return text in action.choices
        value = _as_int(text) if action.type is int else _as_float(text)
        return value is not None and value >= 0

    @SETTINGS
    @given(data=st.data())
    def check(data):
        action = data.draw(st.sampled_from(options))
        text = data.draw(BAD_TEXT.filter(lambda t: not valid(action, t)))
        assert_refused(["bench", name, f"{action.option_strings[-1]}={text}"], capsys, f"bench {name}")

    check()


# ---- the argument types and the top level, by example -----------------------------------------------

def test_types_say_what_is_wrong():
    with pytest.raises(argparse.ArgumentTypeError, match=r"integer in \[1, 64\], got '0'"):
        int_range(1, 64)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="finite number, got 'nan'"):
        float_range(0.0, 3.0)("nan")
    with pytest.raises(argparse.ArgumentTypeError, match=r"number in \(0, 1\]"):
        float_range(0.0, 1.0, low_open=True)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="port in 1..65535"):
        ray_address("localhost:99999")
    assert int_range(1, 64)(" 7 ") == 7 and float_range(0.0, 3.0)("0.5") == 0.5
    assert ray_address("10.0.0.1:6379") == "10.0.0.1:6379" and ray_address("ray://h:10001") == "ray://h:10001"


def test_unknown_verbs_and_missing_ones_are_one_line(capsys):
    assert "invalid choice" in assert_refused(["nosuch"], capsys, "top level")
    assert "required" in assert_refused([], capsys, "top level")
    assert "invalid choice" in assert_refused(["bench", "nosuch"], capsys, "top level")


def test_version_and_help_answer_with_status_0(capsys):
    assert main(["--version"]) == 0
    assert re.fullmatch(r"pdml-ray \d+\.\d+\S*\n", capsys.readouterr().out)
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in (*COMMANDS, "bench"):
        assert verb in out
    assert BENCH_HELP.split(":")[0] in out


def test_an_unexpected_error_is_one_line_unless_debug(monkeypatch, capsys):
    def boom(args):
        raise KeyError("surprise")

    monkeypatch.setattr(simulate, "run", boom)
    assert main(["simulate"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KeyError" in err and "--debug" in err and "Traceback" not in err
    with pytest.raises(KeyError):
        main(["--debug", "simulate"])
    with pytest.raises(KeyError):
        main(["simulate", "--debug"])


def test_ctrl_c_is_status_130_and_one_line(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate, "run", interrupted)
    assert main(["simulate"]) == 130
    assert capsys.readouterr().err == "pdml-ray simulate: interrupted\n"


def test_watch_ends_cleanly_on_ctrl_c(monkeypatch, capsys):
    import pdml_ray.cli.status as status
    import pdml_ray.cli.watch as watch

    monkeypatch.setattr(cluster, "connect", lambda address: None)
    monkeypatch.setattr(status, "fetch_stats", lambda args: {})
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(watch.time, "sleep", sleep)
    assert main(["watch", "--interval", "0.5"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("--- ") == 2 and captured.err == "" and sleeps == [0.5, 0.5]


def test_status_json_turns_numpy_and_nan_into_plain_json():
    import json

    import numpy as np

    from pdml_ray.cli.status import to_jsonable

    @dataclasses.dataclass(frozen=True)
    class Record:
        sizes: np.ndarray
        rate: np.float64
        by_worker: dict
        missing: float

    value = to_jsonable(Record(np.array([3, 5]), np.float64(2.5), {0: (1, 2)}, float("nan")))
    assert value == {"sizes": [3, 5], "rate": 2.5, "by_worker": {"0": [1, 2]}, "missing": None}
    json.dumps(value, allow_nan=False)


def test_bench_pipeline_scenarios_none_skips_the_section_and_is_not_read_as_a_bare_dashdash():
    from pdml_ray.cli import check_parsed

    argv = ["bench", "pipeline", "--scenarios", "none"]
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    check_parsed(parser, args)  # an empty selection is not the bare `--` check_parsed refuses
    assert args.scenarios == ()
    args = parser.parse_args(["bench", "pipeline", "--scenarios", "drift,uneven"])
    assert args.scenarios == ("drift", "uneven")
