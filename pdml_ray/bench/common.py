"""What every benchmark shares: common flags, machine facts, JSON output and a printed table."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from pdml_ray.errors import ResultError, UsageError


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smoke-sized run (a minute or two on 2 cores)")
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON to FILE")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="device to train on (default cpu)")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when a target is missed (without it the exit status is 0)")


def add_compute_argument(parser: argparse.ArgumentParser, per_sample_ms: float = 0.5, default: str = "real",
                         help_text: str | None = None) -> None:
    """``--compute real|sleep`` and ``--per-sample-ms``, for benchmarks that can emulate compute time."""
    from pdml_ray.emulation import COMPUTE_MODES

    parser.add_argument("--compute", choices=COMPUTE_MODES, default=default,
                        help=help_text or (
                            f"real: the workload's own compute; sleep: a small real forward/backward plus an "
                            f"EMULATED sleep of samples x per-sample time / speed, so CPU contention does not "
                            f"decide the result (default {default})"))
    parser.add_argument("--per-sample-ms", type=float, default=per_sample_ms,
                        help=f"emulated compute per sample at speed 1 with --compute sleep (default {per_sample_ms})")


def missed_targets(result: dict[str, Any]) -> list[str]:
    """Names of the targets a benchmark result missed (``targets``: name -> {..., "met": bool})."""
    return [name for name, t in result.get("targets", {}).items() if not t["met"]]


GIT_REV_ENV = "PDML_GIT_REV"
"""Environment variable naming the commit a run comes from when the code has no ``.git`` (a clean
``git archive`` of a commit, extracted elsewhere): git_rev() reports it, marked clean."""


def git_state(where: Path | None = None) -> tuple[str, bool | None]:
    """(short commit, dirty) of the code in ``where`` (default: this package): dirty is True when tracked
    files differ from that commit (the figures then come from code no commit holds), None when unknown.
    Without a git work tree, the commit ``PDML_GIT_REV`` names."""
    here = where or Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=here)
        if rev.returncode == 0 and rev.stdout.strip():
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                    text=True, timeout=30, cwd=here)
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
            return rev.stdout.strip(), dirty
    except (OSError, subprocess.SubprocessError):
        pass
    pinned = os.environ.get(GIT_REV_ENV, "").strip()
    return (pinned, False) if pinned else ("unknown", None)


def git_rev(where: Path | None = None) -> str:
    """The short commit, with ``-dirty`` appended when tracked files differ from it."""
    rev, dirty = git_state(where)
    return f"{rev}-dirty" if dirty else rev


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """Cores, memory and device of the machine the benchmark ran on."""
    info: dict[str, Any] = {"cores": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version(), "device": device}
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
    except ImportError:
        pass
    return info


def init_ray(num_cpus: int) -> None:
    """Join the cluster in ``RAY_ADDRESS`` (a submitted job, ``ray job submit``), else start a private
    local Ray instance of ``num_cpus`` logical CPUs. Never ``ray.init(num_cpus=...)`` alone: with another
    local cluster running on the machine, Ray attaches to it and then refuses ``num_cpus``."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)  # the user's cluster
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA GPU is visible here; use --device cpu")


def median(values: Sequence[float | None]) -> float | None:
    """Median of the values that are not None (e.g. runs that never reached a target); None if none are."""
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def finish(args: argparse.Namespace, result: dict[str, Any], emulated: dict[str, Any]) -> dict[str, Any]:
    """Add the standard fields (command, git_rev, git_dirty, machine, emulated) and write --json if asked."""
    rev, dirty = git_state()
    full = {"command": "pdml-ray " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "",
            "git_rev": f"{rev}-dirty" if dirty else rev, "git_dirty": dirty, "machine": machine_info(args.device),
            "emulated": emulated, **result}
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(full, indent=2, default=_jsonable))
        tmp.replace(path)  # never leave a half-written result behind
        print(f"wrote {path}")
    return full


def _jsonable(x: Any) -> Any:
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
    except ImportError:
        pass
    raise ResultError(f"not JSON serialisable: {type(x).__name__}")


def ratio_key(method: str, baseline: str) -> str:
    """JSON key of a ratio, e.g. ``osprey_over_1f1b_weighted``."""
    return f"{method}_over_{baseline}".replace("-", "_")


def paired_ratio_stats(baseline_s: Sequence[float], method_s: Sequence[float]) -> dict[str, Any]:
    """Paired statistics of per-round step times (seconds): round i ran both, ``method_s[i] / baseline_s[i]``.

    A ratio below 1 is a round the method won. ``sign_test_p`` is the two-sided sign test's p-value
    (ties left out): how likely so lopsided a split of won rounds is when neither side is faster.
    """
    if len(baseline_s) != len(method_s) or not baseline_s:
        raise UsageError(f"paired statistics need the same number (>= 1) of rounds on both sides, got "
                         f"{len(baseline_s)} and {len(method_s)}")
    ratios = [m / b for b, m in zip(baseline_s, method_s)]
    wins, losses = sum(r < 1.0 for r in ratios), sum(r > 1.0 for r in ratios)
    n = wins + losses
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n if n else 1.0
    return {"rounds": len(ratios), "median_ratio": float(statistics.median(ratios)),
            "min_ratio": min(ratios), "max_ratio": max(ratios),
            "rounds_method_faster": wins, "rounds_baseline_faster": losses, "rounds_tied": len(ratios) - n,
            "sign_test_p": min(1.0, 2 * tail),
            "ratio_of_medians": float(statistics.median(method_s) / statistics.median(baseline_s)),
            "ratios": ratios}


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A plain fixed-width table; floats are shown with 4 significant digits."""
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if title:
        print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
