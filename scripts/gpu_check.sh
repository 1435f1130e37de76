#!/bin/sh
# The one GPU check: every GPU test (tests/gpu) and examples/gpu_check.py (CUDA events, DDP and FSDP2
# gradient weights, SyncBatchNorm, the workers on CUDA with NCCL), one JSON with the results.
#
#   sh scripts/gpu_check.sh [OUT.json]        (also: make gpu-check; default OUT: results/gpu_check.json)
#
# On a machine without an NVIDIA GPU it installs nothing, writes a JSON that says it was skipped and
# why, and exits 0. On a fresh GPU machine it builds the virtual env with PyTorch's CUDA build
# (make TORCH_SPEC=torch venv), and replaces a CPU-only torch in an existing env with the CUDA build of
# the same version. With one GPU every check runs at world size 1; multi-rank NCCL (the weighting
# across ranks, SyncBatchNorm's cross-rank statistics) needs 2 or more, and the JSON says which ran.
# On a GPU machine with no package index, VENV=DIR uses an environment prepared there: DIR/bin/python
# with torch's CUDA build, Ray and this project importable, and DIR/.pdml-installed present (make then
# installs nothing).
# Exit status: 0 when everything that ran passed (or nothing could run), 1 otherwise. Never part of CI.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu_check.json}
VENV=${VENV:-.venv}
PY=$VENV/bin/python
mkdir -p "$(dirname "$OUT")"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -eq 0 ]; then
    reason="no NVIDIA GPU visible (nvidia-smi is missing or lists none)"
    echo "gpu_check: SKIPPED: $reason; nothing installed, nothing run"
    printf '{"ran": false, "skipped": "%s", "gpus": 0, "ok": null}\n' "$reason" > "$OUT"
    echo "gpu_check: wrote $OUT"
    exit 0
fi
echo "gpu_check: $gpus GPU(s):"
nvidia-smi -L

make TORCH_SPEC=torch VENV="$VENV" venv || exit 1
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    version=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
    echo "gpu_check: the env's torch $version cannot use the GPU (a CPU build?): installing its CUDA build"
    "$PY" -m pip install -q --force-reinstall "torch==$version" || exit 1
    "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || {
        echo "gpu_check: torch still sees no GPU (driver too old for this CUDA build?); see nvidia-smi"; exit 1; }
fi

work=$(mktemp -d)
# the example runs once, below, with its JSON: its pytest wrapper is left out here
"$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu --junitxml="$work/tests.xml" \
    --deselect tests/gpu/test_gpu_path.py::test_gpu_check_script_trains_through_pdml_trainer
tests_rc=$?
"$PY" examples/gpu_check.py --json "$work/example.json"
example_rc=$?

"$PY" - "$work" "$OUT" "$tests_rc" "$example_rc" <<'EOF'
import json, subprocess, sys, xml.etree.ElementTree as ET
work, out, tests_rc, example_rc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tests = []
try:
    for case in ET.parse(f"{work}/tests.xml").iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        detail = next((c.get("message", "") for c in case if c.tag in ("failure", "error", "skipped")), "")
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time", 0)), "detail": detail[:500]})
except (OSError, ET.ParseError) as e:
    tests.append({"test": "tests/gpu", "outcome": "error", "detail": f"no pytest report: {e}"})
try:
    with open(f"{work}/example.json") as f:
        example = json.load(f)
except (OSError, ValueError) as e:
    example = {"ok": False, "error": f"examples/gpu_check.py wrote no JSON: {e}"}
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
import torch
report = {"ran": True, "git_rev": rev, "torch": torch.__version__, "cuda": torch.version.cuda,
          "gpus": torch.cuda.device_count(), "world_size": example.get("world_size"),
          "multi_rank_nccl": example.get("multi_rank_nccl", False), "not_run": example.get("not_run", []),
          "tests": tests, "tests_ok": tests_rc == 0, "example": example,
          "ok": tests_rc == 0 and example_rc == 0 and bool(example.get("ok"))}
with open(out, "w") as f:
    json.dump(report, f, indent=1)
print(f"gpu_check: tests {'passed' if tests_rc == 0 else 'FAILED'}, example {'OK' if report['ok'] else 'FAILED'}; "
      f"world size {report['world_size']}, multi-rank NCCL {'run' if report['multi_rank_nccl'] else 'not run'}; "
      f"wrote {out}")
sys.exit(0 if report["ok"] else 1)
EOF
