"""Lost stage replicas as data: re-routing a step's work mid-step, and plans on the survivors.

Two records, both pure (no Ray), both returned by the Ray-actor runtime so that what it did after a
death is visible:

* ``Reroute``: a replica died DURING a step. ``Dispatcher.drop_replica`` moves every micro-batch
  placed on it this step to the survivors of its stage and says which of them had to be replayed.
  The rule is wholesale: the dead replica's accumulated parameter gradients died with it, so every
  micro-batch it held at that stage runs its forward and backward again on a survivor, whatever
  state it had reached (not started, forward done, backward done). A micro-batch whose forward had
  run there is a *replayed forward* (from the stage's input activations, which the runtime keeps for
  the whole step); one whose backward had finished there is a *redone backward* (its gradient was
  lost). Survivors are chosen least-loaded first (fewest pending actions, ties to the lowest replica).
* ``Replan``: for the steps AFTER a death, ``exclude_replicas`` turns the scheduler's plan (made for
  the replicas the runtime was launched with) into a valid plan on the survivors only: each dead
  replica's micro-batches go to the survivor with the fewest, every survivor's actions are merged in
  the order of the original plan's in-order run (its unit-time grid, a topological order, so the
  merged plan cannot deadlock), survivors are renumbered 0..n-1 (``alive`` maps back), and the
  memory limit is raised to the merged peak where the survivors now hold more activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.plan import Action, Kind, Plan, unit_time_grid, validate


@dataclass(frozen=True)
class Reroute:
    """What the runtime did when replica ``replica`` of ``stage`` died during ``step``."""

    step: int
    stage: int
    replica: int
    """The dead replica."""
    moved: tuple[tuple[int, int], ...]
    """(micro-batch, survivor) for every micro-batch the dead replica held at this stage this step."""
    replayed_forwards: tuple[int, ...]
    """Micro-batches whose forward had finished on the dead replica: run again on the survivor."""
    redone_backwards: tuple[int, ...]
    """Micro-batches whose backward had finished on the dead replica: their gradient died with it."""
    phase: str = "step"
    """'step' (noticed while running actions) or 'exchange' (noticed while summing gradients)."""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "stage": self.stage, "replica": self.replica, "phase": self.phase,
                "moved": [list(x) for x in self.moved], "replayed_forwards": list(self.replayed_forwards),
                "redone_backwards": list(self.redone_backwards)}


@dataclass(frozen=True)
class Replan:
    """A scheduler's plan moved onto the surviving replicas (``exclude_replicas``)."""

    alive: tuple[tuple[int, ...], ...]
    """Per stage, the surviving replicas (ids of the original plan); replica r of ``plan`` is alive[k][r]."""
    moved: tuple[tuple[int, int, int, int], ...]
    """(stage, micro-batch, from dead replica, to surviving replica), in original ids."""
    memory_limit: int | None
    """The plan's memory limit after the merge (raised where survivors hold more activations)."""
    plan: Plan
    """The plan that runs, on survivors only: ``plan.replicas`` counts survivors."""

    def to_dict(self) -> dict[str, Any]:
        return {"alive": [list(a) for a in self.alive], "moved": [list(x) for x in self.moved],
                "memory_limit": self.memory_limit, "replicas": list(self.plan.replicas)}


def pick_survivor(load: dict[int, int]) -> int:
    """The least-loaded survivor (ties to the lowest id); ``load`` maps survivor -> work units."""
    if not load:
        raise PlanError("no surviving replica to move work to")
    return min(load, key=lambda r: (load[r], r))


def exclude_replicas(plan: Plan, alive: Sequence[Sequence[int]]) -> Replan:
    """``plan`` on the replicas in ``alive`` (per stage, ids of ``plan``) only; see the module docstring.

    PlanError naming the stage if a stage has no replica left, or if ``alive`` names unknown replicas.
    With every replica alive the plan is returned unchanged.
    """
    if len(alive) != plan.num_stages:
        raise PlanError(f"alive lists {len(alive)} stages; the plan has {plan.num_stages}")
    live = [tuple(sorted(set(int(r) for r in a))) for a in alive]
    for k, rs in enumerate(live):
        if not rs:
            raise PlanError(f"stage {k} has no surviving replica (it had {plan.replicas[k]}); the pipeline cannot run")
        if rs[0] < 0 or rs[-1] >= plan.replicas[k]:
            raise PlanError(f"alive replicas {list(rs)} of stage {k} are not in 0..{plan.replicas[k] - 1}")
    if all(len(rs) == n for rs, n in zip(live, plan.replicas)):
        return Replan(tuple(live), (), plan.memory_limit, plan)
    # Unit-time slot of every action in the original in-order run: a topological order of the step.
    slot = {a: t for t, row in enumerate(unit_time_grid(plan)) for a in row.values()}
    orders: dict[tuple[int, int], tuple[Action, ...]] = {}
    moved: list[tuple[int, int, int, int]] = []
    for k in range(plan.num_stages):
        target: dict[int, int] = {}  # micro-batch -> surviving replica, for the dead replicas' micro-batches
        load = {r: sum(1 for a in plan.orders[(k, r)] if a.kind is Kind.FORWARD) for r in live[k]}
        for r in range(plan.replicas[k]):
            if r in live[k]:
                continue
            for a in plan.orders[(k, r)]:
                if a.kind is Kind.FORWARD:
                    s = pick_survivor(load)
                    load[s] += 1
                    target[a.microbatch] = s
                    moved.append((k, a.microbatch, r, s))
        for rank, s in enumerate(live[k]):
            mine = [(a, pos) for pos, a in enumerate(plan.orders[(k, s)])]
            mine += [(a, pos) for r in range(plan.replicas[k]) if r not in live[k]
                     for pos, a in enumerate(plan.orders[(k, r)]) if target[a.microbatch] == s]
            mine.sort(key=lambda item: (slot[item[0]], item[0].replica, item[1]))
            orders[(k, rank)] = tuple(Action(k, rank, a.kind, a.microbatch) for a, _ in mine)
    limit = plan.memory_limit
    if limit is not None:
        for actions in orders.values():
            held = 0
            for a in actions:
                held += 1 if a.kind is Kind.FORWARD else -1
                limit = max(limit, held)
    new = Plan(plan.num_stages, tuple(len(rs) for rs in live), plan.num_microbatches, orders,
               reorder=plan.reorder, memory_limit=limit, schedule=plan.schedule)
    validate(new)
    return Replan(tuple(live), tuple(moved), limit, new)
