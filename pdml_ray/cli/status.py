"""``pdml-ray status``: the running schedulers' current priorities, from any shell on the cluster.

Per run: decision versions, batch sizes, gradient weights, rates per worker (each deriver's typed stats
record prints itself), and the node decision in force at the newest reported step with the pending one
(published for a later step: the node axis's batch sizes above are the newest, which may be pending);
``--json`` prints the same records as one JSON object ``{"schedulers": {name: SchedulerStats as a
dict}, "node_decisions": {name: {"in_force": ..., "pending": ...}}}`` for scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pdml_ray.cli.args import non_empty, ray_address
from pdml_ray.errors import SchedulerUnavailableError

if TYPE_CHECKING:
    from pdml_ray.scheduler import SchedulerStats

DESCRIPTION = "show the priorities of running pdml-ray schedulers (batch sizes, weights, rates)"
STATS_TIMEOUT_S = 30.0


class NoSchedulerError(SchedulerUnavailableError):
    """The cluster answers but runs no (such) scheduler: exit status 1, the arguments were fine."""

    exit_status = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", type=ray_address, default="auto",
                        help="Ray cluster address, HOST:PORT or auto (default: auto)")
    parser.add_argument("--name", type=non_empty("scheduler name"), default=None,
                        help="scheduler actor name (pdml-<run name>); default: every running pdml-ray scheduler")
    parser.add_argument("--namespace", type=non_empty("namespace"), default="pdml",
                        help="scheduler namespace (default pdml)")
    parser.add_argument("--json", action="store_true", help="print the stats records as JSON instead of text")


def format_stats(stats: SchedulerStats) -> str:
    """What ``pdml-ray status`` prints: the scheduler's counters, then each deriver's own summary."""
    return "\n".join(stats.summary_lines())


def to_jsonable(value: Any) -> Any:
    """Stats records (frozen dataclasses holding numpy arrays and scalars) as plain JSON values.

    Non-finite floats become None (strict JSON has no NaN); mapping keys become strings.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars
        return to_jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def fetch_stats(args: argparse.Namespace) -> dict[str, SchedulerStats]:
    """Connect (probing the address first) and fetch every selected scheduler's stats record, and its
    node decision history (``histories``, for ``render``)."""
    import ray

    from pdml_ray.actors.scheduler import find_scheduler, list_schedulers
    from pdml_ray.cli.cluster import connect

    connect(args.address)
    names = [args.name] if args.name else list_schedulers(args.namespace)
    handles = {name: find_scheduler(name, args.namespace) for name in names}
    handles = {name: h for name, h in handles.items() if h is not None}
    if not handles:
        which = f"named {args.name!r}" if args.name else "at all"
        raise NoSchedulerError(f"no pdml-ray scheduler {which} in namespace {args.namespace!r} (is a training run active?)")
    refs = {name: (h.stats.remote(), h.decision_history.remote("node")) for name, h in handles.items()}
    try:
        fetched = {name: (ray.get(s, timeout=STATS_TIMEOUT_S), ray.get(d, timeout=STATS_TIMEOUT_S))
                   for name, (s, d) in refs.items()}
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
        raise NoSchedulerError(f"a scheduler stopped answering ({type(e).__name__}); the run may have ended") from None
    return _WithHistories({name: stats for name, (stats, _) in fetched.items()},
                          {name: history for name, (_, history) in fetched.items()})


class _WithHistories(dict):
    """The stats records by scheduler name, with each one's node decision history alongside."""

    def __init__(self, stats: Mapping[str, Any], histories: Mapping[str, list[dict[str, Any]]]) -> None:
        super().__init__(stats)
        self.histories = dict(histories)


def node_decisions(stats: SchedulerStats, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The node decision in force at the newest reported step and the pending one (or None)."""
    from pdml_ray.train.result_metrics import in_force_and_pending  # torch, imported only to render a run

    in_force, pending = in_force_and_pending(history, stats.last_step)
    return {"step": stats.last_step, "in_force": in_force, "pending": pending}


def _decision_lines(view: dict[str, Any]) -> str:
    from pdml_ray.train.result_metrics import describe_decision

    return (f"\nnode decision in force at step {view['step']}: {describe_decision(view['in_force'])}"
            f"\npending: {describe_decision(view['pending'])}")


def render(all_stats: dict[str, SchedulerStats], as_json: bool) -> str:
    histories: Mapping[str, list[dict[str, Any]]] = getattr(all_stats, "histories", {})
    views = {name: node_decisions(all_stats[name], history) for name, history in histories.items()}
    if as_json:
        return json.dumps({"schedulers": {name: to_jsonable(s) for name, s in all_stats.items()},
                           "node_decisions": to_jsonable(views)}, indent=2)
    return "\n".join(f"== {name}\n{format_stats(stats)}{_decision_lines(views[name]) if name in views else ''}"
                     for name, stats in all_stats.items())


def run(args: argparse.Namespace) -> int:
    print(render(fetch_stats(args), args.json))
    return 0
