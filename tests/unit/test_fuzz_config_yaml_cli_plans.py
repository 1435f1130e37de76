"""Issue 22, "bad input gets a clear error": seeded fuzzing of configs (dicts and direct construction),
YAML files, the ``pdml-ray`` command line and pipeline plans.

Every input comes from one seeded numpy generator per target (``SEEDS``), so a run is deterministic.
An input is accepted, or refused with a ``PDMLError`` whose message is at most ``MAX_LINES`` lines and
``MAX_CHARS`` characters; anything else is a crash: another exception type (``TypeError``,
``OverflowError``, ``RecursionError``, ``MemoryError``, ...), a longer message, or an input that takes
longer than ``MAX_SECONDS``. The YAML attacks (alias bombs, deep nesting, huge files) each run in a
forked child with a memory cap, so a crash there cannot take the test process down with it.
``pytest -s`` prints the inputs, refusals and crashes per target and the seeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import reprlib
import resource
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from pdml_ray.cli import main as cli_main
from pdml_ray.config import (ContinuityConfig, GradientPriorityConfig, NodePriorityConfig, OspreyConfig, P3Config,
                             PDMLConfig, PipelineConfig, SamplePriorityConfig)
from pdml_ray.errors import PDMLError
from pdml_ray.pipeline.plan import Plan, validate
from pdml_ray.pipeline.registry import make_schedule

MAX_LINES, MAX_CHARS, MAX_SECONDS = 2, 500, 10.0
"""A refusal is one or two lines of at most ~500 characters, within 10 s (a crash otherwise): far above a
refusal's milliseconds even on a loaded 2-core machine, far below the 33 s an alias bomb took."""
SEEDS = {"config dicts": 2201, "direct construction": 2202, "yaml": 2203, "cli": 2204, "plans": 2205}
COUNTS = {"config dicts": 3000, "direct construction": 3000, "yaml": 1500, "cli": 1200, "plans": 2000}
"""Inputs per target (10,700 in all, the YAML attacks on top)."""
PDMLConfig(pipeline=PipelineConfig(), p3=P3Config())  # imports the registries (torch) before any input is timed
TALLY: dict[str, Counter[str]] = {name: Counter() for name in SEEDS}
CRASHES: dict[str, list[str]] = {name: [] for name in SEEDS}


