"""Baselines from torch itself: the per-rank orders torch.distributed.pipelining's schedule classes
generate, converted to this project's ``Plan`` and checked with ``validate``.

torch builds a schedule's ``pipeline_order`` in its constructor from stage objects and a process
group; the order itself comes from a pure per-rank generator (``_calculate_single_rank_operations``)
that reads only a few sizes. We call that generator on an instance made without ``__init__`` (no
stages, no process group) and read torch's private ``_Action`` (stage_index, computation_type,
microbatch_index). Both are private API, so the torch version they were read from is pinned
(``SUPPORTED_TORCH``): another version raises PDMLError naming it instead of building a wrong plan.

The other direction, a project plan as torch's per-rank ``_Action`` lists (``torch_actions``), reads
the same kind table; ``pdml_ray.pipeline.torch_exec`` runs those lists on torch's own runtime.
"""

from __future__ import annotations

from typing import Any, Sequence

from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.pipeline.plan import Action, DecisionRecord, Kind, Measurement, Plan, validate

SUPPORTED_TORCH = "2.13"
"""torch major.minor whose private schedule generators, ``_Action`` and ``_PipelineScheduleRuntime`` the
project uses (here and in ``pdml_ray.pipeline.torch_exec``)."""

_KINDS = {"F": Kind.FORWARD, "B": Kind.BACKWARD, "I": Kind.INPUT, "W": Kind.WEIGHT}
"""torch ``_ComputationType`` value -> Kind (FULL_BACKWARD is "B", BACKWARD_INPUT "I", BACKWARD_WEIGHT "W");
the one table both directions read (``_converted`` into plans, ``torch_actions`` out of them)."""
_TORCH_KINDS = {kind: value for value, kind in _KINDS.items()}


def torch_schedules() -> Any:
    """``torch.distributed.pipelining.schedules``, after checking that the installed torch is the pinned one
    (the one place the pin is checked: reading torch's orders and running plans on its runtime)."""
    import torch
    from torch.distributed.pipelining import schedules

    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version != SUPPORTED_TORCH:
        raise PlanError(f"torch baselines and plans on torch's runtime use torch {SUPPORTED_TORCH}'s private schedule "
                        f"generators, _Action and _PipelineScheduleRuntime, but torch "
                        f"{torch.__version__} is installed; install torch {SUPPORTED_TORCH}.x or update "
                        "pdml_ray.pipeline.torch_orders for this version")
    return schedules



def torch_gpipe_plan(ranks: int, microbatches: int) -> Plan:
    """``ScheduleGPipe``'s order (all forwards, then all backwards), one stage per rank, validated."""
    return torch_plan("ScheduleGPipe", ranks, microbatches)


def torch_1f1b_plan(ranks: int, microbatches: int) -> Plan:
    """``Schedule1F1B``'s order, one stage per rank, validated; its listing's last rank is repaired
    (``ADJUSTMENTS['torch-1f1b']``)."""
    return torch_plan("Schedule1F1B", ranks, microbatches)


def torch_looped_bfs_plan(ranks: int, microbatches: int, chunks: int = 2) -> Plan:
    """``ScheduleLoopedBFS``'s order (breadth first: every forward of a rank's earlier chunk first), validated."""
    return torch_plan("ScheduleLoopedBFS", ranks, microbatches, chunks)


def torch_zbv_plan(ranks: int, microbatches: int) -> Plan:
    """``ScheduleZBVZeroBubble``'s order for ``ranks`` ranks (two chunks each, as a V: 2 x ranks
    stages, rank r holding stages r and 2 ranks - 1 - r), one replica per stage, validated."""
    return torch_plan("ScheduleZBVZeroBubble", ranks, microbatches, 2)


def torch_dualpipev_plan(ranks: int, microbatches: int) -> Plan:
    """``ScheduleDualPipeV``'s order (a V of two chunks per rank), validated; its overlapped F + B
    pairs and its full backwards are expanded (``ADJUSTMENTS['torch-dualpipev']``)."""
    return torch_plan("ScheduleDualPipeV", ranks, microbatches, 2)


