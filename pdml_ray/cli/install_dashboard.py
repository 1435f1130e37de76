"""``pdml-ray install-dashboard``: put pdml-ray's Grafana dashboard where Ray's Grafana provisioning
loads dashboards (``<session>/metrics/grafana/dashboards/``), for the current or a given Ray session.

Ray rewrites that folder when a session's dashboard starts: run it after ``ray start`` (on the head
node), once per session. docs/observability.md says how to open Grafana with Ray's configuration.
"""

from __future__ import annotations

import argparse
import os

from pdml_ray.errors import UsageError

DESCRIPTION = "install pdml-ray's Grafana dashboard into a Ray session's Grafana provisioning folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session-dir", default=None,
                        help="Ray session directory (default: the newest local one, /tmp/ray/session_latest)")


def run(args: argparse.Namespace) -> int:
    from pdml_ray.dashboards import install_grafana_dashboard

    if args.session_dir is not None and not os.path.isdir(args.session_dir):
        raise UsageError(f"--session-dir {args.session_dir}: no such directory (a Ray session directory, e.g. "
                         "/tmp/ray/session_latest)")
    if args.session_dir is None and not os.path.isdir("/tmp/ray/session_latest") and not any(
            k in os.environ for k in ("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR", "RAY_METRICS_OUTPUT_ROOT")):
        raise UsageError("no Ray session on this machine (/tmp/ray/session_latest is missing): run `ray start "
                         "--head` first, or pass --session-dir")
    path = install_grafana_dashboard(args.session_dir)
    print(f"installed the pdml-ray Grafana dashboard: {path}")
    return 0
