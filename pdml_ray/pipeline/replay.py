"""Deterministic replay: log every step's decision and adaptive state; replaying reproduces each plan.

A ``RecordingScheduler`` wraps any scheduler and logs, per global step, the scheduler's state before
planning (``state_dict``), the plan, the decision behind it (``last_decision.to_dict()``: osprey's
weights and bottlenecks, auto's choice and reason; None for a static schedule) and the measurements
observed after the step. The log is plain JSON (``recorder.to_json()``). ``replay`` rebuilds a fresh
scheduler and feeds it the logged measurements; ``replay_step`` restores one step's logged state and
re-plans it. Both raise ``PlanError`` naming the step and the first differing replica if a plan
differs from the log, and ``StateError`` if the log does not fit (malformed, or written by a version
whose schedulers or state differ). Schedulers are deterministic functions of their measurements (no
clocks, no unseeded randomness), and floats survive JSON exactly (shortest round-trip repr), so
replay is exact, not approximate.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

from pdml_ray.config import PipelineConfig, load_dataclass
from pdml_ray.errors import ConfigError, PlanError, StateError
from pdml_ray.pipeline.plan import DecisionRecord, Kind, Measurement, PipelineScheduler, Plan
from pdml_ray.pipeline.registry import make_scheduler


def measurement_to_list(x: Measurement) -> list[Any]:
    return [x.stage, x.replica, x.kind.value, x.microbatch, x.latency_s]


def measurement_from_list(v: Sequence[Any]) -> Measurement:
    """Inverse of ``measurement_to_list``; StateError if ``v`` is not [stage, replica, kind, microbatch, seconds]."""
    try:
        stage, replica, kind, microbatch, latency_s = v
        return Measurement(int(stage), int(replica), Kind(kind), int(microbatch), float(latency_s))
    except (TypeError, ValueError) as e:
        raise StateError(f"logged measurement {v!r} is not [stage, replica, 'F' or 'B', microbatch, seconds] ({e}); "
                         "replay a log written by RecordingScheduler") from None


class RecordingScheduler:
    """Wraps a scheduler (and is one); ``log`` holds one JSON-able record per planned step."""

    def __init__(self, scheduler: PipelineScheduler, *, stages: int, replicas: int | Sequence[int],
                 microbatches: int, config: PipelineConfig | None = None) -> None:
        self.inner = scheduler
        self.name = scheduler.name
        reps = [replicas] * stages if isinstance(replicas, int) else list(replicas)
        self.header = {"schedule": scheduler.name, "stages": stages, "replicas": reps, "microbatches": microbatches,
                       "config": dataclasses.asdict(config) if config is not None else None}
        self.log: list[dict[str, Any]] = []

    @property
    def last_decision(self) -> DecisionRecord | None:
        return self.inner.last_decision

    def plan(self, step: int) -> Plan:
        state = copy.deepcopy(self.inner.state_dict())
        plan = self.inner.plan(step)
        decision = self.inner.last_decision
        self.log.append({"step": step, "state": state, "plan": plan.to_dict(),
                         "decision": decision.to_dict() if decision is not None else None, "measurements": []})
        return plan

    def observe(self, measurements: Sequence[Measurement]) -> None:
        if self.log:
            self.log[-1]["measurements"].extend(measurement_to_list(x) for x in measurements)
        self.inner.observe(measurements)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def to_json(self) -> str:
        return json.dumps({"header": self.header, "steps": self.log})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())


def load(path: str | Path) -> dict[str, Any]:
    """A log written by ``RecordingScheduler.save`` (use ``json.loads`` for one held as text)."""
    return json.loads(Path(path).read_text())


def _config_from_dict(data: dict[str, Any] | None) -> PipelineConfig | None:
    if data is None:
        return None
    data = dict(data)
    if data.get("stage_costs") is not None:
        data["stage_costs"] = [tuple(c) for c in data["stage_costs"]]  # JSON turned the tuples into lists
    return load_dataclass(PipelineConfig, data, "pipeline.")


def _check(step: int, expected: dict[str, Any], plan: Plan) -> None:
    got = plan.to_dict()
    if got == expected:
        return
    hint = "the scheduler's code or the log's measurements changed since it was recorded"
    for key in sorted(set(expected["orders"]) | set(got["orders"])):
        if expected["orders"].get(key) != got["orders"].get(key):
            raise PlanError(f"replay diverged at step {step}: replica {key} planned {got['orders'].get(key)} "
                            f"but the log has {expected['orders'].get(key)} ({hint})")
    raise PlanError(f"replay diverged at step {step}: plan fields differ ({got} vs {expected}; {hint})")


def _fresh(log: dict[str, Any]) -> PipelineScheduler:
    """A new scheduler as the log's header describes it."""
    try:
        header = log["header"]
        return make_scheduler(header["schedule"], stages=header["stages"], replicas=header["replicas"],
                              microbatches=header["microbatches"], config=_config_from_dict(header["config"]))
    except (KeyError, TypeError, ConfigError) as e:
        raise StateError(f"replay log header does not describe a scheduler this version can build ({type(e).__name__}: "
                         f"{e}); replay a log written by RecordingScheduler.save with this version") from e


def replay(log: dict[str, Any]) -> list[Plan]:
    """Re-run the logged steps on a fresh scheduler; every plan must equal the logged one exactly."""
    scheduler = _fresh(log)
    plans = []
    for record in log["steps"]:
        plan = scheduler.plan(record["step"])
        _check(record["step"], record["plan"], plan)
        plans.append(plan)
        scheduler.observe([measurement_from_list(v) for v in record["measurements"]])
    return plans


def replay_step(log: dict[str, Any], index: int) -> Plan:
    """Restore the state logged before step record ``index`` and re-plan that step alone."""
    steps = log["steps"]
    if not -len(steps) <= index < len(steps):
        raise StateError(f"step record {index} is not in the log, which has {len(steps)}; pass 0..{len(steps) - 1}")
    record = steps[index]
    scheduler = _fresh(log)
    scheduler.load_state_dict(copy.deepcopy(record["state"]))
    plan = scheduler.plan(record["step"])
    _check(record["step"], record["plan"], plan)
    return plan
