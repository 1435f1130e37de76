"""The layers hold: the core imports without Ray, nothing imports upward, no import cycles.

Layers, top to bottom (docs/layout.md): entry points (cli, bench) -> train, runtime -> actors -> metrics
-> the core (everything else in ``pdml_ray``, which never imports ray). Imports are read from the
source (module level, inside functions and inside ``if TYPE_CHECKING:`` blocks), so a lazy upward
import is caught too, and a type-only import counts towards a cycle like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pdml_ray"

# Rank of each layer; a module may import modules of its own rank or lower only.
LAYERS = {"cli": 5, "bench": 5, "train": 4, "runtime": 4, "actors": 3, "metrics": 2}
CORE_RANK = 1
# Modules inside upper packages that hold no Ray and must import without it (worker-side code).
RAY_FREE_EXTRAS = ["pdml_ray.train.context", "pdml_ray.train.step", "pdml_ray.train.timing",
                   "pdml_ray.train.wrappers", "pdml_ray.train.workloads", "pdml_ray.train.installed_context",
                   "pdml_ray.train.saved_state"]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _rank(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], CORE_RANK) if len(parts) > 1 else CORE_RANK


def _imports(module: str) -> set[str]:
    """Project modules ``module`` imports (``from a.b import c`` counts as a.b.c when that is a module)."""
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: _imports(m) for m in MODULES}


def test_no_module_imports_a_higher_layer():
    upward = [f"{m} ({_rank(m)}) imports {d} ({_rank(d)})" for m, deps in GRAPH.items() for d in deps
              if _rank(d) > _rank(m) and m != "pdml_ray"]
    assert not upward, "\n".join(upward)


def test_the_core_never_names_ray():
    offenders = []
    for m, path in MODULES.items():
        if _rank(m) == CORE_RANK or m in RAY_FREE_EXTRAS:
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                offenders += [f"{m}: {n}" for n in names if n == "ray" or n.startswith("ray.")]
    assert not offenders, offenders


def test_there_are_no_import_cycles():
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(GRAPH[m]):
            if d == "pdml_ray":
                continue  # the package's own __init__ re-exports the public API; importing it is fine
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                cycle = visit(d)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


def test_every_core_module_imports_without_ray_in_a_fresh_interpreter():
    core = [m for m in MODULES if _rank(m) == CORE_RANK] + RAY_FREE_EXTRAS
    assert len(core) > 20 and "pdml_ray.scheduler" in core and "pdml_ray.pipeline.stage" in core
    script = (
        "import importlib, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'ray' in sys.modules:\n"
        "        sys.exit(f'importing {name} imported ray')\n"
        "print('ok', len(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr
