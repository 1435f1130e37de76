"""``pdml-ray bench scheduler``: does the scheduler actor hold the load of a large cluster?

Simulated workers (``--workers``, default 256) report to a real scheduler actor through the real
worker-side client (``SchedulerClient`` over ``RaySchedulerTransport``: fire-and-forget calls, at most
``MAX_REPORT_CALLS_IN_FLIGHT`` pending per worker, later reports coalesced into the next call), from a
few load-generator actors. A warm-up of paced load (20 s, quick 5 s: the actor's buffers reach their
working size; its memory before it is reported as ``rss_mb_cold``), then three phases, one run:

1. **paced** (``--hz``, default 10 steps/s per worker, reports flushed every ``decision_interval``
   steps as the training client flushes them): a prober plays rank 0 and asks for a decision bundle
   every 100 ms, timing each round trip while reports flow; the actor's resident memory is read at
   the start, every ~10 s and at the end of the phase (``--duration`` seconds, default 60, quick 15):
   the series shows whether memory grows or levels off. The actor times its side of each decision
   (``decision_profile_paced``: the wait for its state lock, ``Scheduler.bundle``, the decision
   thread's CPU, and the garbage collector's pauses), to tell its own time from Ray's and the machine's.
2. **saturated**: every simulated worker reports as fast as its client lets it; the sustained rate is
   the scheduler's own count of accepted reports over the phase.
3. **plain class**: the same reports straight into an in-process ``Scheduler`` (no Ray), for reference.

Each mode of reporting (``--report-via``: one call per worker, or per simulated node of ``--per-node``
workers through the node relay's real ``ReportGather``) runs phases 1-2 against a fresh actor; before
them a fresh actor measures Ray's own cost (idle, per call); ``--workers 256,1024`` runs each size in
turn, one record per size (``sizes``; targets per size: issue 27's at 1,024 workers). CPU per report (the
actor's, and the in-process class's) is less sensitive to the machine's load than rates and latencies.

The workers are simulated (their reports are generated, not measured), the actor, Ray's calls and the
scheduler's work are real. The load generators share the machine's cores with the actor (their CPU is
reported beside the actor's).
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import numpy as np

DESCRIPTION = "the scheduler actor under a large simulated cluster's reports: throughput, decision latency, memory"
SIMULATED_NOTE = ("workers are SIMULATED (generated reports, no training); the scheduler actor, Ray's calls and "
                  "the worker-side client are real")
TARGETS = {"reports_per_s": 20_000, "decision_latency_p99_s": 0.020, "rss_growth_fraction": 0.05,
           "plain_cpu_per_report_us": 10.0, "plain_bundle_cpu_s": 0.005}
"""The last two are machine-independent (CPU time of the in-process ``Scheduler``, no Ray): CPU per
report in node-sized calls, and a bundle's CPU (issue 27 sets it at 1,024 workers)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", default="256",
                        help="simulated workers, or sizes one after the other: 256,1024 (default 256)")
    parser.add_argument("--hz", type=float, default=10.0, help="steps per second per worker in the paced phase (default 10)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of the paced phase (default 60, quick 15)")
    parser.add_argument("--generators", type=int, default=2, help="load-generator actors (default 2)")
    parser.add_argument("--report-via", choices=("worker", "node", "both"), default="both",
                        help="one report call per worker, per simulated node (the relay's gather), or both, one "
                             "after the other against fresh actors (default both)")
    parser.add_argument("--per-node", type=int, default=8, help="simulated workers per simulated node (default 8)")


def _config(workers: int, name: str) -> Any:
    from pdml_ray.config import NodePriorityConfig, PDMLConfig

    return PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=max(workers * 64, workers)),
                      scheduler_name=name, namespace="pdml-bench")


def _reports(worker_ids: range, step: int, rng: np.random.Generator) -> dict[int, Any]:
    from pdml_ray.decisions import WorkerReport

    noise = rng.normal(1.0, 0.05, len(worker_ids))
    return {w: WorkerReport(worker_id=w, step=step, samples=64, compute_s=0.1 * float(max(n, 0.5)), step_s=0.11,
                            loss=1.0) for w, n in zip(worker_ids, noise)}


