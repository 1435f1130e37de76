"""The capability guides (docs/guides/*.md) hold: their Python snippets run as written (a fresh
interpreter each; the guides that need Ray share one local cluster), their config tables name real
fields with their real defaults, and their links to BENCHMARKS.md sections and to files resolve."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path

import pytest

import pdml_ray.config
from snippets import python_blocks, run_python  # tests/e2e/snippets.py (pytest puts this folder on sys.path)

ROOT = Path(__file__).resolve().parents[2]
GUIDES_DIR = ROOT / "docs" / "guides"
GUIDES = ("node_priorities", "sample_priorities", "pipeline_scheduling", "stragglers", "gradient_priorities", "p3",
          "continuity")

NEEDS_RAY = {"node_priorities", "sample_priorities", "pipeline_scheduling", "stragglers", "gradient_priorities", "p3"}
"""Guides whose snippet calls ``ray.init()``: it joins the module's shared local cluster (RAY_ADDRESS)."""

PRINTS = {
    "node_priorities": ["EMULATED compute", "node priorities (step time c + b / r", "v0 from step 0"],
    "sample_priorities": ["sample priorities: normalized ESS", "importance weights"],
    "pipeline_scheduling": ["osprey / 1f1b", "Ray actors", "EMULATED"],
    "stragglers": ["sync", "pgc-cr", "EMULATED"],
    "gradient_priorities": ["GradientDecision", "K history"],
    "p3": ["p3", "fifo", "same parameters: True", "EMULATED"],
    "continuity": ["healthy", "peaked", "flat", "after recalibration"],
}
"""Lines each guide's snippet prints (the snippet ran to its end and showed what the guide says)."""


def guide_text(name: str) -> str:
    return (GUIDES_DIR / f"{name}.md").read_text()


@pytest.fixture(scope="module")
def ray_address():
    """One local Ray cluster (4 logical CPUs) for the module; snippets join it through RAY_ADDRESS."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_every_guide_is_listed():
    assert sorted(p.stem for p in GUIDES_DIR.glob("*.md")) == sorted(GUIDES)


@pytest.mark.parametrize("name", GUIDES)
def test_guide_snippet_runs_as_written(name, tmp_path, request):
    blocks = python_blocks(guide_text(name))
    assert blocks, f"{name}.md has no ```python block"
    # the cluster first: starting it sets this process's RAY_AUTH_MODE, which the snippet needs to join it
    address = request.getfixturevalue("ray_address") if name in NEEDS_RAY else "local"
    env = {**os.environ, "RAY_ADDRESS": address, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    out = run_python("\n".join(blocks), tmp_path, env, timeout_s=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for text in PRINTS[name]:
        assert text in out.stdout, (name, text, out.stdout[-3000:])


def _config_rows(text: str) -> list[tuple[str, str]]:
    """(``Class.field``, default cell) of every table row whose first cell is a backticked ``Class.field``."""
    return re.findall(r"^\| `([A-Z]\w*\.\w+)` \| ([^|]*) \|", text, re.M)


@pytest.mark.parametrize("name", GUIDES)
def test_config_tables_name_real_fields_and_defaults(name):
    rows = _config_rows(guide_text(name))
    assert rows, f"{name}.md has no config table (rows like | `NodePriorityConfig.field` | `default` | meaning |)"
    for qualified, default_cell in rows:
        cls_name, field_name = qualified.split(".")
        cls = getattr(pdml_ray.config, cls_name, None)
        assert cls is not None and dataclasses.is_dataclass(cls), f"{name}.md: no config class {cls_name}"
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert field_name in fields, f"{name}.md: {cls_name} has no field {field_name!r} (fields: {sorted(fields)})"
        literal = re.match(r"\s*`([^`]*)`", default_cell)
        if literal is None:  # a default described in words (e.g. a nested config)
            continue
        f = fields[field_name]
        actual = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        documented = ast.literal_eval(literal.group(1))
        assert documented == actual, f"{name}.md: {qualified} default is {actual!r}, the guide says {documented!r}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_guides_link_existing_benchmark_sections_and_files():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", (ROOT / "BENCHMARKS.md").read_text(), re.M)}
    for name in GUIDES:
        text = guide_text(name)
        links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text)
        assert any(target.endswith("BENCHMARKS.md") and anchor for target, anchor in links), \
            f"{name}.md links no BENCHMARKS.md section"
        for target, anchor in links:
            if target.startswith("http"):
                continue
            path = (GUIDES_DIR / target).resolve()
            assert path.exists(), f"{name}.md links {target}, which does not exist"
            if path.name == "BENCHMARKS.md" and anchor:
                assert anchor in anchors, f"{name}.md links BENCHMARKS.md#{anchor}; sections: {sorted(anchors)}"


def test_docs_index_lists_every_guide_and_notebook():
    index = (ROOT / "docs" / "README.md").read_text()
    for name in GUIDES:
        assert f"(guides/{name}.md)" in index, f"docs/README.md does not link guides/{name}.md"
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"(../notebooks/{notebook.name})" in index, f"docs/README.md does not link {notebook.name}"
