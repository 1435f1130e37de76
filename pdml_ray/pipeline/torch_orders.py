"""Baselines from torch itself: the per-rank orders torch.distributed.pipelining's schedule classes
generate, converted to this project's ``Plan`` and checked with ``validate``.

torch builds a schedule's ``pipeline_order`` in its constructor from stage objects and a process
group; the order itself comes from a pure per-rank generator (``_calculate_single_rank_operations``)
that reads only a few sizes. We call that generator on an instance made without ``__init__`` (no
stages, no process group) and read torch's private ``_Action`` (stage_index, computation_type,
microbatch_index). Both are private API, so the torch version they were read from is pinned
(``SUPPORTED_TORCH``): another version raises PDMLError naming it instead of building a wrong plan.
"""

from __future__ import annotations

from typing import Any

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.plan import Action, Kind, Plan, validate

SUPPORTED_TORCH = "2.13"
"""torch major.minor whose private schedule generators and ``_Action`` this module reads."""

_KINDS = {"F": Kind.FORWARD, "B": Kind.BACKWARD, "I": Kind.INPUT, "W": Kind.WEIGHT}
"""torch ``_ComputationType`` value -> Kind (FULL_BACKWARD is "B", BACKWARD_INPUT "I", BACKWARD_WEIGHT "W")."""


def _schedules() -> Any:
    import torch
    from torch.distributed.pipelining import schedules

    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version != SUPPORTED_TORCH:
        raise PlanError(f"torch baselines read torch {SUPPORTED_TORCH}'s private schedule generators, but torch "
                        f"{torch.__version__} is installed; install torch {SUPPORTED_TORCH}.x or update "
                        "pdml_ray.pipeline.torch_orders for this version")
    return schedules


def torch_zbv_plan(ranks: int, microbatches: int) -> Plan:
    """``ScheduleZBVZeroBubble``'s order for ``ranks`` ranks (two chunks each, as a V: 2 x ranks
    stages, rank r holding stages r and 2 ranks - 1 - r), one replica per stage, validated."""
    schedules = _schedules()
    gen = schedules.ScheduleZBVZeroBubble.__new__(schedules.ScheduleZBVZeroBubble)
    sizes = {"_n_microbatches": microbatches, "num_stages": 2 * ranks, "pp_group_size": ranks, "n_local_stages": 2}
    return _plan(gen, sizes, ranks, 2, "v", "torch-zbv")


def torch_interleaved_zb_plan(ranks: int, microbatches: int, chunks: int = 1) -> Plan:
    """``ScheduleInterleavedZeroBubble``'s order (F, I, W) for ``ranks`` ranks of ``chunks`` chunks each
    (looped: rank r holds stages r, r + ranks, ...), one replica per stage, validated."""
    return _interleaved("ScheduleInterleavedZeroBubble", ranks, microbatches, chunks, "torch-interleaved-zb")


def torch_interleaved_1f1b_plan(ranks: int, microbatches: int, chunks: int = 2) -> Plan:
    """``ScheduleInterleaved1F1B``'s order (F, B) for ``ranks`` ranks of ``chunks`` chunks each (looped),
    one replica per stage, validated."""
    return _interleaved("ScheduleInterleaved1F1B", ranks, microbatches, chunks, "torch-interleaved-1f1b")


def _interleaved(cls_name: str, ranks: int, microbatches: int, chunks: int, name: str) -> Plan:
    """The looped schedules' generators read the same sizes; torch needs ``microbatches`` a multiple
    of its rounds (max(1, microbatches // ranks))."""
    schedules = _schedules()
    cls = getattr(schedules, cls_name)
    gen = cls.__new__(cls)
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise PlanError(f"torch's {cls_name} needs micro-batches a multiple of its {rounds} rounds, got "
                        f"{microbatches}; use a multiple of {ranks}")
    sizes = {"_n_microbatches": microbatches, "pp_group_size": ranks, "n_local_stages": chunks,
             "number_of_rounds": rounds, "microbatches_per_round": microbatches // rounds}
    return _plan(gen, sizes, ranks, chunks, "loop", name)


def _plan(gen: Any, sizes: dict[str, int], ranks: int, chunks: int, style: str, name: str) -> Plan:
    """Run torch's per-rank generator ``gen`` (made without ``__init__``, given the ``sizes`` its
    generator reads) for every rank and convert its ``_Action``s; a missing attribute or an unknown
    kind means torch's private API moved."""
    schedules = _schedules()
    stages = ranks * chunks
    try:
        for attr, value in sizes.items():
            setattr(gen, attr, value)
        per_rank = {r: gen._calculate_single_rank_operations(r) for r in range(ranks)}
        stage_rank = schedules.generate_stage_to_rank_mapping(ranks, stages, style=style)
        orders = {(r, 0): tuple(Action(a.stage_index, 0, _KINDS[a.computation_type.value], a.microbatch_index)
                                for a in acts if a is not None) for r, acts in per_rank.items()}
    except (AttributeError, KeyError, TypeError) as err:
        raise PlanError(f"torch's {type(gen).__name__} generator did not run as torch {SUPPORTED_TORCH}'s does "
                        f"({err!r}); update pdml_ray.pipeline.torch_orders for the installed torch") from err
    plan = Plan(num_stages=stages, replicas=(1,) * stages, num_microbatches=sizes["_n_microbatches"], orders=orders,
                stage_rank=tuple(stage_rank[k] for k in range(stages)), schedule=name)
    validate(plan)
    return plan
