"""Metric names follow Prometheus' conventions, every priority axis exports its figures, and the Grafana
dashboard queries only names the code exports; installing it into a session directory works."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
import time

import numpy as np

import pytest

from pdml_ray.dashboards import (DASHBOARD_FILE, grafana_dashboard_dir, install_grafana_dashboard,
                                 load_dashboard, workload)
from pdml_ray.pipeline.plan import Kind, Measurement
from pdml_ray.pipeline.stats import PipelineRunStats, bubble_ratio
from pdml_ray.scheduler import Scheduler, SchedulerStats
from pdml_ray.stragglers.stats import StragglerRunStats

UNITS = ("_seconds", "_samples", "_samples_per_second", "_ratio", "_bytes", "_total", "_epochs", "_step",
         "_version", "_priority", "_weight")
"""What a name may end in: a unit, ``_total`` (a count), or a unitless quantity named for what it is
(a step number, a version, a priority score, a term weight)."""


def _stats() -> SchedulerStats:
    s = Scheduler(workload.config(), workload.NUM_WORKERS)
    workload.replay(s)
    return dataclasses.replace(s.stats(), process_cpu_s=1.5)  # the actor shell sets it


def _names(stats) -> dict[str, list]:
    out: dict[str, list] = {}
    for g in stats.gauges():
        out.setdefault(g.name, []).append(g)
    return out


def _runtime_stats():
    """The pipeline and straggler runtimes' run records after a step each."""
    pipeline = PipelineRunStats()
    pipeline.observe("osprey", 0.5, [Measurement(0, 0, Kind.FORWARD, 0, 0.2)], 2)
    stragglers = StragglerRunStats("gc-cr")
    stragglers.observe(0.25, dropped=1, dead=0)
    return pipeline, stragglers


@pytest.mark.parametrize("source", ["scheduler", "pipeline", "stragglers"])
def test_names_follow_prometheus_conventions(source):
    names = _names({"scheduler": _stats, "pipeline": lambda: _runtime_stats()[0],
                    "stragglers": lambda: _runtime_stats()[1]}[source]())
    for name, series in names.items():
        assert re.fullmatch(r"pdml_[a-z0-9_]+", name), name
        assert name.endswith(UNITS), f"{name}: say its unit (_seconds, _ratio, ...) or _total for a count"
        assert not name.endswith("_s") and "_total_" not in name, name
        keys = {tuple(k for k, _ in g.tags) for g in series}
        assert len(keys) == 1, f"{name}: one tag set per name, got {keys}"  # a Ray metric has fixed tag keys
        assert all(g.description for g in series)
    if source != "scheduler":
        return
    counts = {n for n in names if n.endswith("_total")}
    assert {"pdml_reports_received_total", "pdml_reports_rejected_total", "pdml_scheduler_decision_requests_total",
            "pdml_scheduler_decision_seconds_total", "pdml_scheduler_cpu_seconds_total",
            "pdml_sample_recalibrations_total", "pdml_gradient_collapse_resets_total"} <= counts


def test_what_finds_a_straggler_is_exported_per_worker_with_the_reported_times():
    stats = _stats()
    by = {(g.name, g.tags): g.value for g in stats.gauges()}
    for w, accel in enumerate(("H100", "A100")):
        tags = (("worker", str(w)), ("accelerator_type", accel))
        assert by[("pdml_worker_compute_seconds", tags)] == pytest.approx(workload.COMPUTE_S[w])
        assert by[("pdml_worker_wait_seconds", tags)] == pytest.approx(workload.WAIT_S[w])
        assert by[("pdml_worker_step_seconds", tags)] == pytest.approx(workload.STEP_S[w])
        assert by[("pdml_worker_last_step", tags)] == 29
        assert ("pdml_batch_size_samples", tags) in by and ("pdml_worker_rate_samples_per_second", tags) in by
    assert by[("pdml_reports_rejected_total", (("field", "compute_s"),))] == 1
    assert by[("pdml_reports_received_total", ())] == 60 and by[("pdml_last_step", ())] == 29


