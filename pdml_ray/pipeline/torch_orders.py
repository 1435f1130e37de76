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
    try:  # the sizes its generator reads (torch 2.13)
        gen._n_microbatches, gen.num_stages, gen.pp_group_size, gen.n_local_stages = microbatches, 2 * ranks, ranks, 2
        per_rank = {r: gen._calculate_single_rank_operations(r) for r in range(ranks)}
        stage_rank = schedules.generate_stage_to_rank_mapping(ranks, 2 * ranks, style="v")
        orders = {(r, 0): tuple(Action(a.stage_index, 0, _KINDS[a.computation_type.value], a.microbatch_index)
                                for a in acts if a is not None) for r, acts in per_rank.items()}
    except (AttributeError, KeyError, TypeError) as err:
        raise PlanError(f"torch's ScheduleZBVZeroBubble generator did not run as torch {SUPPORTED_TORCH}'s does "
                        f"({err!r}); update pdml_ray.pipeline.torch_orders for the installed torch") from err
    plan = Plan(num_stages=2 * ranks, replicas=(1,) * (2 * ranks), num_microbatches=microbatches, orders=orders,
                stage_rank=tuple(stage_rank[k] for k in range(2 * ranks)), schedule="torch-zbv")
    validate(plan)
    return plan
