"""The notebooks run top to bottom (code cells executed in order, in a fresh interpreter), save their
figures as PNG files, and are stored as valid nbformat v4 JSON with their outputs cleared."""

import json
import os
import struct
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

FIGURES = {
    "quickstart.ipynb": ["quickstart_node_priorities.png"],
    "pipeline_scheduling.ipynb": ["pipeline_gantt.png", "pipeline_makespans.png"],
}
"""The PNG files each notebook writes to $PDML_NOTEBOOK_OUT."""

OUTPUT = {
    "quickstart.ipynb": ["batch sizes", "EMULATED", "auto chose"],
    "pipeline_scheduling.ipynb": ["osprey / 1F1B makespan ratio", "auto chose"],
}
"""Lines each notebook must print."""


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; AssertionError if the file is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_every_notebook_has_a_figure_list():
    assert {p.name for p in NOTEBOOKS} == set(FIGURES)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_nbformat_v4_with_outputs_cleared(notebook):
    nb = json.loads(notebook.read_text())
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] >= 4 and isinstance(nb["metadata"], dict)
    ids = [cell.get("id") for cell in nb["cells"]]
    if nb["nbformat_minor"] >= 5:  # cell ids are required from 4.5 on, unique
        assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)
    for cell in nb["cells"]:
        assert cell["cell_type"] in ("markdown", "code") and isinstance(cell["metadata"], dict)
        assert isinstance(cell["source"], list) and all(isinstance(line, str) for line in cell["source"])
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, "store notebooks with outputs cleared"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_saves_its_figures(notebook, tmp_path):
    out_dir = tmp_path / "figures"
    # a private local Ray per notebook (never another agent's cluster); figures to files, no display
    env = {**os.environ, "PDML_NOTEBOOK_OUT": str(out_dir), "MPLBACKEND": "Agg", "RAY_ADDRESS": "local",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", RUNNER, str(notebook)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for text in OUTPUT[notebook.name]:
        assert text in out.stdout, (text, out.stdout[-3000:])
    for name in FIGURES[notebook.name]:
        path = out_dir / name
        assert path.is_file(), f"{notebook.name} did not save {name}: {sorted(p.name for p in out_dir.glob('*'))}"
        width, height = png_size(path)
        assert width >= 600 and height >= 300 and path.stat().st_size > 20_000, (name, width, height,
                                                                                 path.stat().st_size)
