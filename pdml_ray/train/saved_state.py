"""pdml-ray's state in a data-parallel run's checkpoint: the file it is in, what it holds, and the
checks a resume runs on it before anything is applied (Ray-free).

``PDMLContext.save_scheduler_state`` writes a ``SavedRunState`` on rank 0 next to the model;
``PDMLContext.load_scheduler_state`` reads it back on every rank through ``read_saved_run``, which
refuses a damaged file or a decision this run could not have made with the same StateError on every
rank. The file is ``pdml_ray.state_format`` data (JSON plus arrays, never a pickle). A pipeline run
keeps its own state (``train/pipeline.py``) in the same file name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import NodeDecision
from pdml_ray.errors import PDMLError, StateError
from pdml_ray.state_format import check_decision, check_scheduler_decisions, read_state, write_state

SCHEDULER_STATE_FILE = "pdml_scheduler_state.npz"
"""pdml-ray's state in a checkpoint directory: a ``pdml_ray.state_format`` zip (JSON plus arrays)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedRunState:
    """A data-parallel run's position and the decisions in force and pending, with the scheduler's state."""

    state: Any
    """The scheduler's ``state_dict()`` (estimates, decisions, the sample table)."""
    decision: NodeDecision
    """The node decision in force at ``global_step``."""
    versions: dict[str, int]
    """The newest adopted decision version per deriver (``node``, ``sample``, other axes)."""
    global_step: int
    """Steps finished."""
    position: tuple[int, int]
    """(epoch, offset) just after the last finished step: where the resumed run continues."""
    lead_steps: int
    """How many steps after its boundary an adopted decision takes effect (``ctx.batch_sampler``)."""
    upcoming: tuple[NodeDecision, ...]
    """Adopted node decisions not in force yet, in step order, each after ``global_step``."""
    horizon: int
    """The batch sizes of every step before this one are settled."""


_SAVED_KEYS = {f.name for f in fields(SavedRunState)}


PIPELINE_KEYS = {"state", "global_step", "stages"}
"""What a pipeline run's state file holds (``train/pipeline.py``): the scheduler's state, the steps
trained and the number of stages."""

_KINDS = {"a data-parallel run": _SAVED_KEYS, "a pipeline run": PIPELINE_KEYS}


def open_saved_state(directory: str, kind: str) -> tuple[str, dict[str, Any]] | None:
    """The path and contents of the pdml-ray state file in ``directory``, or None if it has none. A file
    that is not a whole pdml-ray state, or not one ``kind`` writes (``"a data-parallel run"`` or ``"a
    pipeline run"``), raises StateError naming the file and, where it is the other kind's, that kind.
    What the keys hold is the caller's to check."""
    path = os.path.join(directory, SCHEDULER_STATE_FILE)
    if not os.path.exists(path):
        return None
    saved = read_state(path)  # StateError naming the file if it is not a whole pdml-ray state
    keys = _KINDS[kind]
    if not (isinstance(saved, dict) and set(saved) == keys):
        other = next((k for k, v in _KINDS.items() if isinstance(saved, dict) and set(saved) == v), None)
        raise StateError(f"{path} holds a pdml-ray state this run refuses: it does not hold the "
                         f"{', '.join(sorted(keys))} {kind}'s save_scheduler_state writes"
                         + (f" ({other}'s checkpoint?)" if other else "")
                         + ". Resume from another checkpoint, or with the run's own kind and config")
    return path, saved


def write_saved_run(directory: str, saved: SavedRunState) -> None:
    """Write ``saved`` into the checkpoint directory ``directory`` (``SCHEDULER_STATE_FILE``)."""
    write_state(os.path.join(directory, SCHEDULER_STATE_FILE), {f.name: getattr(saved, f.name) for f in fields(saved)})


def read_saved_run(directory: str, config: PDMLConfig, world_size: int, *, elastic: bool) -> SavedRunState | None:
    """The state ``write_saved_run`` wrote into ``directory``, whole and checked, or None if it holds none.

    A damaged file, or a decision this run could not have made (batch sizes outside min/max or not
    summing to the global batch, weights not their shares, for ``world_size`` workers, or for the
    saved decision's worker count when ``elastic``), raises StateError naming the file."""
    found = open_saved_state(directory, "a data-parallel run")
    if found is None:
        return None
    path, saved = found
    try:
        decision, versions, step, position = (saved["decision"], saved["versions"], saved["global_step"],
                                              saved["position"])
        lead, upcoming, horizon = saved["lead_steps"], saved["upcoming"], saved["horizon"]

        def count(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and x >= 0

        if not (isinstance(decision, NodeDecision) and isinstance(versions, dict) and count(step)
                and all(isinstance(k, str) and count(v) for k, v in versions.items())
                and isinstance(position, tuple) and len(position) == 2 and all(count(x) for x in position)):
            raise StateError(f"its decision, versions, global_step and position are malformed: {decision!r:.80}, "
                             f"{versions!r:.80}, {step!r:.20}, {position!r:.40}")
        # decisions adopted but not in force yet: in step order, each after the saved step
        if not (count(lead) and count(horizon) and isinstance(upcoming, tuple)
                and all(isinstance(d, NodeDecision) for d in upcoming)
                and all(a.effective_step < b.effective_step for a, b in zip(upcoming, upcoming[1:]))
                and all(d.effective_step > step for d in upcoming)):
            raise StateError(f"its lead_steps, pending decisions and horizon are malformed: {lead!r:.20}, "
                             f"{upcoming!r:.120}, {horizon!r:.20}")
        # an elastic run restarts with another worker count whenever Ray Train resizes it
        workers = len(decision.batch_sizes) if elastic else world_size
        for pending in (decision, *upcoming):
            check_decision(pending, config, workers)
        check_scheduler_decisions(saved["state"], config, workers)
    except PDMLError as e:
        raise StateError(f"{path} holds a pdml-ray state this run refuses: {e}. It was altered, or written by a "
                         "run with another PDMLConfig or number of workers: resume from another checkpoint, or "
                         "with the config that wrote it") from None
    return SavedRunState(**saved)
