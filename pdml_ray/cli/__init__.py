"""pdml-ray: priority-derived distributed PyTorch training on Ray (demo, bench NAME, status, simulate).

The ``pdml-ray`` command: one module per verb in this package (``demo``, ``status``, ``simulate``),
each with ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args)``; ``bench NAME`` runs the
benchmarks registered in ``pdml_ray.bench.BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pdml_ray.bench import BENCHMARKS
from pdml_ray.bench.common import add_common_arguments, missed_targets
from pdml_ray.errors import PDMLError

# Subcommands other than bench: name -> module with DESCRIPTION, add_arguments(parser), run(args).
COMMANDS: dict[str, str] = {
    "demo": "pdml_ray.cli.demo",
    "status": "pdml_ray.cli.status",
    "simulate": "pdml_ray.cli.simulate",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdml-ray", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    bench = sub.add_parser("bench", help="run a benchmark: baseline and method side by side, as ratios",
                           description="Run a benchmark; the baseline and the method run side by side in one run.")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="NAME")
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        p = bench_sub.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        add_common_arguments(p)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args._run(args)
    except PDMLError as e:  # a bad value or state, said plainly: no traceback for the user to read
        print(f"pdml-ray: error: {e}", file=sys.stderr)
        return 2
    if isinstance(result, dict) and getattr(args, "check", False):
        missed = missed_targets(result)
        if missed:
            print(f"pdml-ray: {len(missed)} target(s) missed: {'; '.join(missed)}", file=sys.stderr)
            return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