def test_newer_derivers_and_the_decision_latency_are_exported():
    stats = _stats()
    names = _names(stats)
    assert {"pdml_gradient_priority", "pdml_gradient_term_weight", "pdml_gradient_k_ratio",
            "pdml_sample_normalized_ess_ratio", "pdml_sample_seen_ratio"} <= set(names)
    versions = {dict(g.tags)["axis"]: g.value for g in names["pdml_decision_version"]}
    assert set(versions) == {"node", "sample", "gradient"} and versions == dict(stats.versions)
    assert stats.decision_requests == 6 and stats.decision_s > 0
    assert names["pdml_scheduler_decision_requests_total"][0].value == 6
    latency = names["pdml_scheduler_decision_latency_seconds"][0].value
    assert 0 < latency == stats.last_decision_s < 5


def test_the_runtimes_export_the_measured_bubble_and_the_dropped_results():
    pipeline = PipelineRunStats()
    # 2 replicas for 1.0 s with 1.5 s of actions between them: a quarter of their time idle
    acts = [Measurement(0, 0, Kind.FORWARD, 0, 0.5), Measurement(1, 0, Kind.FORWARD, 0, 0.4),
            Measurement(1, 0, Kind.BACKWARD, 0, 0.3), Measurement(0, 0, Kind.BACKWARD, 0, 0.3)]
    pipeline.observe("1f1b", 1.0, acts, 2)
    pipeline.observe("1f1b", 2.0, acts, 1, deaths=1, reruns=3)  # one replica left: 1.5 of 2.0 busy
    by = {g.name: g for g in pipeline.gauges()}
    assert by["pdml_pipeline_bubble_ratio"].value == pytest.approx(0.25)
    assert by["pdml_pipeline_bubble_ratio"].tags == (("schedule", "1f1b"), ("emulated", "none"))
    assert by["pdml_pipeline_step_seconds"].value == 2.0 and by["pdml_pipeline_steps_total"].value == 2
    assert by["pdml_pipeline_replica_deaths_total"].value == 1 and by["pdml_pipeline_rerun_microbatches_total"].value == 3
    assert bubble_ratio(acts, 0.5, 1) == 0.0 and math.isnan(bubble_ratio(acts, 0.0, 2))  # clipped; no wall time
    stragglers = StragglerRunStats("ignore-stragglers")
    stragglers.observe(0.3, dropped=1, dead=0)
    stragglers.observe(0.2, dropped=2, dead=1)
    by = {g.name: g.value for g in stragglers.gauges()}
    assert by == {"pdml_straggler_results_dropped_total": 3, "pdml_straggler_step_seconds": 0.2,
                  "pdml_straggler_steps_total": 2, "pdml_straggler_worker_deaths_total": 1}


def test_recent_worker_times_are_means_over_the_newest_rows_and_leave_out_silent_workers():
    from pdml_ray.scheduler_stats import recent_worker_times

    nan = float("nan")
    rows = [[0, 3, 10, 0.1, 0.2, 0.5, 0, 1], [1, 3, 10, 0.3, 0.0, nan, 0, 1], [0, 4, 10, 0.3, 0.4, 0.7, 0, 1]]
    times = recent_worker_times(np.array(rows), 3)
    assert [t.worker for t in times] == [0, 1]
    assert times[0].compute_s == pytest.approx(0.2) and times[0].wait_s == pytest.approx(0.3)
    assert times[0].step_s == pytest.approx(0.6) and times[0].last_step == 4
    assert math.isnan(times[1].step_s) and times[1].last_step == 3
    assert recent_worker_times(np.empty((0, 8)), 3) == ()


def test_the_dashboard_queries_only_exported_names():
    dashboard = load_dashboard()
    json.dumps(dashboard)  # a plain JSON model
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    queried = {n for e in exprs for n in re.findall(r"\bray_pdml_[a-z0-9_]+", e)}
    from pdml_ray.metrics import prometheus_name

    exported = {prometheus_name(n) for stats in (_stats(), *_runtime_stats()) for n in _names(stats)}
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, f"queried but never exported: {sorted(queried - exported)}"
    # and it shows everything that finds a straggler and every axis
    assert {"ray_pdml_worker_step_seconds", "ray_pdml_worker_compute_seconds", "ray_pdml_worker_wait_seconds",
            "ray_pdml_gradient_priority", "ray_pdml_scheduler_decision_latency_seconds",
            "ray_pdml_pipeline_bubble_ratio", "ray_pdml_straggler_results_dropped_total"} <= queried
    for expr in exprs:  # counters are read through rate()/increase(), never raw
        for name in re.findall(r"\bray_pdml_[a-z0-9_]+_total\b", expr):
            assert re.search(rf"(rate|increase)\({name}\b", expr), expr
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"]


