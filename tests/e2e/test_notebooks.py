"""The notebooks run top to bottom (code cells executed in order, in a fresh interpreter)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))

RUNNER = """
import json, sys
nb = json.load(open(sys.argv[1]))
scope = {"__name__": "__main__"}
for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] == "code":
        print(f"--- cell {i}", flush=True)
        exec(compile("".join(cell["source"]), f"cell{i}", "exec"), scope)
"""


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(notebook):
    out = subprocess.run([sys.executable, "-c", RUNNER, str(notebook)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if notebook.name == "quickstart.ipynb":
        assert "batch sizes" in out.stdout and "auto chose" in out.stdout
