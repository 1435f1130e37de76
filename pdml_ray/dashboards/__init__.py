"""A Grafana dashboard for pdml-ray's metrics (``ray_pdml_*``), installed next to Ray's own.

Ray's dashboard process writes Grafana's provisioning under the session directory when it starts
(``<session>/metrics/grafana/``: ``grafana.ini``, a Prometheus data source, and a file provider that
loads every ``*.json`` of ``<session>/metrics/grafana/dashboards/``). ``install_grafana_dashboard``
copies ``pdml_grafana_dashboard.json`` into that folder: a Grafana started with Ray's
``grafana.ini`` (``grafana-server --config <session>/metrics/grafana/grafana.ini web``) shows it in
the "Ray" folder as "pdml-ray", and one already running picks it up within its provisioning scan
(10 s). Ray rewrites that folder when a new session's dashboard starts: install after ``ray start``
(or ``ray.init()``), once per session.

Beside the installer:

    workload.py  a short synthetic run that gives every series a value
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

DASHBOARD_FILE = "pdml_grafana_dashboard.json"
"""The dashboard's file name, in this package and in Grafana's dashboard folder."""

_DASHBOARD_DIR_ENV = "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"  # Ray's own override of the folder ...
_METRICS_ROOT_ENV = "RAY_METRICS_OUTPUT_ROOT"  # ... and of <session>/metrics


def dashboard_path() -> Path:
    """The dashboard JSON shipped with pdml-ray."""
    return Path(__file__).with_name(DASHBOARD_FILE)


def load_dashboard() -> dict[str, Any]:
    """The dashboard as a dict (Grafana's dashboard JSON model)."""
    with open(dashboard_path(), encoding="utf-8") as f:
        return json.load(f)


def current_session_dir() -> Path:
    """The session directory of the Ray this process is connected to, else ``/tmp/ray/session_latest``
    (the newest local session) resolved to its real directory."""
    ray = sys.modules.get("ray")  # only if the caller uses Ray: this module never imports it
    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    if node is not None and ray is not None and ray.is_initialized():
        return Path(node.get_session_dir_path())
    return Path("/tmp/ray/session_latest").resolve()


def grafana_dashboard_dir(session_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder Ray's Grafana provisioning loads dashboards from, for ``session_dir`` (default: the
    current session, ``current_session_dir()``). Ray's environment overrides apply as Ray applies them:
    ``RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR`` names the folder, ``RAY_METRICS_OUTPUT_ROOT`` replaces
    ``<session>/metrics``."""
    if os.environ.get(_DASHBOARD_DIR_ENV):
        return Path(os.environ[_DASHBOARD_DIR_ENV])
    if os.environ.get(_METRICS_ROOT_ENV):
        return Path(os.environ[_METRICS_ROOT_ENV]) / "grafana" / "dashboards"
    session = Path(session_dir) if session_dir is not None else current_session_dir()
    return session / "metrics" / "grafana" / "dashboards"


def install_grafana_dashboard(session_dir: str | os.PathLike[str] | None = None) -> Path:
    """Copy pdml-ray's Grafana dashboard where Ray's Grafana provisioning picks dashboards up and
    return the installed file's path. ``session_dir``: a Ray session directory (default: the current
    session; see ``grafana_dashboard_dir``). The folder is created if Ray has not written it (a
    session started without the dashboard); a previous copy is replaced."""
    target_dir = grafana_dashboard_dir(session_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / DASHBOARD_FILE
    tmp = target.with_suffix(".json.tmp")  # Grafana scans the folder: never let it read half a file
    shutil.copyfile(dashboard_path(), tmp)
    os.replace(tmp, target)
    return target


__all__ = ["DASHBOARD_FILE", "current_session_dir", "dashboard_path", "grafana_dashboard_dir",
           "install_grafana_dashboard", "load_dashboard"]
