"""The command line as a user meets it: help everywhere, clear failures, benchmark smoke runs."""

import json
import os
import subprocess
import sys

import pytest

from pdml_ray.bench import BENCHMARKS
from pdml_ray.cli import COMMANDS

CLI = [sys.executable, "-m", "pdml_ray.cli"]


def _run(args, timeout=60, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, env=env, **kw)


@pytest.mark.parametrize("args", [[], *([c] for c in COMMANDS), *(["bench", b] for b in BENCHMARKS)])
def test_every_subcommand_has_help(args):
    out = _run(args + ["--help"])
    assert out.returncode == 0, out.stderr
    assert "usage: pdml-ray" in out.stdout


def test_bench_help_lists_the_common_flags():
    out = _run(["bench", "hetero", "--help"])
    for flag in ("--quick", "--json", "--seed", "--device", "--speeds", "--workers", "--steps"):
        assert flag in out.stdout


def test_bad_input_fails_clearly():
    out = _run(["bench", "hetero", "--speeds", "1,2"])
    assert out.returncode != 0 and "(0, 1]" in out.stderr
    out = _run(["bench", "nosuch"])
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_status_without_a_cluster_says_what_to_do(tmp_path):
    out = _run(["status", "--address", "127.0.0.1:1"], timeout=120)
    assert out.returncode == 1
    assert "no Ray cluster" in out.stdout or "no pdml-ray scheduler" in out.stdout