def torch_interleaved_zb_plan(ranks: int, microbatches: int, chunks: int = 1) -> Plan:
    """``ScheduleInterleavedZeroBubble``'s order (F, I, W) for ``ranks`` ranks of ``chunks`` chunks each
    (looped: rank r holds stages r, r + ranks, ...), one replica per stage, validated."""
    return torch_plan("ScheduleInterleavedZeroBubble", ranks, microbatches, chunks)


def torch_interleaved_1f1b_plan(ranks: int, microbatches: int, chunks: int = 2) -> Plan:
    """``ScheduleInterleaved1F1B``'s order (F, B) for ``ranks`` ranks of ``chunks`` chunks each (looped),
    one replica per stage, validated."""
    return torch_plan("ScheduleInterleaved1F1B", ranks, microbatches, chunks)


_V_SHAPED = frozenset({"ScheduleZBVZeroBubble", "ScheduleDualPipeV"})
"""torch classes whose ranks hold their two chunks as a V (stages r and 2 ranks - 1 - r); the rest loop."""

ADJUSTMENTS: dict[str, str] = {
    "ScheduleGPipe": "",
    "Schedule1F1B": (
        "torch 2.13's listing (Schedule1F1B._get_pipeline_order) starts the last rank's forwards at micro-batch 1: "
        "with no warm-up forward its counter is incremented before the first steady forward, so F0 is missing "
        "and F<M> is out of range (validation: 'micro-batch M out of range'). The last rank's forwards are "
        "renumbered m -> m - 1, giving F0 B0 F1 B1 ..., the order Schedule1F1B's runtime "
        "(_step_microbatches) executes"),
    "ScheduleLoopedBFS": "",
    "ScheduleInterleaved1F1B": "",
    "ScheduleInterleavedZeroBubble": "",
    "ScheduleZBVZeroBubble": "",
    "ScheduleDualPipeV": (
        "torch 2.13's order mixes full backwards (B) with split ones (I, W) and lists OVERLAP_F_B actions "
        "(validation: 'a plan runs either F + B or F + I + W'). Each OVERLAP_F_B becomes its two sub-actions "
        "in order (F, then the full backward; the overlap of one chunk's compute with the other's communication "
        "is not modelled), and each full backward becomes I then W at once (I + W = B: same work, same order)"),
}
"""Per torch class, what was changed in its generated order so that the project's validator accepts
it ('' = validated unchanged). REDUCE_GRAD actions (the gradient reduction after a stage's last
backward) are dropped everywhere: the plan format has no reduction action and it costs no compute here."""

_AT_LEAST_STAGES = frozenset({"Schedule1F1B", "ScheduleDualPipeV"})
"""torch classes whose constructor refuses fewer micro-batches than stages (chunks x ranks)."""