class _Slow(BaseException):
    """Raised by the interval timer into an input that runs past ``MAX_SECONDS`` (a crash)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Slow()


def _verdict(call: Callable[[], Any]) -> tuple[str, str]:
    """("accepted" | "refused" | "crash", what) for one input."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, MAX_SECONDS * 2)
    start = time.perf_counter()
    try:
        call()
        outcome = ("accepted", "")
    except PDMLError as e:
        message = str(e)
        lines = message.splitlines() or [""]
        if len(lines) > MAX_LINES or len(message) > MAX_CHARS:
            outcome = ("crash", f"{type(e).__name__} of {len(lines)} lines, {len(message)} chars: {message[:120]!r}")
        else:
            outcome = ("refused", message)
    except _Slow:
        outcome = ("crash", f"still running after {MAX_SECONDS * 2:g} s")
    except BaseException as e:  # noqa: BLE001 - SystemExit, RecursionError, MemoryError: every one is a finding
        outcome = ("crash", f"{type(e).__name__}: {str(e)[:120]}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if outcome[0] != "crash" and time.perf_counter() - start > MAX_SECONDS:
        outcome = ("crash", f"took {time.perf_counter() - start:.1f} s")
    return outcome


def _label(x: Any) -> str:
    """A short label of an input for the crash list (``str`` of a 5,000-digit integer raises)."""
    try:
        return reprlib.repr(x)
    except ValueError:
        return f"<a {type(x).__name__}>"


def _record(target: str, label: str, call: Callable[[], Any]) -> None:
    kind, what = _verdict(call)
    TALLY[target][kind] += 1
    if kind == "crash":
        CRASHES[target].append(f"{label[:160]} -> {what}")


# -- values ------------------------------------------------------------------------------------------
class _Weird:
    """An object no check foresees, whose repr is long."""

    def __repr__(self) -> str:
        return "weird" * 200


def _nested(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


NASTY: list[Any] = [None, True, False, "", "abc", "false", "x" * 5000, "\x00", 0, 1, -1, 2, 7, 10**18, -(10**18),
                    2**63, 10**400, -(10**400), 10**5000, 0.0, 0.5, 1.5, -0.5, 1e-300, 1e308, -1e308, math.nan,
                    math.inf, -math.inf, [], [1, 2], [0.5, 0.5, 0.0], [[1.0, 2.0]], [[1.0]], [math.nan, 1.0],
                    list(range(100_000)), _nested(200), {}, {"a": 1}, {"H100": 2.0}, {"H100": 10**400}, {1: 2},
                    {"k" * 3000: 1}, (1, 2), (10**400, 1.0), b"\x00\xff", bytearray(b"ab"), complex(1, 2),
                    np.int64(3), np.float64("nan"), np.bool_(True), np.array([1.0, 2.0]), _Weird(), object(),
                    {1, 2}, "1f1b", "gpipe", "osprey", "auto", "loss", "max", "p3", "fifo", "layer",
                    "sys:exit", "os:getcwd", "no_such_module_xyz:fn", "a.b:c", "not a name"]
PLAUSIBLE: list[Any] = [1, 2, 4, 16, 64, 1024, 0.1, 0.5, 0.9, 1.0, True, False, None, "1f1b", "osprey", "loss_ema",
                        "mean", [0.5, 0.3, 0.2], [[1.0, 2.0], [1.0, 2.0]], {"H100": 1.0}]
CONFIG_CLASSES = [NodePriorityConfig, SamplePriorityConfig, GradientPriorityConfig, ContinuityConfig, OspreyConfig,
                  PipelineConfig, P3Config, PDMLConfig]
FIELDS = {cls: [f.name for f in dataclasses.fields(cls)] for cls in CONFIG_CLASSES}
SECTION_CLASS = {"node_priority": NodePriorityConfig, "sample_priority": SamplePriorityConfig,
                 "gradient_priority": GradientPriorityConfig, "continuity": ContinuityConfig,
                 "pipeline": PipelineConfig, "p3": P3Config}


def _pick(rng: np.random.Generator, items: list[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _value(rng: np.random.Generator) -> Any:
    """A nasty value, a plausible one, or a random number, string or list."""
    r = rng.random()
    if r < 0.4:
        return _pick(rng, NASTY)
    if r < 0.7:
        return _pick(rng, PLAUSIBLE)
    if r < 0.8:
        return int(rng.integers(-5, 5000))
    if r < 0.9:
        return float(rng.standard_normal() * 10 ** int(rng.integers(-3, 300)))
    return [_pick(rng, PLAUSIBLE + NASTY[:30]) for _ in range(int(rng.integers(0, 4)))]


def _section_dict(rng: np.random.Generator, cls: type) -> dict[str, Any]:
    names = FIELDS[cls] + ["bogus"]
    out = {_pick(rng, names): _value(rng) for _ in range(int(rng.integers(0, 4)))}
    if cls is NodePriorityConfig and rng.random() < 0.7:
        out.setdefault("global_batch_size", 64)
    if cls is PipelineConfig and "osprey" in out and rng.random() < 0.5:
        out["osprey"] = _section_dict(rng, OspreyConfig)
    if cls is GradientPriorityConfig and "continuity" in out and rng.random() < 0.5:
        out["continuity"] = _section_dict(rng, ContinuityConfig)
    return out


def config_dict(rng: np.random.Generator) -> Any:
    """A PDMLConfig dict: some sections (mappings of fields, or a nasty value), top-level fields, strays."""
    if rng.random() < 0.03:
        return _pick(rng, NASTY)
    data: dict[Any, Any] = {}
    for _ in range(int(rng.integers(0, 4))):
        name = _pick(rng, list(SECTION_CLASS))
        data[name] = _section_dict(rng, SECTION_CLASS[name]) if rng.random() < 0.8 else _value(rng)
    for _ in range(int(rng.integers(0, 2))):
        data[_pick(rng, ["seed", "scheduler_name", "namespace", "bogus", 1, None])] = _value(rng)
    return data


def direct_kwargs(rng: np.random.Generator) -> tuple[type, dict[str, Any]]:
    cls = _pick(rng, CONFIG_CLASSES)
    return cls, {_pick(rng, FIELDS[cls]): _value(rng) for _ in range(int(rng.integers(1, 4)))}


# -- YAML --------------------------------------------------------------------------------------------
def alias_bomb(levels: int, width: int, field: str = "seed") -> str:
    """A billion-laughs document inline under one field: ``width ** levels`` leaves in a few hundred bytes."""
    parts = ["&a0 [" + ",".join(["lol"] * width) + "]"]
    parts += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return f"{field}: [{', '.join(parts)}]\n"


YAML_ATTACKS: dict[str, str] = {
    "!!int without a value": "seed: !!int\n",
    "an impossible date": "scheduler_name: 2024-02-30\n",
    "a date": "scheduler_name: 2024-02-03\n",
    "a timestamp": "namespace: 2001-12-14t21:59:43.10-05:00\n",
    "!!timestamp tag": "namespace: !!timestamp 2001-12-14\n",
    "!!binary": "namespace: !!binary aGVsbG8=\n",
    "!!set": "seed: !!set {a, b}\n",
    "!!float nonsense": "node_priority: {ema_alpha: !!float abc}\n",
    "!!python/object": "seed: !!python/object:os.system [echo hi]\n",
    "5,000 nested brackets": "seed: " + "[" * 5000 + "]" * 5000 + "\n",
    "5,000 nested braces": "seed: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
    "5,000 nested block sequences": "".join("  " * i + "-\n" for i in range(5000)),
    "inline alias bomb 9x9 under seed": alias_bomb(9, 9),
    "inline alias bomb 8x9 under stage_costs": "pipeline:\n  " + alias_bomb(8, 9, "stage_costs"),
    "inline alias bomb 9x9 under prior": "node_priority:\n  " + alias_bomb(9, 9, "prior"),
    "alias bomb 6x10 as a top-level key": "? " + alias_bomb(6, 10, "x").rstrip("\n") + "\n: 1\n",
    "merge-key bomb": "a: &a {x: 1}\nb: &b {<<: [*a, *a, *a]}\nc: {<<: [*b, *b, *b]}\n",
    "a 2 MB file": "seed: 1\n" + "# padding\n" * 200_000,
    "a 2 MB scalar": "scheduler_name: " + "x" * 2_000_000 + "\n",
    "a huge integer": "seed: " + "9" * 5000 + "\n",
    "a huge max_batch": "node_priority: {global_batch_size: 64, max_batch: 1" + "0" * 400 + "}\n",
    "a huge stale_after": "sample_priority: {stale_after: 1" + "0" * 400 + "}\n",
    "1e400": "node_priority: {ema_alpha: 1.0e+400}\n",
    "a NUL byte": "seed: 1\x00\n",
    "a tab": "seed:\t1\n",
}
YAML_TOKENS = ["node_priority:", "  global_batch_size: 64", "  enabled: 'false'", "seed: [1, 2", "pipeline: {schedule: osprey}",
               "- 1", "? a", ": :", "\t", "'", '"', "&a", "*a", "!!python/object:os.system", "%YAML 1.2", "---", "...",
               "{", "}", "[", "]", "0x1F", "sample_priority:", "  exponent: .inf", "  replacement: no",
               "node_priority: null", "~", "seed: 1e400", "continuity: {noise: .nan}", "seed: !!int", "  stale_after: !!int",
               "scheduler_name: 2024-02-30", "namespace: 2024-01-01", "seed: 0o17", "seed: 1_000", "seed: -1",
               "  max_batch: 100000000000000000000000000000000000000", "<<: {a: 1}", "!!binary", "!!set", "&x [*x]"]


def yaml_text(rng: np.random.Generator) -> str | bytes:
    import yaml

    r = rng.random()
    if r < 0.4:
        data = config_dict(rng)
        try:
            return yaml.safe_dump(data, allow_unicode=True)
        except Exception:  # noqa: BLE001 - a value YAML cannot write (an object, bytes): write its str instead
            return f"seed: {_label(data)}\n"
    if r < 0.9:
        return "\n".join(_pick(rng, YAML_TOKENS) for _ in range(int(rng.integers(0, 9))))
    return rng.bytes(int(rng.integers(0, 60)))


def _yaml_file(tmp: Path, i: int, text: str | bytes) -> Path:
    path = tmp / f"c{i}.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _mapped_bytes() -> int:
    """This process's virtual address space now (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _in_child(call: Callable[[], Any], memory_bytes: int = 2 << 30) -> tuple[str, str]:
    """``_verdict`` of ``call`` in a forked child allowed ``memory_bytes`` more than it inherits: a crash
    cannot reach us."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: cap memory, judge, write the verdict, exit without cleanup
        try:
            os.close(read)
            # on top of what the process already maps: late in a full run (torch, Ray, ... imported) that is
            # itself gigabytes of address space, and a cap below it fails every allocation of the child
            cap = _mapped_bytes() + memory_bytes
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            kind, what = _verdict(call)
            os.write(write, f"{kind}\n{what}".encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + MAX_SECONDS * 3
    while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
        time.sleep(0.01)
    else:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        out = f.read().decode(errors="replace")
    kind, _, what = out.partition("\n")
    return (kind, what) if kind else ("crash", "the child died (memory cap or a signal) or ran past its time")


# -- CLI ---------------------------------------------------------------------------------------------
FLAGS = {
    "simulate": ["--stages", "--replicas", "--microbatches", "--profile", "--speeds", "--slow", "--forward-s",
                 "--backward-s", "--noise", "--mb-cv", "--drift", "--transfer-s", "--memory-limit", "--steps",
                 "--schedules", "--seed", "--show-plan", "--json", "--scenario"],
    "validate-config": ["--kind", "--import-priority-fn"],
    "demo": ["--speeds", "--steps", "--global-batch", "--hidden", "--seed", "--device", "--address", "--sync"],
    "status": ["--address", "--name", "--namespace", "--json"],
    "watch": ["--address", "--name", "--interval", "--count"],
    "install-dashboard": ["--session-dir"],
    "bench sampling": ["--quick", "--json", "--seed", "--device", "--check"],
}
ARG_VALUES = ["", " ", ",", ",,", "1f1b,,", ",1f1b", "1f1b,,osprey", "1f1b, ,gpipe", "1f1b", "osprey,1f1b", "nope",
              "0", "1", "2", "3", "-1", "64", "65", "4096", "10000", "1" + "0" * 5000, "1e400", "nan", "inf", "-inf",
              "0.5", "1.5", "2,2", "2,,2", ",2", "2,", "1,1;1,0.5", "1;;1", ";", "1,1;", "0:0=0.5", "0:0=", ":=",
              "0:0=nan", "9:9=2", "auto", "local", "1.2.3.4:6379", "ray://h:99999", "host:", "--", "-", "--stages",
              "\x00", "x" * 3000, "cpu", "cuda", "ddp", "homogeneous", "noisy", "pipeline", "ray", "pdml", "/", "/nope.yaml",
              "/tmp", "1,1,0.4,0.4", "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1"]


def cli_args(rng: np.random.Generator, files: list[str]) -> list[str]:
    verb = _pick(rng, list(FLAGS) + ["bench", "bench nope", "nope", ""])
    argv = verb.split()
    values = ARG_VALUES + files
    for _ in range(int(rng.integers(0, 5))):
        r = rng.random()
        if r < 0.7 and verb in FLAGS:
            argv.append(_pick(rng, FLAGS[verb]))
            if rng.random() < 0.85:
                argv.append(_pick(rng, values))
        elif r < 0.85:
            argv.append(_pick(rng, values))
        else:
            argv.append(_pick(rng, ["--help", "--version", "-x", "--no-such-flag", "--debug=1", "--stages=3"]))
    if verb == "validate-config" and rng.random() < 0.8:
        argv.insert(1, _pick(rng, files + ARG_VALUES[:5]))
    return [a for a in argv if a != "--debug"]  # --debug shows tracebacks on purpose


def _stub_expensive_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verbs that would start Ray, train or simulate for minutes do nothing once their arguments parsed."""
    import importlib

    for module in ("pdml_ray.cli.demo", "pdml_ray.cli.status", "pdml_ray.cli.watch", "pdml_ray.cli.install_dashboard",
                   "pdml_ray.bench.sampling"):
        monkeypatch.setattr(importlib.import_module(module), "run", lambda args: 0)
    monkeypatch.setattr("pdml_ray.cli.simulate.report", lambda *a, **k: 0)
    monkeypatch.setattr("pdml_ray.cli.simulate_stragglers.report", lambda *a, **k: 0)


def _cli_call(argv: list[str]) -> Callable[[], None]:
    """Run ``main(argv)``: a crash is an escaped exception, an unexpected error (exit 1 and a hint to rerun
    with --debug), a traceback, or an over-long line on stderr."""

    def call() -> None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli_main(argv)
        text = err.getvalue()
        if code not in (0, 1, 2) or "--debug for the traceback" in text or "Traceback" in text:
            raise AssertionError(f"exit {code}: {text[:200]}")
        lines = text.splitlines()
        too_long = [ln for ln in lines if len(ln) > MAX_CHARS]
        # validate-config lists one error per line under one heading; every other verb says one line
        if too_long or (len(lines) > MAX_LINES and argv[:1] != ["validate-config"]):
            raise AssertionError(f"stderr of {len(lines)} lines, longest {max(map(len, lines))}: {text[:200]!r}")
        lists = [v for flag, v in zip(argv, argv[1:]) if flag in ("--schedules", "--replicas", "--speeds")]
        if code == 0 and any(item.strip() == "" for v in lists for row in v.split(";") for item in row.split(",")):
            raise AssertionError(f"an empty item in a list argument was accepted (exit 0): {lists}")

    return call


# -- plans -------------------------------------------------------------------------------------------
ACTION_TEXTS = ["s0r0F0", "s0r0B0", "s1r0F0", "s1r0B0", "s0r1F1", "s0r0F1", "s0r0B1", "x", "s9r9F9", "s0r0F" + "9" * 5000,
                "s²r0F0", "s0r0F٣", " s0r0F0 ", "s0r0W0", "s-1r0F0"]
ORDER_KEYS = ["0,0", "0,1", "1,0", "a", "0", "0,0,0", "-1,0", "0,²", "²,0", "٣,0", "0," + "9" * 5000, " 0 , 0 ", "0,0 ",
              "99999999999999999999,0", ""]


HUGE_ORDERS = {f"0,{i}": [] for i in range(50_000)}


def _real_plan(rng: np.random.Generator) -> dict[str, Any]:
    name = _pick(rng, ["gpipe", "1f1b", "critical-path"])
    return make_schedule(name, stages=int(rng.integers(1, 4)), replicas=int(rng.integers(1, 3)),
                          microbatches=int(rng.integers(1, 5))).plan(0).to_dict()


def plan_dict(rng: np.random.Generator) -> Any:
    r = rng.random()
    if r < 0.05:
        return _pick(rng, NASTY)
    if r < 0.55:  # a real plan with one field or one order mutated
        plan = _real_plan(rng)
        plan["orders"] = {k: list(v) for k, v in plan["orders"].items()}
        what = rng.random()
        if what < 0.4:
            plan[_pick(rng, ["num_stages", "replicas", "num_microbatches", "reorder", "memory_limit", "schedule",
                             "orders"])] = _value(rng)
        elif what < 0.7:
            key = _pick(rng, sorted(plan["orders"]))
            plan["orders"][_pick(rng, ORDER_KEYS) if rng.random() < 0.5 else key] = (
                [_pick(rng, ACTION_TEXTS) for _ in range(int(rng.integers(0, 4)))] if rng.random() < 0.7 else _value(rng))
        elif what < 0.85:
            first = sorted(plan["orders"])[0]
            plan["orders"][first] = plan["orders"][first][1:]
        else:
            plan["orders"][_pick(rng, NASTY[:20])] = ["s0r0F0"]
        return plan
    if r < 0.6:  # a huge plan: many orders
        return {"num_stages": 1, "replicas": [_pick(rng, [200_000, 1, 4096])], "num_microbatches": 10**6,
                "orders": HUGE_ORDERS}
    return {"num_stages": _pick(rng, [1, 2, 3, 0, -1, 10**400, "2", 2.0, True, None, 10**9]),
            "replicas": _pick(rng, [[1], [1, 1], [2, 1], [], [0], [10**400], [True], "1", None, [10**9] * 3, (1, 2)]),
            "num_microbatches": _pick(rng, [1, 2, 4, 0, 10**400, 10**9, 1.0, "x", None]),
            "reorder": _pick(rng, [False, True, 0, None, "false"]),
            "memory_limit": _pick(rng, [None, 1, 2, 0, 10**400, math.nan]),
            "schedule": _pick(rng, ["gpipe", "", 1, None, "x" * 3000]),
            "orders": _pick(rng, [{_pick(rng, ORDER_KEYS): [_pick(rng, ACTION_TEXTS) for _ in range(3)] for _ in range(3)},
                                  {}, [], None, "0,0", {"0,0": "s0r0F0"}, {"0,0": [1, 2]}, {"0,0": ["s0r0F0"] * 3}])}


def _plan_call(data: Any) -> Callable[[], None]:
    def call() -> None:
        plan = Plan.from_dict(data)
        validate(plan)
        assert Plan.from_dict(plan.to_dict()) == plan

    return call


def _plan_object_call(rng: np.random.Generator) -> Callable[[], None]:
    """``validate`` of a Plan built directly with wrong types (not through from_dict)."""
    real = Plan.from_dict(_real_plan(rng))
    field = _pick(rng, ["num_stages", "replicas", "num_microbatches", "orders", "memory_limit", "reorder"])
    value = _value(rng) if rng.random() < 0.6 else _pick(rng, [{(0, 0): ["s0r0F0"]}, {(0, 0): (1,)}, {"0,0": ()},
                                                              {(0,): ()}, (10**400,), [1, 1], {(0, 0): None}])
    return lambda: validate(dataclasses.replace(real, **{field: value}))


# -- the targets -------------------------------------------------------------------------------------
def test_config_dicts():
    rng = np.random.default_rng(SEEDS["config dicts"])
    for i in range(COUNTS["config dicts"]):
        data = config_dict(rng)
        _record("config dicts", f"#{i} {_label(data)}", lambda: PDMLConfig.from_dict(data))
    assert CRASHES["config dicts"] == [], CRASHES["config dicts"][:10]


def test_direct_construction_of_every_config_class():
    rng = np.random.default_rng(SEEDS["direct construction"])
    for i in range(COUNTS["direct construction"]):
        cls, kwargs = direct_kwargs(rng)
        _record("direct construction", f"#{i} {cls.__name__}({_label(kwargs)})", lambda: cls(**kwargs))
    assert CRASHES["direct construction"] == [], CRASHES["direct construction"][:10]


def test_yaml_files(tmp_path):
    rng = np.random.default_rng(SEEDS["yaml"])
    for name, text in YAML_ATTACKS.items():
        path = _yaml_file(tmp_path, -1, text)
        kind, what = _in_child(lambda: PDMLConfig.from_yaml(path))
        TALLY["yaml"][kind] += 1
        TALLY["yaml"]["attacks"] += 1
        if kind == "crash":
            CRASHES["yaml"].append(f"attack {name!r} ({len(text)} bytes) -> {what[:200]}")
    for i in range(COUNTS["yaml"]):
        text = yaml_text(rng)
        path = _yaml_file(tmp_path, i, text)
        _record("yaml", f"#{i} {_label(text)}", lambda: PDMLConfig.from_yaml(path))
    assert CRASHES["yaml"] == [], CRASHES["yaml"][:10]


def test_cli_argument_lists(tmp_path, monkeypatch):
    _stub_expensive_work(monkeypatch)
    files = [str(_yaml_file(tmp_path, i, text)) for i, text in enumerate(
        ["node_priority: {global_batch_size: 64}\n", "seed: !!int\n", "{}\n", "pipeline: {schedule: nope}\n",
         "gradient_priority: {priority_fn: 'sys:exit'}\nnode_priority: {global_batch_size: 8}\n",
         alias_bomb(6, 6), "stages: 3\nreplicas: [1, 2, 1]\n", "kind: stragglers\npolicy: nope\n", "[1, 2\n",
         "cluster_name: x\nprovider: {type: local}\n"])]
    rng = np.random.default_rng(SEEDS["cli"])
    for i in range(COUNTS["cli"]):
        argv = cli_args(rng, files)
        _record("cli", f"#{i} {argv!r}", _cli_call(argv))
    assert CRASHES["cli"] == [], CRASHES["cli"][:10]


def test_plan_dicts_and_plans():
    rng = np.random.default_rng(SEEDS["plans"])
    for i in range(COUNTS["plans"]):
        if rng.random() < 0.8:
            data = plan_dict(rng)
            _record("plans", f"#{i} {_label(data)}", _plan_call(data))
        else:
            _record("plans", f"#{i} validate(Plan(...)) with a wrong field", _plan_object_call(rng))
    assert CRASHES["plans"] == [], CRASHES["plans"][:10]


def test_zz_fuzz_summary(capsys):
    """Runs last in this module: the inputs, refusals and crashes per target, and the seeds."""
    with capsys.disabled():
        print("\nfuzzed (seed: inputs = accepted + refused + crash):")
        for name, tally in TALLY.items():
            total = tally["accepted"] + tally["refused"] + tally["crash"]
            print(f"  {name:20s} seed {SEEDS[name]}: {total} = {tally['accepted']} + {tally['refused']} + "
                  f"{tally['crash']}{' (' + str(tally['attacks']) + ' attacks)' if tally['attacks'] else ''}")
            for line in CRASHES[name][:3]:
                print(f"      {line[:300]}")
