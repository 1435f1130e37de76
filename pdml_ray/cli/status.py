"""``pdml-ray status``: the running schedulers' current priorities, from any shell on the cluster.

Per run: decision versions, batch sizes, gradient weights, rates per worker (each deriver's typed stats
record prints itself); ``--json`` prints the same records as one JSON object
``{"schedulers": {name: SchedulerStats as a dict}}`` for scripts.
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
    """Connect (probing the address first) and fetch every selected scheduler's stats record."""
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
    refs = {name: h.stats.remote() for name, h in handles.items()}
    try:
        return {name: ray.get(ref, timeout=STATS_TIMEOUT_S) for name, ref in refs.items()}
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
        raise NoSchedulerError(f"a scheduler stopped answering ({type(e).__name__}); the run may have ended") from None


def render(all_stats: dict[str, SchedulerStats], as_json: bool) -> str:
    if as_json:
        return json.dumps({"schedulers": {name: to_jsonable(s) for name, s in all_stats.items()}}, indent=2)
    return "\n".join(f"== {name}\n{format_stats(stats)}" for name, stats in all_stats.items())


def run(args: argparse.Namespace) -> int:
    print(render(fetch_stats(args), args.json))
    return 0
