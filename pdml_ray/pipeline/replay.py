"""Deterministic replay: log every step's decision and adaptive state; replaying reproduces each plan.

A ``RecordingScheduler`` wraps any scheduler and logs, per global step, the scheduler's state before
planning, the plan, the decision data (``last_decision``: osprey's weights and bottlenecks, auto's
choice and reason) and the measurements observed after the step. The log is plain JSON
(``json.dumps(recorder.log)``). ``replay`` rebuilds a fresh scheduler and feeds it the logged
measurements; ``replay_step`` restores one step's logged state and re-plans it. Both raise
``PlanError`` naming the step and the first differing replica if a plan differs from the log.
Schedulers are deterministic functions of their measurements (no clocks, no unseeded randomness), and
floats survive JSON exactly (shortest round-trip repr), so replay is exact, not approximate.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Sequence

from pdml_ray.errors import PlanError
from pdml_ray.pipeline.plan import Kind, Measurement, PipelineScheduler, Plan
from pdml_ray.pipeline.registry import make_scheduler


def measurement_to_list(x: Measurement) -> list[Any]:
    return [x.stage, x.replica, x.kind.value, x.microbatch, x.latency_s]


def measurement_from_list(v: Sequence[Any]) -> Measurement:
    return Measurement(int(v[0]), int(v[1]), Kind(v[2]), int(v[3]), float(v[4]))


class RecordingScheduler:
    """Wraps a scheduler; ``log`` holds one JSON-able record per planned step."""

    def __init__(self, scheduler: PipelineScheduler, *, stages: int, replicas: int | Sequence[int],
                 microbatches: int, config: Any = None) -> None:
        self.inner = scheduler
        self.name = scheduler.name
        reps = [replicas] * stages if isinstance(replicas, int) else list(replicas)
        self.header = {"schedule": scheduler.name, "stages": stages, "replicas": reps, "microbatches": microbatches,
                       "config": _config_to_dict(config)}
        self.log: list[dict[str, Any]] = []

    def plan(self, step: int) -> Plan:
        state = copy.deepcopy(_state(self.inner))
        plan = self.inner.plan(step)
        self.log.append({"step": step, "state": state, "plan": plan.to_dict(),
                         "decision": copy.deepcopy(getattr(self.inner, "last_decision", {})), "measurements": []})
        return plan

    def observe(self, measurements: Sequence[Measurement]) -> None:
        if self.log:
            self.log[-1]["measurements"].extend(measurement_to_list(x) for x in measurements)
        self.inner.observe(measurements)

    def to_json(self) -> str:
        return json.dumps({"header": self.header, "steps": self.log})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())


def load(path: str | Path) -> dict[str, Any]:
    """A log written by ``RecordingScheduler.save`` (use ``json.loads`` for one held as text)."""
    return json.loads(Path(path).read_text())


def _state(scheduler: Any) -> dict[str, Any]:
    return scheduler.state_dict() if hasattr(scheduler, "state_dict") else {}


def _config_to_dict(config: Any) -> dict[str, Any] | None:
    import dataclasses

    return dataclasses.asdict(config) if config is not None and dataclasses.is_dataclass(config) else None


def _config_from_dict(data: dict[str, Any] | None) -> Any:
    if data is None:
        return None
    from pdml_ray.config import PipelineConfig, _from_dict

    data = dict(data)
    if data.get("stage_costs") is not None:
        data["stage_costs"] = [tuple(c) for c in data["stage_costs"]]  # JSON turned the tuples into lists
    return _from_dict(PipelineConfig, data, "pipeline.")


def _check(step: int, expected: dict[str, Any], plan: Plan) -> None:
    got = plan.to_dict()
    if got == expected:
        return
    for key in sorted(set(expected["orders"]) | set(got["orders"])):
        if expected["orders"].get(key) != got["orders"].get(key):
            raise PlanError(f"replay diverged at step {step}: replica {key} planned {got['orders'].get(key)} "
                            f"but the log has {expected['orders'].get(key)}")
    raise PlanError(f"replay diverged at step {step}: plan fields differ ({got} vs {expected})")


def _fresh(header: dict[str, Any]) -> PipelineScheduler:
    return make_scheduler(header["schedule"], stages=header["stages"], replicas=header["replicas"],
                          microbatches=header["microbatches"], config=_config_from_dict(header["config"]))


def replay(log: dict[str, Any]) -> list[Plan]:
    """Re-run the logged steps on a fresh scheduler; every plan must equal the logged one exactly."""
    scheduler = _fresh(log["header"])
    plans = []
    for record in log["steps"]:
        plan = scheduler.plan(record["step"])
        _check(record["step"], record["plan"], plan)
        plans.append(plan)
        scheduler.observe([measurement_from_list(v) for v in record["measurements"]])
    return plans


def replay_step(log: dict[str, Any], index: int) -> Plan:
    """Restore the state logged before step record ``index`` and re-plan that step alone."""
    record = log["steps"][index]
    scheduler = _fresh(log["header"])
    if hasattr(scheduler, "load_state_dict"):
        scheduler.load_state_dict(copy.deepcopy(record["state"]))
    plan = scheduler.plan(record["step"])
    _check(record["step"], record["plan"], plan)
    return plan
