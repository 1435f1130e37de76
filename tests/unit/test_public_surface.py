"""The public surface is what ``__all__`` lists, and the docs import only from it: every
``from pdml_ray... import name`` in the README, the docs and the notebooks names a package (not one of
its modules) and a name in that package's ``__all__``; every name in an ``__all__`` resolves; every
package's docstring names each of its modules."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPORT = re.compile(r"^\s*from (pdml_ray[\w.]*) import ([^#\n]+)", re.MULTILINE)


def _doc_texts() -> dict[str, str]:
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[str(nb.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return texts


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for doc, text in _doc_texts().items():
        for module, names in IMPORT.findall(text):
            for name in names.replace("(", "").replace(")", "").split(","):
                name = name.strip().split(" as ")[0].strip()
                if name:
                    found.append((doc, module, name))
    return found


def _packages() -> list[str]:
    return sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "pdml_ray").rglob("__init__.py"))


def test_the_docs_import_a_good_number_of_names():
    assert len(_imports()) >= 40  # the scan finds the guides' imports (it would pass vacuously on none)


@pytest.mark.parametrize("doc, module, name", _imports(), ids=lambda v: str(v))
def test_docs_import_only_from_a_packages_all(doc, module, name):
    assert (ROOT / Path(*module.split(".")) / "__init__.py").exists(), \
        f"{doc} imports {name} from the module {module}: import it from its package's __all__"
    package = importlib.import_module(module)
    assert name in getattr(package, "__all__", ()), f"{doc} imports {name} from {module}, which does not list it in __all__"


@pytest.mark.parametrize("package", _packages())
def test_every_name_in_all_resolves_and_the_docstring_lists_every_module(package):
    module = importlib.import_module(package)
    for name in getattr(module, "__all__", ()):
        assert getattr(module, name) is not None, f"{package}.__all__ lists {name}, which does not resolve"
    folder = ROOT / Path(*package.split("."))
    doc = module.__doc__ or ""
    missing = [p.name for p in sorted(folder.glob("*.py")) if p.stem not in ("__init__", "__main__")
               and p.name not in doc and p.stem not in doc]
    assert not missing, f"{package}'s docstring does not name {missing}: one line each for what they hold"
