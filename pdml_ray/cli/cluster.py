"""Reaching a Ray cluster from the command line: fail in seconds, not after Ray's minutes of retries.

``ray.init(address=...)`` keeps retrying an address where nothing listens (``demo --address
127.0.0.1:1`` once hung for minutes); a plain TCP connect first tells the user at once.
"""

from __future__ import annotations

import logging
import socket

from pdml_ray.errors import SchedulerUnavailableError

PROBE_TIMEOUT_S = 3.0


class NoClusterError(SchedulerUnavailableError):
    """Nothing answers at the Ray address given (exit status 1: the arguments were fine)."""

    exit_status = 1


def probe(address: str) -> None:
    """Raise ``NoClusterError`` unless something accepts a TCP connection at ``address`` (Ray's GCS)."""
    from ray._private.services import canonicalize_bootstrap_address_or_die

    bare = address[len("ray://"):] if address.startswith("ray://") else address
    try:
        resolved = bare if address.startswith("ray://") else canonicalize_bootstrap_address_or_die(bare)
    except (ConnectionError, ValueError) as e:  # 'auto' with no cluster started on this machine
        raise NoClusterError(f"no Ray cluster at {address!r} ({e}); start one with `ray start --head`") from None
    host, _, port = str(resolved).rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except (OSError, OverflowError, ValueError) as e:
        reason = getattr(e, "strerror", None) or e
        raise NoClusterError(f"no Ray cluster at {address!r}: nothing answers at {host}:{port} ({reason}); "
                             "start one with `ray start --head`, or give --address HOST:PORT of a running one") from None


def connect(address: str) -> None:
    """``ray.init`` on an existing cluster after a probe; reuses Ray when this process already runs it."""
    import ray

    if ray.is_initialized():
        return
    probe(address)
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
