"""A scheduler state that reached the scheduler actor through Ray holds read-only arrays (Ray hands
large arguments over zero-copy from its object store): it loads, and the run goes on from it, on the
axes whose state holds arrays (node, sample, gradient; the pipeline's is lists). A resumed
sample-priority run failed here with "assignment destination is read-only" (no Ray)."""

from __future__ import annotations

import numpy as np

from pdml_ray.decisions import Boundary, WorkerReport
from pdml_ray.scheduler import Scheduler

from test_replay import N, _ray_train_scheduler


def read_only(x):
    """``x`` with every array in it a read-only copy, as Ray delivers a large argument."""
    if isinstance(x, np.ndarray):
        x = x.copy()
        x.flags.writeable = False
        return x
    if isinstance(x, dict):
        return {k: read_only(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(read_only(v) for v in x)
    return x


def test_the_node_sample_and_gradient_axes_resume_from_a_read_only_state():
    before = _ray_train_scheduler()
    state = read_only(before.state_dict())
    assert any(isinstance(v, np.ndarray) and not v.flags.writeable
               for v in state["derivers"]["sample"]["table"].values())
    s = Scheduler(before.config, 2)
    s.load_state_dict(state)
    rng = np.random.default_rng(1)
    for step in range(24, 36):  # ingest, decide and update every estimate the state restored
        s.report([WorkerReport(worker_id=w, step=step, samples=(b := s.decision().batch_sizes[w]), compute_s=0.01 * b,
                               loss=1.0, grad_norm=1.0, sample_indices=rng.integers(0, N, size=b).astype(np.int64),
                               sample_losses=rng.random(b).astype(np.float32)) for w in range(2)])
        if step % 4 == 3:
            s.bundle(Boundary(step + 1, 4, s.decision().batch_sizes), dict(s.versions))
    assert s.stats().deriver_errors == {} and s.last_step == 35
