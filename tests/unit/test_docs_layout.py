"""docs/layout.md is the one layout map of the package: every module and package in the tree has a line
there, and every path the map names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs" / "layout.md"


def tree_paths(root: Path) -> set[str]:
    """Every module (``.py`` file, ``__init__.py`` of subpackages left to their folder) and every package
    folder under ``root / "pdml_ray"``, as paths relative to ``root`` (folders end in ``/``)."""
    package = root / "pdml_ray"
    out = set()
    for path in package.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        if path.name == "__init__.py" and path.parent != package:
            out.add(rel[: -len("__init__.py")])
        else:
            out.add(rel)
    return out


def map_paths(text: str) -> set[str]:
    """The ``pdml_ray/...`` paths a layout map names in backticks."""
    return set(re.findall(r"`(pdml_ray/[\w./]*)`", text))


def unmapped(root: Path, text: str) -> tuple[set[str], set[str]]:
    """(modules of the tree without a line in the map, paths of the map not in the tree)."""
    named = map_paths(text)
    missing = tree_paths(root) - named
    gone = {p for p in named if not (root / p).exists()}
    return missing, gone


def test_every_module_has_a_line_and_every_mapped_path_exists():
    missing, gone = unmapped(ROOT, LAYOUT.read_text())
    assert not missing, f"docs/layout.md has no line for {sorted(missing)}: add one line each"
    assert not gone, f"docs/layout.md names {sorted(gone)}, which are not in the tree: remove or rename them"


def test_the_check_catches_a_module_added_without_a_line(tmp_path):
    (tmp_path / "pdml_ray" / "core").mkdir(parents=True)
    for name in ("__init__.py", "core/__init__.py", "core/old.py", "core/new.py"):
        (tmp_path / "pdml_ray" / name).write_text("")
    text = "- `pdml_ray/__init__.py`\n- `pdml_ray/core/`\n  - `pdml_ray/core/old.py`\n  - `pdml_ray/core/gone.py`\n"
    assert unmapped(tmp_path, text) == ({"pdml_ray/core/new.py"}, {"pdml_ray/core/gone.py"})
