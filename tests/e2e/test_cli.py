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
def test_every_subcommand_has_help(args, capsys):
    from pdml_ray.cli import main  # in-process: the entry point's own run is the next test's

    assert main(args + ["--help"]) == 0, capsys.readouterr().err
    assert "usage: pdml-ray" in capsys.readouterr().out


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
    assert "no Ray cluster" in out.stderr and "ray start --head" in out.stderr


# ---- issue 14/15: failures are one line and fast; --version; help without torch -------------------------------

@pytest.mark.parametrize("args, says", [
    (["demo", "--speeds", "abc"], "argument --speeds"),
    (["simulate", "--stages", "0"], "argument --stages: must be an integer in [1, 64]"),
    (["simulate", "--noise", "nan"], "argument --noise: expected a finite number"),
])
def test_bad_values_are_one_line_without_traceback(args, says):
    out = _run(args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and says in out.stderr and "Traceback" not in out.stderr


def test_a_bad_scenario_file_is_one_line(tmp_path):
    bad = tmp_path / "scenario.yaml"
    bad.write_text("kind: stragglers\nworkers: 2\nstragglers: 2\n")
    out = _run(["simulate", "--scenario", str(bad)])
    assert out.returncode == 2 and "stragglers (2) must be below workers (2)" in out.stderr


def test_status_and_demo_without_a_cluster_fail_in_seconds():
    for args in (["status", "--address", "127.0.0.1:1"], ["demo", "--address", "127.0.0.1:1"]):
        out = _run(args, timeout=60)  # Ray's own retries would take minutes
        assert out.returncode == 1, out.stderr
        assert "no Ray cluster at '127.0.0.1:1'" in out.stderr and out.stderr.count("\n") == 1


def test_version_comes_from_the_package_metadata():
    from importlib.metadata import version

    out = _run(["--version"])
    assert out.returncode == 0 and out.stdout == f"pdml-ray {version('pdml-ray')}\n"


def test_help_imports_neither_torch_nor_ray():
    probe = ("import sys, json, contextlib, io\n"
             "import pdml_ray\n"
             "package = set(sys.modules)\n"
             "from pdml_ray.cli import main\n"
             "for argv in (['--help'], ['bench', '--help'], ['simulate', '--help'], ['status', '--help']):\n"
             "    with contextlib.redirect_stdout(io.StringIO()):\n"
             "        assert main(argv) == 0\n"
             "print(json.dumps({'package_torch': 'torch' in package, 'torch': 'torch' in sys.modules,\n"
             "                  'ray': 'ray' in sys.modules,\n"
             "                  'added': sorted(m for m in set(sys.modules) - package if m.split('.')[0] in ('torch', 'ray'))}))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["added"] == [] and not seen["ray"]  # the CLI's help adds neither
    assert not seen["package_torch"] and not seen["torch"]


# ---- validate-config -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["aws-mixed-h100-a100.yaml", "on-prem.yaml"])
def test_the_shipped_cluster_configs_are_valid(name, capsys):
    from pdml_ray.cli import main

    path = os.path.join(os.path.dirname(__file__), "..", "..", "cluster_configs", name)
    assert main(["validate-config", path]) == 0
    assert "valid Ray cluster config" in capsys.readouterr().out


def test_validate_config_lists_every_error_with_its_field(tmp_path, capsys):
    import yaml

    from pdml_ray.cli import main

    pdml = tmp_path / "pdml.yaml"
    pdml.write_text("node_priority:\n  global_batch_size: -1\npipeline:\n  bogus: 1\nseed: x\n")
    assert main(["validate-config", str(pdml)]) == 1
    err = capsys.readouterr().err
    assert "invalid pdml-ray config, 3 error(s)" in err and "Traceback" not in err
    assert "node_priority.global_batch_size must be" in err and "got -1" in err
    assert "unknown key(s) ['bogus']" in err and "seed must be an integer" in err
    path = os.path.join(os.path.dirname(__file__), "..", "..", "cluster_configs", "on-prem.yaml")
    cluster = yaml.safe_load(open(path))
    cluster["max_workers"], cluster["nonsense"] = -3, 1
    bad = tmp_path / "cluster.yaml"
    bad.write_text(yaml.safe_dump(cluster))
    assert main(["validate-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "invalid Ray cluster config, 2 error(s)" in err
    assert "max_workers: -3 is less than the minimum of 0; use a value >= 0" in err
    assert "'nonsense' was unexpected" in err and "remove it" in err
    (tmp_path / "notyaml.yaml").write_text("a: [1,\n")
    assert main(["validate-config", str(tmp_path / "notyaml.yaml")]) == 1
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["validate-config", str(tmp_path / "missing.yaml")]) == 2
    assert main(["validate-config", str(pdml), "--kind", "nosuch"]) == 2


# ---- simulate scenarios from YAML ------------------------------------------------------------------------------

def test_simulate_runs_a_pipeline_scenario_file_and_flags_win(tmp_path, capsys):
    from pdml_ray.cli import main

    scenario = tmp_path / "pipe.yaml"
    scenario.write_text("stages: 3\nreplicas: [1, 2, 1]\nspeeds: [[1], [1, 0.6], [1]]\nmicrobatches: 6\n"
                        "steps: 3\nschedules: [1f1b, osprey]\n")
    assert main(["simulate", "--scenario", str(scenario), "--slow", "0:0=0.5", "--json", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    assert "3 stages x replicas [1, 2, 1]" in out and "[[0.5], [1.0, 0.6], [1.0]]" in out
    assert set(json.loads((tmp_path / "o.json").read_text())["schedules"]) == {"1f1b", "osprey"}
    scenario.write_text("stages: 3\nreplicas: [1, 2]\n")
    assert main(["simulate", "--scenario", str(scenario)]) == 2
    assert "--replicas lists 2 counts for 3 stages" in capsys.readouterr().err


def test_simulate_runs_a_straggler_scenario(tmp_path, capsys):
    from pdml_ray.cli import main

    scenario = tmp_path / "stragglers.yaml"
    scenario.write_text("kind: stragglers\nworkers: 4\nstragglers: 1\nsteps: 6\npolicies: [sync, ignore-stragglers]\n")
    assert main(["simulate", "--scenario", str(scenario), "--json", str(tmp_path / "s.json")]) == 0
    assert "simulated straggler scenario: 4 workers" in capsys.readouterr().out
    result = json.loads((tmp_path / "s.json").read_text())["policies"]
    assert set(result) == {"sync", "ignore-stragglers"} and result["sync"]["steps_run"] == 6
    # not waiting for the slowest worker is faster on the same seeded straggler model
    assert result["ignore-stragglers"]["total_s"] < result["sync"]["total_s"]


# ---- status --json and watch against a real scheduler actor (one short Ray test) --------------------------------

def test_status_json_and_watch_show_a_running_scheduler(capsys):
    ray = pytest.importorskip("ray")
    from pdml_ray.actors.scheduler import create_scheduler
    from pdml_ray.cli import main
    from pdml_ray.config import NodePriorityConfig, PDMLConfig

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="pdml-cli-test")
    try:
        handle = create_scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64),
                                             scheduler_name="pdml-cli-test"), 2)
        ray.get(handle.ping.remote())
        assert main(["status", "--json", "--name", "pdml-cli-test"]) == 0
        stats = json.loads(capsys.readouterr().out)["schedulers"]["pdml-cli-test"]
        node = stats["derivers"]["node"]
        assert sum(node["batch_sizes"]) == 64 and len(node["batch_sizes"]) == 2
        assert stats["last_step"] == -1 and stats["reports_received"] == 0
        assert main(["status"]) == 0  # every scheduler, as text
        assert "== pdml-cli-test" in capsys.readouterr().out
        assert main(["watch", "--json", "--count", "2", "--interval", "0.1", "--name", "pdml-cli-test"]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == 2 and all("pdml-cli-test" in json.loads(line)["schedulers"] for line in lines)
        assert main(["status", "--name", "pdml-nosuch"]) == 1
        assert "no pdml-ray scheduler named 'pdml-nosuch'" in capsys.readouterr().err
    finally:
        ray.shutdown()