def test_installing_the_dashboard_into_a_session_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR", raising=False)
    monkeypatch.delenv("RAY_METRICS_OUTPUT_ROOT", raising=False)
    session = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    ray_dashboards = session / "metrics" / "grafana" / "dashboards"
    ray_dashboards.mkdir(parents=True)
    (ray_dashboards / "default_grafana_dashboard.json").write_text("{}")
    path = install_grafana_dashboard(session)
    assert path == ray_dashboards / DASHBOARD_FILE == grafana_dashboard_dir(session) / DASHBOARD_FILE
    assert json.loads(path.read_text()) == load_dashboard()
    assert sorted(p.name for p in ray_dashboards.iterdir()) == [  # nothing half-written left behind
        "default_grafana_dashboard.json", DASHBOARD_FILE]
    assert install_grafana_dashboard(str(session)) == path  # again: replaced
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR", str(other))  # Ray's own override
    assert install_grafana_dashboard(session) == other / DASHBOARD_FILE


def test_export_sets_only_changed_series_and_counts_as_increments():
    """Real ray.util.metrics objects; without a cluster Ray records them in this process only."""
    from pdml_ray.metrics import PriorityGauges, is_counter

    s = Scheduler(workload.config(), workload.NUM_WORKERS)
    workload.replay(s, steps=10)
    exporter = PriorityGauges("pdml-x", run_id="abcd1234")
    assert exporter.run == "pdml-x-abcd1234" and PriorityGauges("pdml-x").run != PriorityGauges("pdml-x").run
    stats = s.stats()
    nonzero = [g for g in stats.gauges() if not (is_counter(g.name) and g.value == 0)]
    assert exporter.export(stats) == len(nonzero) > 20  # a counter at 0 has nothing to add yet
    assert exporter.export(stats) == 0  # nothing changed: nothing is set again
    counter = exporter._metrics["pdml_reports_received_total"]
    assert type(counter).__name__ == "Counter" and counter._name == "pdml_reports_received"  # Ray adds _total
    assert type(exporter._metrics["pdml_worker_wait_seconds"]).__name__ == "Gauge"
    workload.replay(s, steps=10)  # 20 more reports, a new rejected one; the times are the same
    touched = exporter.export(s.stats())
    assert 0 < touched < len(nonzero)
    assert exporter._last[("pdml_reports_received_total", ())] == 40
    assert exporter._last[("pdml_reports_rejected_total", (("field", "compute_s"),))] == 2
    exporter.close()


