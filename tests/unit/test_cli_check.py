"""``pdml-ray bench NAME --check`` exits non-zero when a target is missed; without it the status is 0."""

import pytest

import pdml_ray.bench.hetero as hetero
from pdml_ray.bench.common import missed_targets
from pdml_ray.cli import main


@pytest.mark.parametrize("met, check, status", [(True, True, 0), (False, True, 1), (False, False, 0)])
def test_check_turns_a_missed_target_into_a_failing_exit_status(monkeypatch, capsys, met, check, status):
    result = {"targets": {"speedup >= 1": {"value": 0.9, "target": 1.0, "met": met}, "other": {"met": True}}}
    monkeypatch.setattr(hetero, "run", lambda args: result)
    assert main(["bench", "hetero", *(["--check"] if check else [])]) == status
    if status:
        assert "1 target(s) missed: speedup >= 1" in capsys.readouterr().err


def test_missed_targets_lists_only_the_missed_ones():
    assert missed_targets({"targets": {"a": {"met": True}, "b": {"met": False}}}) == ["b"]
    assert missed_targets({}) == []
