"""The capability guides (docs/guides/*.md) hold: their Python snippets run as written (a fresh
interpreter each; the guides that need Ray share one local cluster), their config tables name real
fields with their real defaults, and their links to BENCHMARKS.md sections and to files resolve. The README stays a front page (at most
12 KB, linking every guide), every doc's links resolve, and the docs index lists every doc."""

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


def _links(text: str) -> list[tuple[str, str]]:
    """(target, anchor) of every Markdown link ``[...](target#anchor)`` in ``text``."""
    return re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text)


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}


DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
"""The front page and every doc: their links are checked the same way."""


def test_guides_link_a_benchmark_section():
    for name in GUIDES:
        assert any(target.endswith("BENCHMARKS.md") and anchor for target, anchor in _links(guide_text(name))), \
            f"{name}.md links no BENCHMARKS.md section"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve_to_existing_files_and_sections(doc):
    for target, anchor in _links(doc.read_text()):
        if target.startswith("http"):
            continue
        path = (doc.parent / target).resolve()
        assert path.exists(), f"{doc.name} links {target}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{doc.name} links {target}#{anchor}; sections: {sorted(_anchors(path))}"


def test_readme_is_a_front_page_that_links_every_guide():
    text = (ROOT / "README.md").read_text()
    size = len(text.encode())
    assert size <= 12 * 1024, f"README.md is {size} bytes; move detail into a guide under docs/ (at most 12,288)"
    for name in GUIDES:
        assert f"(docs/guides/{name}.md)" in text, f"the README's capability table does not link guides/{name}.md"


def test_docs_python_blocks_outside_the_guides_compile():
    """The other docs' snippets touch a live cluster (dashboards, status), so they are compiled, not run."""
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for i, block in enumerate(python_blocks(doc.read_text())):
            compile(block, f"{doc.name} block {i}", "exec")


def test_docs_index_lists_every_guide_doc_and_notebook():
    index = (ROOT / "docs" / "README.md").read_text()
    for name in GUIDES:
        assert f"(guides/{name}.md)" in index, f"docs/README.md does not link guides/{name}.md"
    for doc in sorted((ROOT / "docs").glob("*.md")):
        if doc.name != "README.md":
            assert f"({doc.name})" in index, f"docs/README.md does not link {doc.name}"
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"(../notebooks/{notebook.name})" in index, f"docs/README.md does not link {notebook.name}"
