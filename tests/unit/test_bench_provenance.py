"""Where a benchmark's figures come from: ``git_rev`` says when the code differs from its commit
(``-dirty``, and ``git_dirty`` in every JSON), and names the commit of a clean ``git archive`` copy
through ``PDML_GIT_REV``."""

import argparse
import json
import subprocess

import pytest

from pdml_ray.bench.common import GIT_REV_ENV, finish, git_rev, git_state


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_a_clean_tree_is_its_commit_and_an_edited_one_is_dirty(repo):
    rev, dirty = git_state(repo)
    assert dirty is False and len(rev) >= 7 and git_rev(repo) == rev
    (repo / "untracked.txt").write_text("results are not code\n")
    assert git_state(repo) == (rev, False)  # untracked files (results, logs) do not make the code dirty
    (repo / "code.py").write_text("x = 2\n")
    assert git_state(repo) == (rev, True)
    assert git_rev(repo) == f"{rev}-dirty"


def test_an_archive_copy_reports_the_commit_it_was_told(tmp_path, monkeypatch):
    monkeypatch.delenv(GIT_REV_ENV, raising=False)
    assert git_state(tmp_path) == ("unknown", None)
    monkeypatch.setenv(GIT_REV_ENV, "abc1234")
    assert git_state(tmp_path) == ("abc1234", False)


def test_every_json_records_the_dirty_flag(tmp_path):
    out = tmp_path / "r.json"
    full = finish(argparse.Namespace(json=str(out), device="cpu"), {"x": 1}, {"nothing": "test"})
    written = json.loads(out.read_text())
    assert "git_dirty" in written and written["git_rev"] == full["git_rev"]
    assert written["git_rev"].endswith("-dirty") == (written["git_dirty"] is True)
