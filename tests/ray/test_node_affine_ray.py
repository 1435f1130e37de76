"""Node priorities with a fixed cost per step, through real Ray Train workers: the shares settle at the
optimum of the affine step-time model t_i(b) = c_i + b / r_i that the run itself measured, not at the
speed ratio.

Two workers at emulated speeds 1 and 0.4 run an MLP whose every step also sleeps 20 ms inside the
timed step. The emulated slowdown stretches the whole compute time, the sleep included, so the slow
worker's fixed cost is 2.5 times the fast one's and it rightly gets less than its speed share."""

import json

import numpy as np
import pytest
import ray
import ray.train

from pdml_ray.batching import balance_affine
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer

from affine_loops import fixed_cost_loop

STEPS = 40
GLOBAL_BATCH = 512
WARMUP = 4  # Ray start-up slows the first steps on 2 cores
SETTLED = 12  # the last steps, over which the shares are averaged


@pytest.fixture(scope="module")
def run(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("affine") / "out.json"
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=GLOBAL_BATCH, emulated_speeds=[1.0, 0.4], warmup_steps=WARMUP))
    result = PDMLTrainer(fixed_cost_loop,
                         train_loop_config={"out": str(out), "steps": STEPS, "global_batch": GLOBAL_BATCH,
                                            "hidden": 128},
                         scaling_config=ray.train.ScalingConfig(num_workers=2),
                         run_config=ray.train.RunConfig(name="affine-test", storage_path=str(out.parent)),
                         pdml_config=config).fit()
    return result, json.loads(out.read_text())


def measured_lines(telemetry, workers=2):
    """Each worker's line t = c + b / r from its own post-warm-up reports: the median time at each batch
    size it ran (contention on 2 cores adds spikes of several times a step), then least squares over
    those medians weighted by how often each size ran (c >= 0: else the line through the origin)."""
    fixed, rates = [], []
    for w in range(workers):
        mine = (telemetry["worker_id"] == w) & (telemetry["step"] >= WARMUP)
        b_all, t_all = telemetry["samples"][mine], telemetry["compute_s"][mine]
        b = np.unique(b_all)
        t = np.array([np.median(t_all[b_all == x]) for x in b])
        n = np.array([np.sum(b_all == x) for x in b], dtype=float)
        slope = intercept = 0.0
        if len(b) > 1:
            slope, intercept = np.polyfit(b, t, 1, w=np.sqrt(n))
        if len(b) == 1 or intercept < 0 or slope <= 0:
            slope, intercept = float((n * b * t).sum() / (n * b * b).sum()), 0.0
        fixed.append(float(intercept))
        rates.append(float(1.0 / slope))
    return np.array(fixed), np.array(rates)


def test_shares_settle_at_the_measured_affine_optimum(run):
    result, out = run
    telemetry = result.pdml.telemetry
    fixed, rates = measured_lines(telemetry)
    optimum = balance_affine(fixed, rates, GLOBAL_BATCH, 1) / GLOBAL_BATCH
    sizes = np.array(out["sizes"][-SETTLED:], dtype=float)
    shares = (sizes / sizes.sum(axis=1, keepdims=True)).mean(axis=0)
    speed_share = rates[1] / rates.sum()
    detail = dict(shares=shares.tolist(), optimum=optimum.tolist(), speed_share=speed_share, fixed=fixed.tolist(),
                  rates=rates.tolist(), decisions=[(d["effective_step"], d["batch_sizes"]) for d in result.pdml.decisions])
    print(detail)  # shown with -s or on failure
    assert len(out["sizes"]) == STEPS, detail
    # within 10% of the measured model's optimum, for each worker's share
    assert np.all(np.abs(shares / optimum - 1.0) <= 0.10), detail
    # and the fixed cost matters here: the optimum gives the slow worker clearly less than its speed share
    assert optimum[1] <= 0.9 * speed_share, detail
