"""Issue 22, "bad input gets a clear error": the issue's own examples, one test each (configs, YAML, user
code, the command line, plans). The seeded fuzzing of the same targets is test_fuzz_config_yaml_cli_plans.py."""

from __future__ import annotations

import math
import time

import pytest

from pdml_ray.cli import main
from pdml_ray.config import (GradientPriorityConfig, NodePriorityConfig, P3Config, PDMLConfig, PipelineConfig,
                             SamplePriorityConfig)
from pdml_ray.decisions import WorkerReport
from pdml_ray.errors import ConfigError, PlanError, shown
from pdml_ray.pipeline.plan import Plan, validate
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.scheduler import Scheduler


# -- configs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("build, field, bounds", [
    (lambda: NodePriorityConfig(global_batch_size=64, max_batch=10**400), "node_priority.max_batch", "[1, 1073741824]"),
    (lambda: SamplePriorityConfig(stale_after=10**400), "sample_priority.stale_after", "[1, 1000000000]"),
    (lambda: PDMLConfig.from_dict({"sample_priority": {"stale_after": 10**400}}), "sample_priority.stale_after", "[1,"),
    (lambda: PDMLConfig(seed=-(10**5000)), "seed", "[0, "),
    (lambda: P3Config(bucket_bytes=10**30), "p3.bucket_bytes", "[1, "),
])
def test_huge_integers_are_refused_naming_the_field_and_its_range(build, field, bounds):
    with pytest.raises(ConfigError) as e:
        build()
    assert field in str(e.value) and bounds in str(e.value) and len(str(e.value)) < 300


def test_the_issues_direct_construction_examples_raise_config_errors():
    with pytest.raises(ConfigError, match="pipeline.osprey must be an OspreyConfig"):
        PipelineConfig(osprey=math.nan)
    with pytest.raises(ConfigError, match="p3.policy"):
        P3Config(policy=[1])  # was TypeError: unhashable type: 'list'
    with pytest.raises(ConfigError, match="p3.element_size"):
        P3Config(element_size=True)  # was accepted: True == 1
    with pytest.raises(ConfigError, match="continuity.min_normalized_ess"):
        PDMLConfig.from_dict({"continuity": {"min_normalized_ess": "1f1b"}})
    with pytest.raises(ConfigError, match="sample_priority.unseen_score"):  # was ValueError (an array's truth)
        __import__("pdml_ray.config", fromlist=["x"]).SamplePriorityConfig(unseen_score=__import__("numpy").ones(2))


def test_a_huge_value_is_shown_short():
    assert shown(10**5000) == "<an integer of ~5001 digits>"
    nested: list = [1] * 9
    for _ in range(8):
        nested = [nested] * 9  # 9**9 leaves: repr() would take minutes and gigabytes
    start = time.perf_counter()
    assert len(shown(nested)) <= 80 and time.perf_counter() - start < 0.1


# -- YAML --------------------------------------------------------------------------------------------
def _bomb(levels: int, width: int) -> str:
    parts = ["&a0 [" + ",".join(["lol"] * width) + "]"]
    parts += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return f"seed: [{', '.join(parts)}]\n"


@pytest.mark.parametrize("text, match", [
    ("seed: !!int\n", "is not a valid int"),
    ("seed: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 50 levels"),
    ("namespace: !!timestamp 2001-12-14\n", "'timestamp' is not supported"),
    (_bomb(9, 9), "values with aliases expanded"),
    (_bomb(8, 9), "values with aliases expanded"),
    ("seed: 1\n" + "# padding\n" * 30_000, "larger than"),
])
def test_bad_yaml_is_one_short_config_error_fast(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=match) as e:
        PDMLConfig.from_yaml(path)
    assert time.perf_counter() - start < 1.0
    assert str(path) in str(e.value) and len(str(e.value)) < 400 and "\n" not in str(e.value)


def test_dates_in_yaml_are_strings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("scheduler_name: 2024-02-30\nnamespace: 2024-01-01\n")  # was ValueError: day is out of range
    cfg = PDMLConfig.from_yaml(path)
    assert (cfg.scheduler_name, cfg.namespace) == ("2024-02-30", "2024-01-01")


