"""pdml-ray: priority-derived distributed PyTorch training on Ray (demo, status, watch, simulate, validate-config, bench NAME).

The ``pdml-ray`` command: one module per verb in this package, each with ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args)``; ``bench NAME`` runs the benchmarks registered in
``pdml_ray.bench.BENCHMARKS``.

Parsers are built lazily: only the chosen verb's module is imported (``--help`` of the command itself
imports none; descriptions are read from the modules' source), so help answers at once and never
imports torch or Ray. Failures are one line on stderr and an exit status, never a traceback unless
``--debug``: 2 for a bad argument or value (argparse, ``PDMLError``), 1 for a run that failed (no
cluster, a missed ``--check`` target, an unexpected error), 130 for Ctrl-C.

The modules:

    __main__.py             ``python -m pdml_ray.cli``, the same as ``pdml-ray``
    args.py                 argument types that check each value while parsing (a bad one is exit status 2)
    cluster.py              reaching a Ray cluster from a shell, failing in seconds
    demo.py                 ``pdml-ray demo``, the main job: uniform shares vs node priorities
    install_dashboard.py    ``pdml-ray install-dashboard``, the Grafana dashboard into Ray's provisioning
    scenario.py             ``simulate --scenario FILE`` YAML files, keys as the flags
    simulate.py             ``pdml-ray simulate``, pipeline schedules on a simulated cluster
    simulate_stragglers.py  ``simulate --scenario`` with ``kind: stragglers``, straggler policies on a simulated clock
    status.py               ``pdml-ray status``, every running scheduler's axes and figures
    validate_config.py      ``pdml-ray validate-config``, a ``PDMLConfig`` YAML or a ``ray up`` config
    watch.py                ``pdml-ray watch``, ``status`` refreshed until Ctrl-C
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import importlib.util
import math
import sys
from types import ModuleType
from typing import Any, NoReturn, Sequence

# Subcommands other than bench: name -> module with DESCRIPTION, add_arguments(parser), run(args).
COMMANDS: dict[str, str] = {
    "demo": "pdml_ray.cli.demo",
    "status": "pdml_ray.cli.status",
    "watch": "pdml_ray.cli.watch",
    "simulate": "pdml_ray.cli.simulate",
    "validate-config": "pdml_ray.cli.validate_config",
    "install-dashboard": "pdml_ray.cli.install_dashboard",
}
BENCH_HELP = "run a benchmark: baseline and method side by side, as ratios"


class Parser(argparse.ArgumentParser):
    """argparse, with a bad argument as one line (no usage block) pointing at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def benchmarks() -> dict[str, str]:
    from pdml_ray.bench import BENCHMARKS

    return BENCHMARKS


@functools.lru_cache(maxsize=None)
def description(module_name: str) -> str:
    """A module's ``DESCRIPTION`` read from its source, without importing it (nor torch through it)."""
    try:
        spec = importlib.util.find_spec(module_name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DESCRIPTION"
                                                         for t in node.targets)):
                    return str(ast.literal_eval(node.value))
    except (ImportError, OSError, SyntaxError, ValueError):
        pass
    try:
        return str(getattr(importlib.import_module(module_name), "DESCRIPTION", ""))
    except Exception as e:  # noqa: BLE001 - one broken module must not take the whole help down
        return f"(not available: {type(e).__name__}: {e})"


def _chosen(argv: Sequence[str]) -> list[str]:
    """The positional words before the first option after them: the verb and, for bench, its NAME."""
    words = [a for a in argv if not a.startswith("-")]
    return words[:2]


def _fill(parser: argparse.ArgumentParser, module: ModuleType, bench: bool) -> None:
    if bench:
        from pdml_ray.bench.common import add_common_arguments

        add_common_arguments(parser)
    module.add_arguments(parser)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error")
    parser.set_defaults(_run=module.run, _bench=bench)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``argv``, only the verb ``argv`` chooses gets its arguments (and its
    module imported): the others are names and help lines."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg_version = version("pdml-ray")
    except PackageNotFoundError:
        pkg_version = "unknown (not installed)"
    parser = Parser(prog="pdml-ray", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pdml-ray {pkg_version}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv) if argv is not None else None
    for name, module_name in COMMANDS.items():
        text = description(module_name)
        p = sub.add_parser(name, help=text, description=text)
        if chosen is None or chosen[:1] == [name]:
            _fill(p, importlib.import_module(module_name), bench=False)
    bench = sub.add_parser("bench", help=BENCH_HELP,
                           description="Run a benchmark; the baseline and the method run side by side in one run.")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="NAME")
    for name, module_name in benchmarks().items():
        text = description(module_name)
        p = bench_sub.add_parser(name, help=text, description=text)
        if chosen is None or chosen == ["bench", name]:
            _fill(p, importlib.import_module(module_name), bench=True)
    return parser


def check_parsed(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argument types cannot see. A bare ``--`` as a value (``--address=--``) reaches the namespace as
    an empty list, the type never called; and every number a benchmark's parser took must be finite and
    >= 0 (their flags are counts, sizes, times and rates; the verbs of this package check their own
    ranges in their argument types)."""
    for action in _leaf(parser, args)._actions:
        value = getattr(args, action.dest, None)
        flag = action.option_strings[-1] if action.option_strings else action.dest
        if isinstance(action, argparse._StoreAction) and action.nargs is None and value == []:
            raise SystemExit(f"argument {flag}: expected one value, got '--'")
        if not getattr(args, "_bench", False) or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value < 0:
            raise SystemExit(f"argument {flag}: must be a finite number >= 0, got {value!r}")


def _leaf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The subparser that parsed the chosen verb (bench NAME included)."""
    for key in ("command", "bench"):
        name = getattr(args, key, None)
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if name is None or not subs:
            break
        parser = subs[0].choices[name]
    return parser


def _one_line(text: str) -> str:
    """``text`` on one line of at most ~400 characters: a word (an echoed argument) longer than 60 is cut."""
    words = [w if len(w) <= 60 else w[:40] + "..." for w in str(text).split()]
    line = " ".join(words)
    return line if len(line) <= 400 else line[:397] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pdml-ray`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    prog = "pdml-ray"
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        debug = bool(getattr(args, "debug", False))
        prog = " ".join(["pdml-ray", *(w for w in (args.command, getattr(args, "bench", None)) if w)])
        check_parsed(parser, args)
        result: Any = args._run(args)
    except SystemExit as e:  # argparse (--help, --version, a bad argument), or a module's SystemExit("why")
        if isinstance(e.code, str):
            print(f"{prog}: error: {_one_line(e.code)}", file=sys.stderr)
            return 2
        return int(e.code or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - what the user reads is one line; --debug shows the rest
        if debug:
            raise
        from pdml_ray.errors import PDMLError

        if isinstance(e, PDMLError):  # a bad value or state, said plainly
            print(f"{prog}: error: {_one_line(str(e))}", file=sys.stderr)
            return int(getattr(e, "exit_status", 2))
        print(f"{prog}: error: {type(e).__name__}: {_one_line(str(e))} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
    if isinstance(result, dict) and getattr(args, "check", False):
        from pdml_ray.bench.common import missed_targets

        missed = missed_targets(result)
        if missed:
            print(f"pdml-ray: {len(missed)} target(s) missed: {'; '.join(missed)}", file=sys.stderr)
            return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