class LoadGenerator:
    """Some simulated workers: reports every step, flushed every ``interval`` steps, at ``hz`` steps per
    second (0: as fast as the clients let them). ``per_node`` 0: each worker has its own real
    ``SchedulerClient`` (``report_via="worker"``); else every ``per_node`` consecutive workers make a
    simulated node whose flushes go through the relay's real ``ReportGather`` and its client
    (``report_via="node"``: one call per node per flush; the worker-to-relay hop, a Ray call on the
    node, is an in-process call here)."""

    def __init__(self, name: str, namespace: str, worker_ids: range, interval: int, seed: int, per_node: int = 0) -> None:
        from pdml_ray.actors.report_relay import RELAY_WAIT_S
        from pdml_ray.actors.scheduler_transport import RaySchedulerTransport
        from pdml_ray.client import ReportGather, SchedulerClient

        self.worker_ids, self.interval = worker_ids, interval
        self.clients = {w: SchedulerClient(RaySchedulerTransport(name, namespace)) for w in worker_ids} if not per_node else {}
        nodes = [worker_ids[i:i + per_node] for i in range(0, len(worker_ids), per_node)] if per_node else []
        self.gathers = [ReportGather(SchedulerClient(RaySchedulerTransport(name, namespace)), len(n), RELAY_WAIT_S)
                        for n in nodes]
        self.node_of = {w: self.gathers[i] for i, n in enumerate(nodes) for w in n}
        self.pending: dict[int, list[Any]] = {w: [] for w in worker_ids}
        self.rng = np.random.default_rng(seed)
        self.step = 0

    def run(self, seconds: float, hz: float) -> dict[str, float]:
        from pdml_ray.client import PackedReports

        end = time.monotonic() + seconds
        t_next = t0 = time.monotonic()
        cpu0 = time.process_time()
        sent, flush_s, flushes = 0, 0.0, 0
        while time.monotonic() < end:
            for w, r in _reports(self.worker_ids, self.step, self.rng).items():
                self.pending[w].append(r)
            self.step += 1
            if self.step % self.interval == 0:
                for w in self.worker_ids:
                    f0 = time.perf_counter()  # what a worker's flush costs its step: packing plus one call
                    if self.gathers:
                        self.node_of[w].add(PackedReports.pack(self.pending[w]).rows)
                    else:
                        self.clients[w].report(self.pending[w])
                    flush_s += time.perf_counter() - f0
                    flushes += 1
                    sent += len(self.pending[w])
                    self.pending[w] = []
            for gather in self.gathers:  # the relay's timer: late rounds, and what waited for a call slot
                gather.tick()
            if hz > 0:
                t_next += 1.0 / hz
                time.sleep(max(0.0, t_next - time.monotonic()))
        clients = list(self.clients.values()) + [g.client for g in self.gathers]
        return {"generated": sent, "dropped": sum(c.reports_dropped for c in clients),
                "coalesced": sum(c.reports_coalesced for c in clients), "flush_s": flush_s, "flushes": flushes,
                "cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - t0,
                "rounds_late": sum(g.rounds_late for g in self.gathers)}


def _probe(handle: Any, seconds: float, workers: int, interval: int) -> list[float]:
    """Play rank 0: ask for a bundle every 100 ms, time each round trip, adopt what comes."""
    import ray

    from pdml_ray.decisions import Boundary

    latencies, step, end = [], 0, time.monotonic() + seconds
    sizes, versions = (64,) * workers, {"node": 0}
    while time.monotonic() < end:
        t0 = time.perf_counter()
        bundle = ray.get(handle.bundle.remote(Boundary(step, interval, sizes), versions))
        latencies.append(time.perf_counter() - t0)
        for name, decision in bundle.decisions.items():  # adopt, as rank 0 does
            versions[name] = decision.version
            sizes = getattr(decision, "batch_sizes", sizes)
        step += interval
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - t0)))
    return latencies