# -- user code and validate-config ------------------------------------------------------------------
def _validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["validate-config", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_validate_config_applies_what_pdml_trainer_requires(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("node_priority: {ema_alpha: 0.5}\n")
    code, text = _validate(capsys, str(path))
    assert code == 1 and "global_batch_size is not set" in text
    assert _validate(capsys, str(path), "--runtime", "any")[0] == 0  # fine for a runtime without node priorities
    path.write_text("node_priority: {global_batch_size: 8, min_batch: 4}\n")
    assert _validate(capsys, str(path))[0] == 0
    code, text = _validate(capsys, str(path), "--workers", "3")
    assert code == 1 and "min_batch=4 x 3 workers exceeds" in text


def test_validate_config_imports_a_priority_fn_only_when_asked(tmp_path, capsys, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "planted_priority_mod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\ndef score(report):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "c.yaml"
    path.write_text("node_priority: {global_batch_size: 8}\ngradient_priority: {priority_fn: 'planted_priority_mod:score'}\n")
    assert _validate(capsys, str(path))[0] == 0 and not marker.exists()  # the shape is checked, nothing runs
    path.write_text("node_priority: {global_batch_size: 8}\ngradient_priority: {priority_fn: 'planted.mod score'}\n")
    code, text = _validate(capsys, str(path))
    assert code == 1 and "'module:function'" in text
    path.write_text("node_priority: {global_batch_size: 8}\ngradient_priority: {priority_fn: 'planted_priority_mod:nope'}\n")
    code, text = _validate(capsys, str(path), "--import-priority-fn")
    assert code == 1 and "has no function 'nope'" in text and marker.exists()


def test_a_priority_fn_that_exits_is_contained_and_counted():
    cfg = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8, warmup_steps=0),
                     gradient_priority=GradientPriorityConfig(priority_fn="sys:exit"))
    s = Scheduler(cfg, 2)
    s.report([WorkerReport(worker_id=w, step=0, samples=4, compute_s=0.01, loss=1.0, grad_norm=1.0) for w in (0, 1)])
    assert s.rejected_by_kind == {"priority_fn": 2} and s.reports_rejected == 2  # SystemExit escaped before
    assert s.stats().rejected_by_kind == {"priority_fn": 2}


# -- the command line --------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["simulate", "--schedules", "1f1b,,"], ["simulate", "--schedules", ","], ["simulate", "--schedules", ""],
    ["simulate", "--replicas", "2,,2"], ["simulate", "--speeds", "1,1;;1"], ["demo", "--speeds", "1,,0.5"],
    ["simulate", "--stages", "1" + "0" * 5000], ["nope" * 1000], ["validate-config", "x.yaml", "--kind", "x" * 3000],
])
def test_malformed_arguments_exit_2_with_one_short_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and len(err) < 500 and "Traceback" not in err


# -- plans -------------------------------------------------------------------------------------------
def _plan() -> dict:
    return make_schedule("1f1b", stages=2, replicas=2, microbatches=2).plan(0).to_dict()


@pytest.mark.parametrize("mutate, match", [
    (lambda p: p["orders"].__setitem__("0,²", p["orders"].pop("0,1")), "must be 'stage,replica'"),
    (lambda p: p["orders"].__setitem__("0," + "9" * 5000, p["orders"].pop("0,1")), "must be 'stage,replica'"),
    (lambda p: p["orders"]["0,0"].__setitem__(0, "s0r0F" + "9" * 5000), "invalid action string"),
    (lambda p: p.__setitem__("num_microbatches", 10**400), "num_microbatches must be an integer"),
    (lambda p: p.__setitem__("num_microbatches", 10**9), "at most 4,194,304 actions"),
    (lambda p: p.__setitem__("replicas", [2, 10**9]), "replicas must be a list of integers in"),
])
def test_malformed_plan_dicts_raise_plan_errors(mutate, match):
    plan = _plan()
    plan["orders"] = {k: list(v) for k, v in plan["orders"].items()}
    mutate(plan)
    with pytest.raises(PlanError, match=match) as e:
        Plan.from_dict(plan)
    assert len(str(e.value)) < 400


@pytest.mark.parametrize("field, value", [("orders", None), ("orders", {(0, 0): None}), ("replicas", 3),
                                          ("num_stages", [1]), ("memory_limit", "2"), ("orders", {"0,0": ()})])
def test_validate_refuses_a_plan_object_of_wrong_types_with_a_plan_error(field, value):
    import dataclasses

    with pytest.raises(PlanError):
        validate(dataclasses.replace(Plan.from_dict(_plan()), **{field: value}))
