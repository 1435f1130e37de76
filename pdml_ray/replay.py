"""Deterministic replay of every axis from the scheduler's own input log.

A scheduler built with ``PDMLConfig(replay_log=N)`` keeps what it took, in order (``InputLog``: reports,
axis observations, shapes, data-set size, registrations, and every decision request with the decisions
it returned). ``replay`` feeds the same inputs to a fresh ``Scheduler`` of the same config and checks
that every request returns the same decisions, axis by axis: derivers are deterministic functions of
their inputs (seeded draws, no clocks that change decisions), so a replay is exact, not approximate.
It raises ``PlanError`` naming the first request, step and axis that differ, and ``StateError`` for a
log that cannot be replayed (its start was dropped, or it is malformed). ``save``/``load`` keep a log in
``pdml_ray.state_format``'s data format (never a pickle).

One replay path for every axis: the node split, sample plans, gradient decisions and the pipeline's
micro-batch plans (osprey's reordering included) all come back through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pdml_ray.client import PackedReports
from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary
from pdml_ray.errors import PDMLError, PlanError, StateError
from pdml_ray.scheduler import Scheduler, decision_data
from pdml_ray.state_format import dumps, loads

FORMAT = "pdml-ray-replay-log"


def recorded(scheduler: Scheduler) -> dict[str, Any]:
    """The scheduler's input log with what a replay needs to rebuild it (config, workers)."""
    if scheduler.inputs is None:
        raise StateError("this scheduler keeps no input log: build it with PDMLConfig(replay_log=N), N > 0")
    return {"format": FORMAT, "config": scheduler.config.to_dict(), "num_workers": scheduler.num_workers,
            "dropped": scheduler.inputs.dropped, "events": list(scheduler.inputs.events)}


def replay(log: dict[str, Any]) -> list[dict[str, Any]]:
    """Re-run the logged inputs on a fresh scheduler; every request's decisions must equal the logged ones.
    Returns the replayed requests' decisions (per request: axis -> decision as a dict)."""
    if not isinstance(log, dict) or log.get("format") != FORMAT or not isinstance(log.get("events"), (list, tuple)):
        raise StateError(f"not a replay log ({FORMAT}, as pdml_ray.replay.recorded writes it)")
    if log.get("dropped"):
        raise StateError(f"the log lost its first {log['dropped']} inputs (PDMLConfig.replay_log was too small for "
                         "the run): a replay must start from the beginning; raise replay_log")
    try:
        config = PDMLConfig.from_dict(log["config"])
        scheduler = Scheduler(dataclasses.replace(config, replay_log=0), int(log["num_workers"]))
    except (PDMLError, KeyError, TypeError, ValueError) as e:
        raise StateError(f"replay log header does not build a scheduler ({type(e).__name__}: {e})") from None
    out = []
    for i, event in enumerate(log["events"]):
        out += _apply(scheduler, i, event)
    return out


def _apply(scheduler: Scheduler, index: int, event: Sequence[Any]) -> list[dict[str, Any]]:
    kind, args = event[0], tuple(event[1:])
    try:
        if kind == "report":
            rows = args[0]
            scheduler.report(PackedReports(rows) if isinstance(rows, (list, tuple)) else rows)
        elif kind == "observe":
            scheduler.observe(*args)
        elif kind == "shape":
            scheduler.set_shape(*args)
        elif kind == "dataset":
            scheduler.set_dataset_size(*args)
        elif kind == "register":
            scheduler.register(*args)
        elif kind == "bundle":
            first_step, num_steps, batch_sizes, since, decided = args
            bundle = scheduler.bundle(Boundary(first_step, num_steps, tuple(batch_sizes)), since)
            got = {name: decision_data(d) for name, d in bundle.decisions.items()}
            if not _equal(got, decided):
                _diverged(index, first_step, decided, got)
            return [got]
        else:
            raise StateError(f"replay log event {index} has unknown kind {kind!r:.40}")
    except PDMLError as e:
        if isinstance(e, (PlanError, StateError)):
            raise
        # the original refused the same input the same way (it was logged before it was checked)
    return []


def _diverged(index: int, step: int, want: dict[str, Any], got: dict[str, Any]) -> None:
    hint = "the derivers' code or the log's inputs changed since it was recorded"
    for axis in sorted(set(want) | set(got)):
        if not _equal(want.get(axis), got.get(axis)):
            raise PlanError(f"replay diverged at request {index} (step {step}): axis {axis!r} decided "
                            f"{_short(got.get(axis))} but the log has {_short(want.get(axis))} ({hint})")


def _equal(a: Any, b: Any) -> bool:
    """The same data all the way down (arrays by dtype kind, shape and values; NaN equals NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == b.dtype.kind == "f"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return bool(a == b)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def save(log: dict[str, Any], path: str | Path) -> None:
    """Write a log ``recorded`` returned, in the project's data format."""
    Path(path).write_bytes(dumps(log))


def load(path: str | Path) -> dict[str, Any]:
    """A log ``save`` wrote; StateError naming the file if it is not one."""
    log = loads(Path(path).read_bytes(), str(path), "replay a log that pdml_ray.replay.save wrote")
    if not isinstance(log, dict):
        raise StateError(f"{path}: not a replay log")
    return log
