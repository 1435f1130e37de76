"""The scheduler's decisions at 64 workers, frozen: the cheaper report and decision paths (issue 27)
must not change one of them.

``_run`` drives an in-process ``Scheduler`` as ``bench scheduler`` does (``PackedReports`` of one
8-worker node per call, 5 steps per flush, a bundle per boundary) in a closed loop: each simulated
worker's step time is ``c + b / r`` at the batch size the latest decision gave it, with 5% noise, one
step in 16 three times slower, and a quarter of the workers slowed to half speed half-way. ``DECISIONS``
and ``LINES`` are frozen from commit ce430be (before the step-time fit folded a batch per worker on
Python floats); its fit statistics and lines hashed bitwise equal after that change too."""

import hashlib

import numpy as np

from pdml_ray.client import PackedReports
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, WorkerReport
from pdml_ray.scheduler import Scheduler

WORKERS, PER_NODE, INTERVAL, BOUNDARIES = 64, 8, 5, 40


def _digest(values) -> str:
    return hashlib.sha256(repr(tuple(values)).encode()).hexdigest()[:16]


def _run() -> tuple[list, list]:
    rng = np.random.default_rng(2027)
    rates = rng.choice([400.0, 800.0, 1600.0], WORKERS)  # samples/s
    fixed = rng.uniform(0.0, 0.02, WORKERS)  # s per step
    scheduler = Scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=WORKERS * 64,
                                                                      warmup_steps=2)), WORKERS)
    sizes, versions, step, decisions = (64,) * WORKERS, {"node": 0}, 0, []
    for k in range(BOUNDARIES):
        if k == BOUNDARIES // 2:
            rates[:WORKERS // 4] *= 0.5
        rows = []
        for s in range(step, step + INTERVAL):
            noise = rng.normal(1.0, 0.05, WORKERS) * np.where(rng.random(WORKERS) < 1 / 16, 3.0, 1.0)
            compute = (fixed + np.asarray(sizes) / rates) * noise
            rows.append([WorkerReport(worker_id=w, step=s, samples=sizes[w], compute_s=float(max(compute[w], 1e-3)),
                                      step_s=float(compute[w]) + 0.01, loss=1.0) for w in range(WORKERS)])
        for n in range(0, WORKERS, PER_NODE):
            scheduler.report(PackedReports.pack([r for w in range(n, n + PER_NODE) for r in (x[w] for x in rows)]))
        step += INTERVAL
        bundle = scheduler.bundle(Boundary(step, INTERVAL, sizes), versions)
        node = bundle.decisions.get("node")
        if node is None:
            decisions.append(None)
            continue
        versions["node"], sizes = node.version, node.batch_sizes
        decisions.append((node.version, node.effective_step, sum(node.batch_sizes), _digest(node.batch_sizes),
                          _digest(round(x, 12) for x in node.grad_weights)))
    lines = scheduler.derivers["node"].fit.lines()
    return decisions, [float(lines.fixed_s.sum()), float(lines.slope.sum()), float(lines.noise_var.sum())]


DECISIONS = [
    (1, 5, 4096, "4e48ade1fa9d1956", "73a8d085188e0ba3"), None, None, None, None, None, None, None,
    (2, 45, 4096, "97311f8c520226f7", "4cf494da96735523"), None, None, None, None, None, None, None,
    (3, 85, 4096, "fdf55a19f1146c36", "fc3443c6daeac742"), None, None, None,
    (4, 105, 4096, "16ff309aae2add8a", "79c2d43e6e2c4a39"), None, None, None, None, None,
    (5, 135, 4096, "d2aa5e4da620bc13", "f6a12d6153066da0"), None, None, None,
    (6, 155, 4096, "7c93faeff15dec06", "bdce462b6f3716fe"), None, None, None, None, None, None, None, None, None,
]
"""Per boundary, the node decision in the bundle (version, effective step, global batch, digests of its
batch sizes and of its gradient weights to 12 decimals), or None; from ce430be."""
LINES = [0.1272623179571784, 0.13128802599687955, 0.003443792129263131]
"""The fitted lines' sums at the end (fixed costs s, slopes s per sample, noise variances s^2), from ce430be."""


def test_decisions_and_lines_at_64_workers_are_unchanged():
    decisions, lines = _run()
    assert decisions == DECISIONS
    assert sum(d is not None for d in decisions) >= 3  # the run decides, the stream moves the sizes
    for got, want in zip(lines, LINES, strict=True):
        assert abs(got - want) <= 1e-12 * abs(want)
