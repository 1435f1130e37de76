"""The README's Python snippet runs as written on a CPU machine (a fresh interpreter, a local Ray)."""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_python_snippet_runs_as_written(tmp_path):
    snippet = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "snippet.py"
    # a private local cluster with 2 CPUs, whatever else runs on this machine; the snippet is unchanged
    script.write_text(snippet.replace("ray.init()", "ray.init(address='local', num_cpus=2, include_dashboard=False)"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "PDMLRunInfo(" in out.stdout
    sizes = eval(out.stdout.strip().splitlines()[-1])  # the batch sizes: two ints summing to the global batch
    assert len(sizes) == 2 and sum(sizes) == 256