def _plain_class(workers: int, interval: int, seconds: float, seed: int, per_node: int) -> dict[str, float]:
    """The in-process ``Scheduler``: reports/s and CPU per report of ``report`` (given ``PackedReports``,
    one call per ``per_node`` workers' flush as the actor gets them in node mode), and the wall and CPU
    time of ``bundle`` (machine-independent figures: no Ray, no other process). The calls are handed over
    as built, not through a pickle round trip: Ray's decode of a call's arguments is Ray's per-call cost,
    in the actor-path figures and ``_ray_costs`` (runs before 2026-12-03 counted it here: PackedReports
    rows decode at ~0.4 us a report)."""
    from pdml_ray.client import PackedReports
    from pdml_ray.decisions import Boundary
    from pdml_ray.scheduler import Scheduler

    scheduler = Scheduler(_config(workers, "plain"), workers)
    rng = np.random.default_rng(seed)
    step, ingested, busy, cpu, bundle_s, bundle_cpu_s = 0, 0, 0.0, 0.0, [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        batch = [r for s in range(step, step + interval) for r in _reports(range(workers), s, rng).values()]
        calls = [PackedReports.pack([r for w in range(n, min(n + per_node, workers)) for r in batch[w::workers]])
                 for n in range(0, workers, per_node)]
        t0, c0 = time.perf_counter(), time.process_time()
        for call in calls:  # one call per node, as the actor gets them
            scheduler.report(call)
        busy += time.perf_counter() - t0
        cpu += time.process_time() - c0
        ingested += len(batch)
        step += interval
        t0, c0 = time.perf_counter(), time.process_time()
        scheduler.bundle(Boundary(step, interval, (64,) * workers), {"node": 0})
        bundle_s.append(time.perf_counter() - t0)
        bundle_cpu_s.append(time.process_time() - c0)
    return {"reports_per_s": ingested / busy, "cpu_per_report_us": cpu / ingested * 1e6, "reports_per_call": per_node * interval,
            "bundle_p50_s": float(np.percentile(bundle_s, 50)), "bundle_p99_s": float(np.percentile(bundle_s, 99)),
            "bundle_cpu_p50_s": float(np.percentile(bundle_cpu_s, 50)), "bundle_cpu_p99_s": float(np.percentile(bundle_cpu_s, 99))}


def _ray_costs(workers: int, idle_s: float, calls: int) -> dict[str, float]:
    """Ray's own cost in a fresh scheduler actor, apart from pdml-ray's work: its CPU while idle (no
    calls for ``idle_s``: Ray's threads, the export and snapshot timers) and per call (``calls`` calls
    sent at once, each a ``ping`` or a ``report`` of no reports: Ray's per-call work plus the actor's
    lock and bookkeeping around a report, without ingesting anything)."""
    import ray

    from pdml_ray.actors.scheduler import create_scheduler
    from pdml_ray.client import PackedReports

    handle = create_scheduler(_config(workers, f"pdml-bench-ray-costs-{time.time_ns()}"), workers)
    ray.get([handle.register.remote(w, "CPU") for w in range(workers)])
    time.sleep(1.0)  # the registration's export and Ray's start-up work are done

    def cpu() -> float:
        return ray.get(handle.stats.remote()).process_cpu_s

    c0, t0 = cpu(), time.monotonic()
    time.sleep(idle_s)
    idle = (cpu() - c0) / (time.monotonic() - t0)
    c0 = cpu()
    ray.get([handle.ping.remote() for _ in range(calls)])
    ping = (cpu() - c0) / calls
    c0 = cpu()
    ray.get([handle.report.remote(PackedReports([])) for _ in range(calls)])
    report = (cpu() - c0) / calls
    ray.get(handle.close.remote())
    ray.kill(handle)
    return {"idle_cpu_fraction": idle, "idle_cpu_ms_per_s": idle * 1e3, "cpu_per_ping_call_us": ping * 1e6,
            "cpu_per_empty_report_call_us": report * 1e6}


def _decision_profile(raw: dict[str, Any], seconds: float, latencies: list[float]) -> dict[str, float | None]:
    """The actor's side of a phase's decisions (``MeteredScheduler.decision_profile``): p50 / p99 of the
    wait for its state lock, of the time inside ``Scheduler.bundle``, of the decision thread's CPU and of
    the rest of each round trip (``latencies``, the prober's, one per decision in the same order: Ray's
    calls and the wait for a CPU), in seconds (None without a decision); and the garbage collector's
    pauses over the phase (``seconds`` long): by generation, collections per second and the longest (s);
    in all, seconds of pause per second and the longest."""
    out: dict[str, float | None] = {"decisions": len(raw["bundle_s"])}
    outside = ([t - a - b for t, a, b in zip(latencies, raw["lock_wait_s"], raw["bundle_s"])]
               if len(latencies) == len(raw["bundle_s"]) else [])
    for key, values in (("lock_wait_s", raw["lock_wait_s"]), ("bundle_s", raw["bundle_s"]),
                        ("thread_cpu_s", raw["thread_cpu_s"]), ("outside_actor_s", outside)):
        for q in (50, 99):
            out[f"{key[:-2]}_p{q}_s"] = float(np.percentile(values, q)) if values else None
    for generation in (0, 1, 2):
        pauses = [s for g, s in raw["gc_pauses"] if g == generation]
        out[f"gc{generation}_per_s"] = len(pauses) / seconds
        out[f"gc{generation}_max_s"] = max(pauses, default=0.0)
    out["gc_s_per_s"] = sum(s for _, s in raw["gc_pauses"]) / seconds
    out["gc_max_s"] = max((s for _, s in raw["gc_pauses"]), default=0.0)
    out["gc_frozen_objects"] = raw["gc_frozen_objects"]
    return out


def _export_interval() -> float:
    from pdml_ray.actors.scheduler import EXPORT_INTERVAL_S

    return EXPORT_INTERVAL_S


def _measure(args: argparse.Namespace, per_node: int, interval: int, duration: float, warmup_s: float,
             saturate_s: float) -> dict[str, Any]:
    """One mode's three Ray phases against a fresh scheduler actor (the paced and saturated figures)."""
    import ray

    from pdml_ray.actors.scheduler import create_scheduler

    name = f"pdml-bench-scheduler-{time.time_ns()}"
    handle = create_scheduler(_config(args.workers, name), args.workers)
    ray.get([handle.register.remote(w, "CPU") for w in range(args.workers)])
    generator: Any = ray.remote(num_cpus=0)(LoadGenerator)
    share = -(-args.workers // args.generators)
    if per_node:  # whole simulated nodes per generator
        share = -(-share // per_node) * per_node
    fleets: list[Any] = [generator.remote(name, "pdml-bench", range(i, min(i + share, args.workers)), interval,
                                          args.seed + i, per_node) for i in range(0, args.workers, share)]
    cpu: list[float] = []

    def received() -> tuple[float, int]:
        stats = ray.get(handle.stats.remote())
        cpu.append(stats.process_cpu_s)
        return time.monotonic(), stats.reports_received

    rss_cold = ray.get(handle.memory_rss_mb.remote())
    print(f"warm-up: paced load for {warmup_s:g} s (the actor's one-time allocations) ...", flush=True)
    ray.get([f.run.remote(warmup_s, args.hz) for f in fleets])
    print(f"phase 1/3: paced load for {duration:g} s, probing decision latency ...", flush=True)
    rss_series = [ray.get(handle.memory_rss_mb.remote())]
    ray.get(handle.decision_profile.remote())  # from here on: the warm-up's decisions are not the paced ones
    t0, n0 = received()
    runs = [f.run.remote(duration, args.hz) for f in fleets]
    latencies: list[float] = []
    while time.monotonic() - t0 < duration - 0.05:  # probe in slices, reading the actor's memory between
        latencies += _probe(handle, min(10.0, duration - (time.monotonic() - t0)), args.workers, interval)
        rss_series.append(ray.get(handle.memory_rss_mb.remote()))
    paced = ray.get(runs)
    t1, n1 = received()
    profile = _decision_profile(ray.get(handle.decision_profile.remote()), t1 - t0, latencies)
    print(f"phase 2/3: saturated for {saturate_s:g} s ...", flush=True)
    runs = [f.run.remote(saturate_s, 0.0) for f in fleets]
    saturated_latencies = _probe(handle, saturate_s, args.workers, interval)
    saturated = ray.get(runs)
    t3, n3 = received()
    time.sleep(1.0)  # what was in flight when the generators stopped
    t4, n4 = received()
    snapshots = ray.get(handle.snapshot_info.remote())
    ray.get(handle.close.remote())
    ray.kill(handle)
    for f in fleets:
        ray.kill(f)
    rss_start, rss_end = rss_series[0], rss_series[-1]
    return {
        "offered_reports_per_s": sum(p["generated"] for p in paced) / duration,
        "paced_reports_per_s": (n1 - n0) / (t1 - t0),
        "reports_per_s": (n4 - n1) / (t4 - t1),
        "decision_latency_p50_s": float(np.percentile(latencies, 50)),
        "decision_latency_p99_s": float(np.percentile(latencies, 99)),
        "saturated_decision_latency_p99_s": float(np.percentile(saturated_latencies, 99)),
        "decision_profile_paced": profile,
        "decision_probes": len(latencies),
        "actor_cpu_fraction_paced": (cpu[1] - cpu[0]) / (t1 - t0),
        "actor_cpu_fraction_saturated": (cpu[3] - cpu[1]) / (t4 - t1),
        # CPU seconds per report are less sensitive to the machine's load than rates
        "actor_cpu_per_report_us_paced": (cpu[1] - cpu[0]) / max(n1 - n0, 1) * 1e6,
        "actor_cpu_per_report_us_saturated": (cpu[3] - cpu[1]) / max(n4 - n1, 1) * 1e6,
        "generators_cpu_fraction_paced": sum(p["cpu_s"] for p in paced) / duration,
        "generators_cpu_fraction_saturated": sum(p["cpu_s"] for p in saturated) / saturate_s,
        "worker_flush_us": sum(p["flush_s"] for p in paced) / max(sum(p["flushes"] for p in paced), 1) * 1e6,
        "rounds_late": sum(p["rounds_late"] for p in paced + saturated),
        "rss_mb_start": rss_start, "rss_mb_end": rss_end, "rss_mb_series": rss_series,
        "rss_mb_cold": rss_cold, "snapshots": snapshots,
        "reports_dropped": sum(p["dropped"] for p in paced + saturated),
        "paced_reports_dropped": sum(p["dropped"] for p in paced),
        "reports_coalesced": sum(p["coalesced"] for p in paced + saturated),
    }


def _targets(result: dict[str, Any], workers: int) -> dict[str, dict[str, Any]]:
    """The targets of one size: issue 27's at 1,024 workers and more (every paced report accepted, p99 <=
    10 ms, >= 50,000 reports/s saturated), the earlier ones (20 ms, 20,000/s) below."""
    large = workers >= 1024
    rate, p99 = (50_000, 0.010) if large else (TARGETS["reports_per_s"], TARGETS["decision_latency_p99_s"])
    growth = (result["rss_mb_end"] - result["rss_mb_start"]) / result["rss_mb_start"]
    plain = result["plain_class"]
    targets = {
        f"reports_per_s >= {rate}": {"value": result["reports_per_s"], "target": rate,
                                     "met": result["reports_per_s"] >= rate},
        f"decision_latency_p99_s <= {p99:g} while reports flow": {
            "value": result["decision_latency_p99_s"], "target": p99, "met": result["decision_latency_p99_s"] <= p99},
        "memory flat (rss growth < 5% over the paced phase, after the warm-up)": {
            "value": growth, "target": TARGETS["rss_growth_fraction"], "met": growth < TARGETS["rss_growth_fraction"]},
        "in-process CPU per report <= 10 us": {
            "value": plain["cpu_per_report_us"], "target": TARGETS["plain_cpu_per_report_us"],
            "met": plain["cpu_per_report_us"] <= TARGETS["plain_cpu_per_report_us"]},
        f"in-process bundle CPU p50 <= 5 ms at {workers} workers": {
            "value": plain["bundle_cpu_p50_s"], "target": TARGETS["plain_bundle_cpu_s"],
            "met": plain["bundle_cpu_p50_s"] <= TARGETS["plain_bundle_cpu_s"]},
    }
    if large:
        targets["every paced report accepted (none dropped by the clients)"] = {
            "value": result["paced_reports_dropped"], "target": 0, "met": result["paced_reports_dropped"] == 0}
    return targets


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pdml_ray.bench.common import finish
    from pdml_ray.errors import UsageError

    if args.device != "cpu":
        raise UsageError("bench scheduler runs no model: --device cuda does not apply (use --device cpu)")
    try:
        sizes = [int(w) for w in str(args.workers).split(",")]
    except ValueError:
        raise UsageError(f"--workers takes a number or a comma-separated list (256,1024), got {args.workers!r}") from None
    if min(sizes) < 1 or args.generators < 1 or not (args.hz > 0) or (args.duration is not None and not args.duration > 0):
        raise UsageError("--workers and --generators must be >= 1, --hz and --duration > 0")
    if args.per_node < 1:
        raise UsageError("--per-node must be >= 1 (simulated workers per simulated node, e.g. 8)")
    records = [_one_size(argparse.Namespace(**{**vars(args), "workers": w})) for w in sizes]
    result = records[-1]  # the last size's figures on top (256,1024: the largest), every size's in ``sizes``
    if len(records) > 1:
        result = {**result, "sizes": records,
                  "targets": {f"{r['workers']} workers: {k}": t for r in records for k, t in r["targets"].items()}}
    return finish(args, result, emulated={"workers": "simulated", "note": SIMULATED_NOTE})


def _one_size(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from pdml_ray.bench.common import init_ray, print_table

    duration = args.duration or (15.0 if args.quick else 60.0)
    saturate_s = 8.0 if args.quick else 20.0
    warmup_s = 5.0 if args.quick else 20.0
    interval = _config(args.workers, "x").decision_interval
    modes = ["worker", "node"] if args.report_via == "both" else [args.report_via]
    print(f"bench scheduler: {args.workers} workers at {args.hz:g} steps/s, reports flushed every {interval} steps, "
          f"reports via {' and '.join(modes)} ({args.per_node} workers per simulated node); {SIMULATED_NOTE}", flush=True)
    started_here = not ray.is_initialized()
    if started_here:
        init_ray(max(2, args.generators + 1))  # a submitted job's cluster, else a private local one
    # the prober's process (this one) holds Ray and the bench: a full collection of it paused a round trip
    # by up to ~100 ms, which is this process's, not the scheduler's (the actor freezes its own likewise)
    gc.freeze()
    try:
        print("Ray's own costs in an idle scheduler actor and per call ...", flush=True)
        ray_costs = _ray_costs(args.workers, 3.0 if args.quick else 10.0, 1000 if args.quick else 3000)
        by_mode = {}
        for mode in modes:
            print(f"report_via={mode}:", flush=True)
            by_mode[mode] = _measure(args, args.per_node if mode == "node" else 0, interval, duration, warmup_s,
                                     saturate_s)
    finally:
        if started_here:
            ray.shutdown()
    print("phase 3/3: the plain class in this process ...", flush=True)
    plain = _plain_class(args.workers, interval, 5.0 if args.quick else 15.0, args.seed, args.per_node)

    # first the route the library's default takes at these sizes: report_via="auto" is "node" above
    # BOUNDARY_GATHER_MAX_WORKERS (the boundary gather needs torch.distributed, which simulated workers lack)
    main = by_mode["node" if "node" in by_mode else modes[0]]
    result: dict[str, Any] = {
        "workers": args.workers, "hz": args.hz, "flush_interval_steps": interval, "duration_s": duration,
        "report_via": "node" if "node" in by_mode else modes[0], "workers_per_node": args.per_node,
        **main, "warmup_s": warmup_s, "metrics_export_interval_s": _export_interval(), "plain_class": plain,
        "ray_costs": ray_costs,
        "by_report_via": by_mode,
    }
    result["targets"] = _targets(result, args.workers)
    rows = []
    for label, key, scale in [("offered load (reports/s, paced)", "offered_reports_per_s", 1),
                              ("accepted (reports/s, paced)", "paced_reports_per_s", 1),
                              ("sustained (reports/s, saturated)", "reports_per_s", 1),
                              ("decision latency p50 (ms), paced", "decision_latency_p50_s", 1e3),
                              ("decision latency p99 (ms), paced", "decision_latency_p99_s", 1e3),
                              ("decision latency p99 (ms), saturated", "saturated_decision_latency_p99_s", 1e3),
                              ("actor CPU per report (us), paced", "actor_cpu_per_report_us_paced", 1),
                              ("actor CPU per report (us), saturated", "actor_cpu_per_report_us_saturated", 1),
                              ("actor CPU (cores busy), paced", "actor_cpu_fraction_paced", 1),
                              ("load generators' CPU (cores busy), paced", "generators_cpu_fraction_paced", 1),
                              ("a worker's flush (us: pack + call; node: + gather)", "worker_flush_us", 1),
                              ("actor memory start (MB)", "rss_mb_start", 1), ("actor memory end (MB)", "rss_mb_end", 1),
                              ("reports dropped by clients", "reports_dropped", 1)]:
        rows.append([label, *(by_mode[m][key] * scale for m in modes)])

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.2f}"

    for label, key in [("in the actor: lock wait p50 / p99 (ms), paced", "lock_wait"),
                       ("in the actor: Scheduler.bundle p50 / p99 (ms), paced", "bundle"),
                       ("in the actor: decision thread CPU p50 / p99 (ms), paced", "thread_cpu"),
                       ("outside the actor (Ray, waiting for a CPU) p50 / p99 (ms), paced", "outside_actor")]:
        rows.append([label, *(f"{ms(p[f'{key}_p50_s'])} / {ms(p[f'{key}_p99_s'])}"
                              for p in (by_mode[m]["decision_profile_paced"] for m in modes))])
    rows.append(["in the actor: GC pauses (ms per s) / longest (ms), paced",
                 *(f"{ms(p['gc_s_per_s'])} / {ms(p['gc_max_s'])}"
                   for p in (by_mode[m]["decision_profile_paced"] for m in modes))])
    blank = [""] * (len(modes) - 1)
    rows += [["plain class: reports/s", plain["reports_per_s"], *blank],
             [f"plain class: CPU per report (us, {plain['reports_per_call']} a call)", plain["cpu_per_report_us"], *blank],
             ["plain class: bundle p50 / p99 (ms)", f"{plain['bundle_p50_s'] * 1e3:.2f} / {plain['bundle_p99_s'] * 1e3:.2f}", *blank],
             ["plain class: bundle CPU p50 / p99 (ms)",
              f"{plain['bundle_cpu_p50_s'] * 1e3:.2f} / {plain['bundle_cpu_p99_s'] * 1e3:.2f}", *blank],
             ["Ray: idle actor CPU (ms per s)", ray_costs["idle_cpu_ms_per_s"], *blank],
             ["Ray: CPU per call, ping / empty report (us)",
              f"{ray_costs['cpu_per_ping_call_us']:.1f} / {ray_costs['cpu_per_empty_report_call_us']:.1f}", *blank]]
    print_table(["figure", *(f"report_via={m}" for m in modes)], rows,
                title=f"bench scheduler ({args.workers} simulated workers)")
    for target, t in result["targets"].items():
        print(f"  target {'met    ' if t['met'] else 'MISSED '} {target} (measured {t['value']:.4g}, report_via="
              f"{result['report_via']})")
    print(SIMULATED_NOTE)
    return result
