"""Python snippets in Markdown files: find them and run them as written in a fresh interpreter.

Used by ``test_guides.py``: every ```python block of a guide, in order, is one program.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

_PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the fenced ```python blocks of ``markdown``, in order."""
    return [m.group(1) for m in _PYTHON_BLOCK.finditer(markdown)]


def run_python(code: str, workdir: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``code`` as a script in ``workdir`` with ``env`` (a fresh interpreter); output captured as text."""
    script = workdir / "snippet.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout_s,
                          cwd=workdir, env=env)
