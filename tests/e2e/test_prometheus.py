"""pdml-ray's metrics on the wire: the scheduler actor's series on the node's Prometheus endpoint with
the values its stats say, then the same through a real Prometheus server scraping with the
configuration Ray generates (``<session>/metrics/prometheus/prometheus.yml``).

A private local Ray (its own ports, metrics export port and session) with the dashboard on: the
dashboard's metrics module writes the scrape configuration and the service-discovery file. The
Prometheus test needs the ``prometheus`` binary (``scripts/install_test_tools.sh`` installs Debian's);
it is skipped, saying so, without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from pdml_ray.actors.scheduler import create_scheduler  # noqa: E402
from pdml_ray.dashboards import current_session_dir, workload  # noqa: E402
from pdml_ray.scheduler import Scheduler  # noqa: E402

RUN = "pdml-prom-test"
TIMED = {"pdml_scheduler_ingest_seconds_total", "pdml_scheduler_decision_seconds_total",
         "pdml_scheduler_decision_latency_seconds", "pdml_scheduler_cpu_seconds_total",
         "pdml_sample_continuity_seconds_total", "pdml_sample_selection_seconds_total"}
"""Series measured with clocks: their values differ from an in-process replay (checked > 0 instead)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


_LINE = re.compile(r'^(ray_pdml_[a-z0-9_]+)\{(.*)\} (\S+)$')


