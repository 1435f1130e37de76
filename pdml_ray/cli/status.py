"""``pdml-ray status``: the running scheduler's current priorities, from any shell on the cluster."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdml_ray.scheduler import SchedulerStats

DESCRIPTION = "show the priorities of a running pdml-ray scheduler (batch sizes, weights, rates)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    parser.add_argument("--name", default=None,
                        help="scheduler actor name (pdml-<run name>); default: every running pdml-ray scheduler")
    parser.add_argument("--namespace", default="pdml", help="scheduler namespace (default pdml)")


def format_stats(stats: SchedulerStats) -> str:
    """What ``pdml-ray status`` prints: the scheduler's counters, then each deriver's own summary."""
    return "\n".join(stats.summary_lines())


def _probe(address: str) -> None:
    """Fail in seconds, not after Ray's minute of retries, when nothing listens at the address."""
    import socket

    from ray._private.services import canonicalize_bootstrap_address_or_die

    host, _, port = canonicalize_bootstrap_address_or_die(address).rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        raise ConnectionError(f"nothing answers at {host}:{port} ({e.strerror or e})") from e


def run(args: argparse.Namespace) -> int:
    import ray

    from pdml_ray.actors.scheduler import find_scheduler, list_schedulers

    try:
        _probe(args.address)
        ray.init(address=args.address, log_to_driver=False)
    except ConnectionError as e:
        print(f"no Ray cluster at {args.address!r}: {e}\nstart one with `ray start --head` or run `pdml-ray demo`")
        return 1
    names = [args.name] if args.name else list_schedulers(args.namespace)
    handles = {name: find_scheduler(name, args.namespace) for name in names}
    handles = {name: h for name, h in handles.items() if h is not None}
    if not handles:
        which = f"named {args.name!r}" if args.name else "at all"
        print(f"no pdml-ray scheduler {which} in namespace {args.namespace!r} (is a training run active?)")
        return 1
    for name, handle in handles.items():
        print(f"== {name}")
        print(format_stats(ray.get(handle.stats.remote(), timeout=30)))
    return 0