def torch_plan(cls_name: str, ranks: int, microbatches: int, chunks: int = 1, *, name: str = "") -> Plan:
    """The order torch's ``cls_name`` generates for ``ranks`` ranks of ``chunks`` chunks and
    ``microbatches`` micro-batches, one replica per stage, adjusted as ``ADJUSTMENTS`` says and
    validated. PlanError for sizes torch's own constructor refuses, naming its rule."""
    schedules = torch_schedules()
    cls = getattr(schedules, cls_name)
    gen = cls.__new__(cls)
    stages = ranks * chunks
    if cls_name in _AT_LEAST_STAGES and microbatches < stages:
        raise PlanError(f"torch's {cls_name} needs at least as many micro-batches as stages ({stages}: {chunks} "
                        f"chunk(s) x {ranks} ranks), got {microbatches}")
    if issubclass(cls, schedules.PipelineScheduleSingle):
        sizes: dict[str, Any] = {"_n_microbatches": microbatches, "_num_stages": ranks}
    else:
        rounds = max(1, microbatches // ranks)
        if "Interleaved" in cls_name and microbatches % rounds:
            raise PlanError(f"torch's {cls_name} needs micro-batches a multiple of its {rounds} rounds "
                            f"(max(1, micro-batches // ranks)), got {microbatches}; use a multiple of {ranks}")
        sizes = {"_n_microbatches": microbatches, "num_stages": stages, "pp_group_size": ranks,
                 "n_local_stages": chunks, "number_of_rounds": rounds, "microbatches_per_round": microbatches // rounds,
                 "_stages": [None] * chunks}  # LoopedBFS counts its chunks as len(self._stages)
    return _plan(gen, sizes, ranks, chunks, "v" if cls_name in _V_SHAPED else "loop", name or cls_name)


def _plan(gen: Any, sizes: dict[str, Any], ranks: int, chunks: int, style: str, name: str) -> Plan:
    """Run torch's per-rank generator ``gen`` (made without ``__init__``, given the ``sizes`` its
    generator reads) for every rank and convert its ``_Action``s; a missing attribute or an unknown
    kind means torch's private API moved."""
    schedules = torch_schedules()
    stages, cls_name = ranks * chunks, type(gen).__name__
    try:
        for attr, value in sizes.items():
            setattr(gen, attr, value)
        if isinstance(gen, schedules.PipelineScheduleSingle):
            per_rank = gen._get_pipeline_order()
        else:
            per_rank = {r: gen._calculate_single_rank_operations(r) for r in range(ranks)}
        stage_rank = schedules.generate_stage_to_rank_mapping(ranks, stages, style=style)
        listed = {r: list(_compute_actions(acts)) for r, acts in per_rank.items()}
        split = any(kind in ("I", "W") for acts in listed.values() for _, kind, _ in acts)
        if cls_name == "Schedule1F1B":
            listed[ranks - 1] = _renumber_last_rank(listed[ranks - 1], sizes["_n_microbatches"])
        orders = {(r, 0): tuple(a for s, kind, m in acts for a in _converted(s, kind, m, split))
                  for r, acts in listed.items()}
    except (AttributeError, KeyError, TypeError) as err:
        raise PlanError(f"torch's {cls_name} generator did not run as torch {SUPPORTED_TORCH}'s does "
                        f"({err!r}); update pdml_ray.pipeline.torch_orders for the installed torch") from err
    plan = Plan(num_stages=stages, replicas=(1,) * stages, num_microbatches=sizes["_n_microbatches"], orders=orders,
                stage_rank=tuple(stage_rank[k] for k in range(stages)), schedule=name)
    validate(plan)
    return plan


def _compute_actions(actions: Any) -> Any:
    """torch's listed actions as (stage, kind value, micro-batch), in order: idle slots (None) and
    REDUCE_GRAD dropped, an OVERLAP_F_B replaced by its sub-actions."""
    for a in actions:
        if a is None or a.computation_type.value == "REDUCE_GRAD":
            continue
        if a.computation_type.value == "OVERLAP_F_B":
            yield from _compute_actions(a.sub_actions)
        else:
            yield a.stage_index, a.computation_type.value, a.microbatch_index


def _converted(stage: int, kind: str, microbatch: int, split: bool) -> tuple[Action, ...]:
    """One listed action as plan actions: a full backward in a plan that splits others is I then W."""
    if kind == "B" and split:
        return Action(stage, 0, Kind.INPUT, microbatch), Action(stage, 0, Kind.WEIGHT, microbatch)
    return (Action(stage, 0, _KINDS[kind], microbatch),)


def torch_actions(plan: Plan) -> dict[int, list[Any]]:
    """``plan`` as torch's per-rank compute-only order: rank -> torch ``_Action``s (stage, F/B/I/W,
    micro-batch) in the plan's order, what torch's ``_PipelineScheduleRuntime`` lowers and runs. The
    inverse of reading torch's orders (``torch_plan``: the same kind table), so a torch order read into a
    plan comes back as torch listed it, less its REDUCE_GRAD actions (torch's lowering adds them back).
    One pipeline only: PlanError for a plan with more than one replica of a stage."""
    schedules = torch_schedules()
    if any(r != 1 for r in plan.replicas):
        raise PlanError(f"torch's pipeline runtime runs one pipeline (one replica per stage), but {plan.schedule or 'the plan'} "
                        f"has replicas {list(plan.replicas)}; plan with replicas=1 and run data-parallel replicas as "
                        "separate pipelines")
    ranks = plan.num_stages if plan.stage_rank is None else max(plan.stage_rank) + 1
    action, kind = schedules._Action, schedules._ComputationType
    return {rank: [action(a.stage, kind(_TORCH_KINDS[a.kind]), a.microbatch) for a in plan.orders[(rank, 0)]]
            for rank in range(ranks)}


def _renumber_last_rank(actions: list[tuple[int, str, int]], microbatches: int) -> list[tuple[int, str, int]]:
    """``ADJUSTMENTS['Schedule1F1B']``: the last rank's listed forwards 1..M become 0..M-1 (only when
    they are exactly 1..M: a torch that fixed its listing is read unchanged)."""
    forwards = [m for _, kind, m in actions if kind == "F"]
    if forwards != list(range(1, microbatches + 1)):
        return actions
    return [(s, kind, m - 1 if kind == "F" else m) for s, kind, m in actions]


def replicated_plan(cls_name: str, ranks: int, replicas: int, microbatches: int, chunks: int = 1,
                    *, name: str = "") -> Plan:
    """torch's order run as ``replicas`` data-parallel pipelines (PP x DP, as torch users run it):
    replica r takes micro-batches r, r + replicas, ... (round robin) and runs torch's order for that
    many micro-batches on its own ranks. Validated."""
    if microbatches < replicas:
        raise PlanError(f"{replicas} replicas need at least {replicas} micro-batches (one each), got {microbatches}")
    ids = [list(range(r, microbatches, replicas)) for r in range(replicas)]
    return lanes_plan(cls_name, ranks, ids, [list(range(replicas))] * ranks, chunks, name=name)


def lanes_plan(cls_name: str, ranks: int, lane_microbatches: Sequence[Sequence[int]],
               members: Sequence[Sequence[int]], chunks: int = 1, *, name: str = "") -> Plan:
    """torch's order on lanes: lane j is one pipeline through replica ``members[rank][j]`` of every rank
    and runs torch's order for its micro-batches ``lane_microbatches[j]`` (any count, any ids; every
    micro-batch in exactly one lane). How osprey routes micro-batches across replicas while keeping
    torch's order within each pipeline. Validated."""
    lanes = len(lane_microbatches)
    microbatches = sum(len(ids) for ids in lane_microbatches)
    parts: dict[int, Plan] = {}
    orders: dict[tuple[int, int], tuple[Action, ...]] = {}
    layout: Plan | None = None
    for j, ids in enumerate(lane_microbatches):
        if not ids:
            continue
        if len(ids) not in parts:
            parts[len(ids)] = torch_plan(cls_name, ranks, len(ids), chunks, name=name)
        layout = part = parts[len(ids)]
        for (rank, _), acts in part.orders.items():
            r = members[rank][j]
            orders[(rank, r)] = tuple(Action(a.stage, r, a.kind, ids[a.microbatch]) for a in acts)
    if layout is None:
        raise PlanError("lanes_plan needs at least one micro-batch")
    for rank in range(ranks):  # a replica whose lane got no micro-batch idles
        for j in range(lanes):
            orders.setdefault((rank, members[rank][j]), ())
    plan = Plan(num_stages=layout.num_stages, replicas=(lanes,) * layout.num_stages, num_microbatches=microbatches,
                orders=orders, stage_rank=layout.stage_rank, schedule=layout.schedule)
    validate(plan)
    return plan


class TorchOrderSchedule:
    """A schedule torch ships, as a static baseline: its generated order (``replicated_plan``) every
    step, measurements ignored. ``stages`` are ranks: a schedule of ``chunks`` chunks per rank plans
    ``chunks`` x ``stages`` virtual stages (the simulator cuts each stage's cost into that many equal
    chunks). torch runs one pipeline per data-parallel replica, so every stage needs the same
    number of replicas; sizes torch refuses are a ConfigError naming its rule."""

    name = "torch"
    torch_class = ""
    chunks = 1
    last_decision: DecisionRecord | None = None  # a static order decides nothing

    def __init__(self, *, stages: int, replicas: Sequence[int], microbatches: int, config: Any = None) -> None:
        reps = tuple(replicas)
        if len(set(reps)) != 1:
            raise ConfigError(f"{self.name} runs torch's {self.torch_class} as one pipeline per data-parallel replica, "
                              f"so every stage needs the same number of replicas; got {list(reps)}")
        self.stages, self.replicas, self.microbatches = stages, reps, microbatches
        try:
            self._plan = replicated_plan(self.torch_class, stages, reps[0], microbatches, self.chunks, name=self.name)
        except PlanError as err:
            if "did not run as torch" in str(err) or "install torch" in str(err):
                raise
            raise ConfigError(f"{self.name} at {stages} ranks x {reps[0]} replicas x {microbatches} micro-batches "
                              f"({-(-microbatches // reps[0])} per replica): {err}") from err

    def plan(self, step: int) -> Plan:
        return self._plan

    def tell_sizes(self, step: int, sizes: Sequence[float]) -> None:
        """A static order is fixed before any step: micro-batch sizes change nothing."""

    def observe(self, measurements: Sequence[Measurement]) -> None:
        """A torch order is fixed: measurements change nothing."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: the order is a function of the sizes."""


class TorchGPipe(TorchOrderSchedule):
    name, torch_class = "torch-gpipe", "ScheduleGPipe"


class Torch1F1B(TorchOrderSchedule):
    name, torch_class = "torch-1f1b", "Schedule1F1B"


class TorchInterleaved1F1B(TorchOrderSchedule):
    name, torch_class, chunks = "torch-interleaved-1f1b", "ScheduleInterleaved1F1B", 2


class TorchLoopedBFS(TorchOrderSchedule):
    name, torch_class, chunks = "torch-looped-bfs", "ScheduleLoopedBFS", 2


class TorchZeroBubble(TorchOrderSchedule):
    """``ScheduleInterleavedZeroBubble`` with one chunk per rank (ZB-H1)."""

    name, torch_class = "torch-zb", "ScheduleInterleavedZeroBubble"


class TorchInterleavedZeroBubble(TorchOrderSchedule):
    name, torch_class, chunks = "torch-interleaved-zb", "ScheduleInterleavedZeroBubble", 2


class TorchInterleavedZeroBubble3(TorchOrderSchedule):
    """``ScheduleInterleavedZeroBubble`` with three chunks per rank: the baseline at a chunk count osprey's
    zero-bubble lanes may choose (``osprey_candidates.ZERO_BUBBLE_CHUNKS``)."""

    name, torch_class, chunks = "torch-interleaved-zb-3", "ScheduleInterleavedZeroBubble", 3


class TorchInterleavedZeroBubble4(TorchOrderSchedule):
    """``ScheduleInterleavedZeroBubble`` with four chunks per rank (as ``TorchInterleavedZeroBubble3``)."""

    name, torch_class, chunks = "torch-interleaved-zb-4", "ScheduleInterleavedZeroBubble", 4


class TorchZBV(TorchOrderSchedule):
    name, torch_class, chunks = "torch-zbv", "ScheduleZBVZeroBubble", 2


class TorchDualPipeV(TorchOrderSchedule):
    name, torch_class, chunks = "torch-dualpipev", "ScheduleDualPipeV", 2