def _series(text: str, run: str) -> dict[tuple[str, frozenset], float]:
    """{(name, pdml's tags): value} of the ``ray_pdml_*`` samples of ``run`` in a Prometheus exposition."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        tags = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if tags.get("run") != run:
            continue
        mine = frozenset((k, v) for k, v in tags.items() if k in ("worker", "accelerator_type", "axis", "field", "term"))
        out[(m.group(1), mine)] = float(m.group(3))
    return out


def _expected() -> dict[tuple[str, frozenset], float]:
    """What the actor should export: the same calls replayed on an in-process scheduler."""
    s = Scheduler(workload.config(RUN), workload.NUM_WORKERS)
    workload.replay(s)
    stats = dataclasses.replace(s.stats(), process_cpu_s=1.0)
    return {(f"ray_{g.name}", frozenset(g.tags)): float(g.value) for g in stats.gauges()
            if not (g.name.endswith("_total") and g.value == 0)}  # a counter appears with its first increment


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    for attempt in range(2):  # a node that times out starting (seen once on a loaded machine) gets one retry
        port = _free_port()
        try:
            ray.init(address="local", num_cpus=1, include_dashboard=True, dashboard_port=_free_port(),
                     _metrics_export_port=port, namespace="pdml-prom-test", log_to_driver=False,
                     _system_config={"metrics_report_interval_ms": 1000})  # export every second, not every 10
            break
        except Exception:
            ray.shutdown()
            if attempt:
                raise
            time.sleep(5)
    t0 = time.monotonic()
    handle = create_scheduler(workload.config(RUN), workload.NUM_WORKERS)
    workload.replay(handle, call=lambda h, m, a: ray.get(getattr(h, m).remote(*a)))
    # The actor exports on incoming calls, at most once a second unless a decision is new: one more
    # call after that second exports the replay's last figures (the rejected report among them).
    time.sleep(1.2)
    ray.get(handle.register.remote(0, "H100"))
    run = f"{RUN}-{handle._actor_id.hex()[:8]}"
    yield {"port": port, "run": run, "session": current_session_dir(), "t0": t0}
    ray.kill(handle)
    ray.shutdown()


def _mismatches(expected: dict, got: dict) -> list[str]:
    out = []
    for key, value in expected.items():
        name, tags = key[0], dict(key[1])
        if key not in got:
            out.append(f"{name}{tags} missing")
        elif name.removeprefix("ray_") in TIMED:
            if not got[key] > 0:
                out.append(f"{name}{tags} = {got[key]}, not > 0")
        elif not math.isclose(got[key], value, rel_tol=1e-3, abs_tol=1e-9):  # gauges: 4 significant digits
            out.append(f"{name}{tags} = {got[key]}, expected {value}")
    return out


def test_the_node_endpoint_serves_every_series_with_its_value(cluster):
    expected = _expected()
    url = f"http://127.0.0.1:{cluster['port']}/metrics"
    deadline = time.monotonic() + 45
    while True:  # gauges are set at most every half report interval: the newest values follow
        got = _series(_http(url), cluster["run"])
        wrong = _mismatches(expected, got)
        if not wrong or time.monotonic() > deadline:
            break
        time.sleep(1)
    runs = set(re.findall(r'run="([^"]*)"', _http(url)))
    assert not wrong, f"after 45 s, for run {cluster['run']} (runs seen: {runs}): {wrong}"
    # what finds the straggler: worker 1 computes longest, worker 0 waits for it
    w = {int(dict(t)["worker"]): v for (n, t), v in got.items() if n == "ray_pdml_worker_compute_seconds"}
    assert w[1] > w[0]
    assert got[("ray_pdml_reports_received_total", frozenset())] == 60
    assert got[("ray_pdml_reports_rejected_total", frozenset({("field", "compute_s")}))] == 1
    assert re.fullmatch(rf"{RUN}-[0-9a-f]{{8}}", cluster["run"])


def _prom_query(base: str, query: str) -> list[dict]:
    body = json.loads(_http(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus is not installed (scripts/install_test_tools.sh installs Debian's package)")
def test_prometheus_scrapes_the_series_with_rays_generated_config(cluster, tmp_path):
    session: Path = cluster["session"]
    config = session / "metrics" / "prometheus" / "prometheus.yml"
    discovery = session / "prom_metrics_service_discovery.json"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (config.exists() and discovery.exists()):
        time.sleep(0.5)
    assert config.exists(), f"Ray wrote no Prometheus config at {config}"
    assert str(discovery) in config.read_text()  # Ray's config discovers this session's nodes
    # the dashboard rewrites the discovery file periodically: the node's metrics port may come later
    deadline = time.monotonic() + 30
    while True:
        try:
            targets = [t for group in json.loads(discovery.read_text()) for t in group["targets"]]
        except (OSError, ValueError):  # caught mid-rewrite
            targets = []
        if any(t.endswith(f":{cluster['port']}") for t in targets) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert any(t.endswith(f":{cluster['port']}") for t in targets), targets
    port = _free_port()
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    run = cluster["run"]
    try:
        # Ray's config scrapes every 10 s: the first scrape lands within ~10 s of the start
        deadline = time.monotonic() + 45
        received: list[dict] = []
        while time.monotonic() < deadline:
            try:
                received = _prom_query(base, f'ray_pdml_reports_received_total{{run="{run}"}}')
                sizes = _prom_query(base, f'ray_pdml_batch_size_samples{{run="{run}"}}')
                if received and len(sizes) == workload.NUM_WORKERS:
                    break
            except OSError:
                pass  # not listening yet
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(1)
        assert received, f"Prometheus had no pdml series within 45 s: {(tmp_path / 'prometheus.log').read_text()[-2000:]}"
        assert float(received[0]["value"][1]) == 60
        expected = _expected()
        for r in sizes:
            labels = r["metric"]
            key = ("ray_pdml_batch_size_samples", frozenset({("worker", labels["worker"]),
                                                              ("accelerator_type", labels["accelerator_type"])}))
            assert float(r["value"][1]) == expected[key]
        # a dashboard query: the straggler's wait against the others', by worker
        waits = {r["metric"]["worker"]: float(r["value"][1])
                 for r in _prom_query(base, f'ray_pdml_worker_wait_seconds{{run="{run}"}}')}
        assert waits == pytest.approx({"0": workload.WAIT_S[0], "1": workload.WAIT_S[1]}, rel=1e-3)
        up = {r["metric"]["instance"]: r["value"][1] for r in _prom_query(base, 'up{job="ray"}')}
        assert [v for i, v in up.items() if i.endswith(f":{cluster['port']}")] == ["1"], up  # the node's endpoint
        # every query of the Grafana dashboard is valid PromQL, and the gauges' panels have data
        from pdml_ray.dashboards import load_dashboard

        empty = []
        for panel in load_dashboard()["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$run", run).replace("$__rate_interval", "1m")
                data = _prom_query(base, expr)  # valid PromQL, whatever the panel
                runtime = "ray_pdml_pipeline_" in expr or "ray_pdml_straggler_" in expr  # another run's series
                if not data and not runtime and "rate(" not in expr and "increase(" not in expr:
                    empty.append(expr)  # (rates need two scrapes: not checked for data)
        assert not empty, empty
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_a_pipeline_runtime_exports_its_measured_bubble_from_the_driver(cluster):
    """The runtimes' run records are exported by the driver process (not an actor): two steps of a
    2-stage pipeline, then its series on the node's endpoint, with the values the runtime holds."""
    import torch
    from torch import nn

    from pdml_ray.pipeline.registry import make_schedule
    from pdml_ray.runtime.pipeline import PipelineRuntime

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    with PipelineRuntime(model, 2, 1, nn.MSELoss(), num_cpus_per_actor=0.25, metrics_name="prom-pipeline") as rt:
        scheduler = make_schedule("1f1b", stages=2, replicas=1, microbatches=4)
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        for step in range(2):
            rt.run_step(scheduler, x, y, step)
        run = rt._gauges.run
        url = f"http://127.0.0.1:{cluster['port']}/metrics"
        pattern = re.compile(rf'^(ray_pdml_pipeline_\w+?)(?:_total)?\{{([^}}]*run="{re.escape(run)}"[^}}]*)\}} (\S+)$')
        want = {"ray_pdml_pipeline_steps": 2.0, "ray_pdml_pipeline_bubble_ratio": rt.stats.bubble,
                "ray_pdml_pipeline_step_seconds": rt.stats.step_s}

        def off(got):  # a changed gauge is set at most every half report interval: the newest follows
            return [n for n, v in want.items() if n not in got or not math.isclose(got[n], v, rel_tol=1e-3)]

        deadline, got = time.monotonic() + 45, {}
        while time.monotonic() < deadline:
            got = {m.group(1): float(m.group(3)) for line in _http(url).splitlines() if (m := pattern.match(line))}
            if not off(got):
                break
            time.sleep(1)
        assert not off(got), (got, want)
        assert 0.0 <= got["ray_pdml_pipeline_bubble_ratio"] <= 1.0
        assert re.fullmatch(r"prom-pipeline-[0-9a-f]{8}", run)