def test_gauges_are_set_again_within_rays_report_interval_even_unchanged():
    """Ray 2.60 drops a gauge series not set within two report intervals: unchanged ones are refreshed."""
    from pdml_ray.metrics import PriorityGauges, is_counter

    s = Scheduler(workload.config(), workload.NUM_WORKERS)
    workload.replay(s, steps=10)
    stats = s.stats()
    gauges = [g for g in stats.gauges() if not is_counter(g.name) and g.value == g.value]
    exporter = PriorityGauges("pdml-x", run_id="0", refresh_s=0.0)  # 0: every series is due, no thread
    exporter.export(stats)
    assert exporter.refresh() == len(gauges)  # the gauges, never the counters
    assert exporter.export(stats) == len(gauges)  # an export refreshes the due ones too
    assert exporter._refresher is None
    held = PriorityGauges("pdml-z", run_id="2", refresh_s=100.0, min_set_s=100.0)  # no thread wakes in time
    held.export(stats)
    workload.replay(s, steps=10)  # the times and the counts change
    later = s.stats()
    touched = held.export(later)
    assert held._held and not any(is_counter(name) for name, _ in held._held)
    grew = sum(1 for g in later.gauges() if is_counter(g.name) and g.value > 0 and
               g.value != dict(((x.name, x.tags), x.value) for x in stats.gauges()).get((g.name, g.tags)))
    assert touched == grew > 0  # only the counters that grew: the changed gauges are held
    set_before = dict(held._set_at)
    held.min_set_s = 0.0  # the held changes are due now
    n = len(held._held)
    assert held.refresh() == n and not held._held
    assert sum(held._set_at[k] != set_before[k] for k in set_before) == n
    held.close()
    timed = PriorityGauges("pdml-y", run_id="1", refresh_s=0.05)
    timed.export(stats)
    assert timed.export(stats) == 0  # within the refresh period: nothing to do
    assert timed._refresher is not None and timed._refresher.daemon
    time.sleep(0.3)  # the thread has re-set them meanwhile
    assert min(timed._set_at.values()) > time.monotonic() - 0.2
    timed.close()
    assert not timed._refresher.is_alive()  # joined: no thread left inside Ray's native code at exit
    timed.export(stats)
    assert not timed._refresher.is_alive()  # an export after close starts no new thread


def test_gauges_left_open_are_closed_at_interpreter_exit(tmp_path):
    """A refresh thread still running at exit would be inside Ray's native Gauge.set while the
    interpreter finalizes: the atexit hook stops and joins it first."""
    script = tmp_path / "left_open.py"
    script.write_text(
        "import atexit\n"
        "atexit.register(lambda: print('alive after close:', g._refresher.is_alive(), flush=True))  # runs last\n"
        "from pdml_ray.metrics import PriorityGauges\n"
        "from pdml_ray.priority.base import GaugeValue\n"
        "class Stats:\n"
        "    def gauges(self):\n"
        "        return [GaugeValue('pdml_x_seconds', 'x', 1.0)]\n"
        "g = PriorityGauges('pdml-exit', run_id='0', refresh_s=0.01, min_set_s=0.01, source=Stats)\n"
        "g.export(Stats())\n"
        "print('alive:', g._refresher.is_alive(), flush=True)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["alive:", "True", "alive", "after", "close:", "False"], out.stdout


def test_every_series_carries_ray_trains_run_name_and_per_worker_ones_the_world_rank(monkeypatch):
    """The labels Ray Train v2 puts on its own series (ray.train.v2 metrics), so its dashboard's run and
    rank filters select pdml-ray's too. Ray's Gauge/Counter are replaced by recorders (no Ray started)."""
    import ray.util.metrics as ray_metrics
    from ray.train.v2._internal.metrics.base import RUN_NAME_TAG_KEY
    from ray.train.v2._internal.metrics.worker import WORKER_WORLD_RANK_TAG_KEY

    from pdml_ray.metrics import PriorityGauges

    created, recorded = {}, []

    class Recorder:
        def __init__(self, name, description="", tag_keys=()):
            created[name] = tuple(tag_keys)

        def set(self, value, tags):
            recorded.append(tags)

        inc = set

    monkeypatch.setattr(ray_metrics, "Gauge", Recorder)
    monkeypatch.setattr(ray_metrics, "Counter", Recorder)
    gauges = PriorityGauges("pdml-myrun", run_id="1a2b3c4d", refresh_s=0.0, min_set_s=0.0, train_run_name="myrun")
    assert gauges.export(_stats()) > 0
    assert created and all(RUN_NAME_TAG_KEY in keys for keys in created.values())
    assert all(tags[RUN_NAME_TAG_KEY] == "myrun" and tags["run"] == "pdml-myrun-1a2b3c4d" for tags in recorded)
    per_worker = [tags for tags in recorded if "worker" in tags]
    assert per_worker and all(tags[WORKER_WORLD_RANK_TAG_KEY] == tags["worker"] for tags in per_worker)
    assert {tags[WORKER_WORLD_RANK_TAG_KEY] for tags in per_worker} == {"0", "1"}
    assert all(WORKER_WORLD_RANK_TAG_KEY not in tags for tags in recorded if "worker" not in tags)
