"""``pdml-ray bench sampling``: uniform vs loss-priority sampling on an imbalanced task, side by side.

One process, no Ray: this measures the algorithm and its full overhead (sum-tree draws, importance
weights, score-table updates, continuity checks), not a cluster. What is real: the data set (a
seeded, generated binary task with 1 positive in ``--imbalance``), a small torch MLP trained with
Adam on the CPU, every step of both arms, and all timings. The two arms run interleaved step by step
in the same process with the same initial weights, global batch, learning rate and sample budget, so
a noisy shared machine slows both alike. Uniform training minimises the plain mean loss; priority
training minimises the importance-weighted loss ``sum(w * l) / sum(w)`` with the plan's weights.

Target metric: F1 of the minority (positive) class on a held-out balanced set (2,000 + 2,000),
evaluated every ``--eval-every`` steps; evaluation time is excluded from time-to-target. A balanced
control (imbalance 1, target F1 ``--control-target-f1``, evaluated every step) checks what priority
sampling costs when there is nothing to focus on. Before timing, a short discarded warm-up pair runs
so that one-time first-call costs of torch and numpy land on neither arm.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from typing import Any

import numpy as np

from pdml_ray.bench.common import median

DESCRIPTION = "uniform vs loss-priority sampling on an imbalanced task (steps and wall time to a target F1)"

_DIM = 16         # feature dimension
_CLUSTERS = 4     # positive clusters
_RADIUS = 4.0     # distance of positive cluster centres from the origin (negatives ~ N(0, I))
_SPREAD = 0.5     # std of positives around their centre
_HOLDOUT = 2000   # held-out samples per class


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--imbalance", type=int, default=200, help="negatives per positive in training (default 200)")
    parser.add_argument("--dataset-size", type=int, default=20_000, metavar="N", help="training samples (default 20000)")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch (default 128)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate, shared by both arms (default 3e-3)")
    parser.add_argument("--target-f1", type=float, default=0.8, help="minority-class F1 to reach (default 0.8)")
    parser.add_argument("--control-target-f1", type=float, default=0.99,
                        help="F1 the balanced control must reach (default 0.99: balanced data passes 0.8 in a few steps)")
    parser.add_argument("--max-steps", type=int, default=None, help="step budget per arm (default 1500, quick 900)")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between evaluations (default 5)")
    parser.add_argument("--repetitions", type=int, default=None, help="seeds to repeat over (default 10, quick 3)")
    parser.add_argument("--hidden", type=int, default=256, help="MLP width (default 256)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sample_priority.exponent (default 1)")
    parser.add_argument("--uniform-mix", type=float, default=0.1, help="sample_priority.uniform_mix (default 0.1)")
    parser.add_argument("--plan-ahead", type=int, default=5,
                        help="steps per plan batch and per table update, as the scheduler's decision interval "
                             "does in the Ray Train path (default 5; 1 = draw and update every step)")
    parser.add_argument("--check-interval", type=int, default=50,
                        help="continuity.check_interval in steps (default 50: detection within 50 steps)")
    parser.add_argument("--unseen-score", choices=("max", "mean"), default="mean",
                        help="sample_priority.unseen_score (default mean here; the library default, max, first "
                             "visits every sample once, i.e. one epoch, before it can focus)")


def _make_task(imbalance: int, n: int, seed: int):
    """Training set (x (n, d) float32, y (n,) float32) with n // (imbalance + 1) positives, and a
    balanced held-out set; the cluster centres depend only on ``seed``."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((_CLUSTERS, _DIM))
    centres *= _RADIUS / np.linalg.norm(centres, axis=1, keepdims=True)

    def draw(n_neg: int, n_pos: int, r: np.random.Generator):
        pos = centres[r.integers(0, _CLUSTERS, n_pos)] + _SPREAD * r.standard_normal((n_pos, _DIM))
        x = np.concatenate([r.standard_normal((n_neg, _DIM)), pos]).astype(np.float32)
        y = np.concatenate([np.zeros(n_neg), np.ones(n_pos)]).astype(np.float32)
        return x, y

    n_pos = max(1, n // (imbalance + 1))
    return draw(n - n_pos, n_pos, rng), draw(_HOLDOUT, _HOLDOUT, np.random.default_rng(seed + 10_007))


class _Arm:
    """One training run: model, optimiser, sampler, clocks (seconds) and the metric history."""

    def __init__(self, name: str, x, y, args, seed: int, prioritizer=None) -> None:
        import torch

        torch.manual_seed(seed)  # same initial weights in both arms
        self.name, self.x, self.y, self.n = name, x, y, x.shape[0]
        h = args.hidden
        self.model = torch.nn.Sequential(torch.nn.Linear(_DIM, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                                          torch.nn.ReLU(), torch.nn.Linear(h, 1))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        self.sp = prioritizer
        self.plan_ahead = args.plan_ahead
        self._plans: list = []               # plans drawn for the rest of the interval
        self._feedback: list[tuple] = []     # (indices, losses) of the interval's steps so far
        self.rng = np.random.default_rng(seed + 1)
        self.batch = args.batch_size
        self.train_s = 0.0     # everything of a step: sampling, weights, forward, backward, table updates
        self.overhead_s = 0.0  # the priority part of train_s: plan() + update()
        self.hit_step: int | None = None
        self.hit_s: float | None = None
        self.last: dict[str, float] = {}

    def step(self, step: int) -> None:
        import torch
        import torch.nn.functional as F

        t0 = time.perf_counter()
        if self.sp is None:
            idx, w = self.rng.integers(0, self.n, self.batch), None
        else:
            # As in the Ray Train path: at each interval boundary the table takes the interval's
            # losses in one update, then hands out the next interval's plans from one draw.
            if not self._plans:
                if self._feedback:
                    idx_all, loss_all = (np.concatenate(a) for a in zip(*self._feedback))
                    self.sp.update(idx_all, loss_all, step - 1)
                    self._feedback = []
                self._plans = self.sp.plans(step, self.plan_ahead, [self.batch])
            plan = self._plans.pop(0)
            # sum(w l) / sum(w) as one dot product: w normalised here, one autograd op in the step
            idx, w = plan.indices[0], torch.from_numpy(plan.weights[0] / plan.weights[0].sum())
        t1 = time.perf_counter()
        ti = torch.from_numpy(idx)
        per_sample = F.binary_cross_entropy_with_logits(self.model(self.x[ti]).squeeze(1), self.y[ti], reduction="none")
        loss = per_sample.mean() if w is None else per_sample @ w
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        t2 = time.perf_counter()
        if self.sp is not None:
            self._feedback.append((idx, per_sample.detach().numpy()))
            self.overhead_s += (t1 - t0) + (time.perf_counter() - t2)
        self.train_s += time.perf_counter() - t0

    def evaluate(self, step: int, xt, yt, target: float) -> None:
        import torch

        with torch.no_grad():
            pred = (self.model(xt).squeeze(1) > 0).float()
        tp = float((pred * yt).sum()); fp = float((pred * (1 - yt)).sum()); fn = float(((1 - pred) * yt).sum())
        recall, precision = tp / max(tp + fn, 1.0), tp / max(tp + fp, 1.0)
        f1 = 2 * precision * recall / max(precision + recall, 1e-12)
        self.last = {"minority_f1": f1, "minority_recall": recall, "minority_precision": precision, "step": step}
        if self.hit_step is None and f1 >= target:
            self.hit_step, self.hit_s = step, self.train_s


def _pair(imbalance: int, args, seed: int, max_steps: int, eval_every: int, target: float) -> dict[str, Any]:
    """Uniform and priority arms on one generated task, interleaved step by step."""
    import torch

    from pdml_ray.config import ContinuityConfig, SamplePriorityConfig
    from pdml_ray.priority.sample import SamplePrioritizer

    (x, y), (xt, yt) = _make_task(imbalance, args.dataset_size, seed)
    x, y, xt, yt = map(torch.from_numpy, (x, y, xt, yt))
    cfg = SamplePriorityConfig(exponent=args.temperature, uniform_mix=args.uniform_mix,
                               unseen_score=args.unseen_score)
    sp = SamplePrioritizer(args.dataset_size, cfg, ContinuityConfig(check_interval=args.check_interval), seed=seed)
    arms = [_Arm("uniform", x, y, args, seed), _Arm("priority", x, y, args, seed, sp)]
    for step in range(max_steps):
        for arm in arms:
            arm.step(step)
            if step % eval_every == 0 or step == max_steps - 1:
                arm.evaluate(step + 1, xt, yt, target)  # step + 1 = optimizer steps taken
    u, p = arms
    stats = sp.stats()
    out: dict[str, Any] = {
        "seed": seed, "imbalance": imbalance, "max_steps": max_steps, "target_value": target,
        "steps_to_target_uniform": u.hit_step, "steps_to_target_priority": p.hit_step,
        "time_to_target_uniform_s": u.hit_s, "time_to_target_priority_s": p.hit_s,
        "final_uniform": u.last, "final_priority": p.last,
        "step_time_uniform_ms": 1e3 * u.train_s / max_steps, "step_time_priority_ms": 1e3 * p.train_s / max_steps,
        "priority_overhead_fraction": p.overhead_s / p.train_s,
        "continuity_overhead_fraction": stats.continuity_seconds / p.train_s,
        "continuity_check_us": 1e6 * stats.continuity_seconds / max(stats.continuity_checks, 1),
        "recalibration_overhead_fraction": stats.recalibration_seconds / p.train_s,
        "priority_stats": dataclasses.asdict(stats),
    }
    out["step_ratio"] = _ratio(u.hit_step, p.hit_step, max_steps)
    out["time_ratio"] = _ratio(u.hit_s, p.hit_s, u.train_s)
    return out


def _ratio(uniform: float | None, priority: float | None, budget: float) -> float | None:
    """uniform / priority; a run that never reached the target counts as the whole budget (a bound)."""
    if priority is None:
        return None
    return (uniform if uniform is not None else budget) / priority


def _sumtree_timing(reps: int, seed: int) -> dict[str, Any]:
    from pdml_ray.priority.sumtree import SumTree

    n, batch = 10_000_000, 1024
    rng = np.random.default_rng(seed)
    tree = SumTree(n, rng.exponential(size=n))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        idx = tree.draw(batch, rng)
        tree.update(idx, rng.exponential(size=batch))
        times.append(time.perf_counter() - t0)
    ms = 1e3 * np.asarray(times)
    return {"n": n, "batch": batch, "repetitions": reps, "draw_update_ms_median": float(np.median(ms)),
            "draw_update_ms_max": float(ms.max())}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("steps_to_target_uniform", "steps_to_target_priority", "step_ratio", "time_to_target_uniform_s",
            "time_to_target_priority_s", "time_ratio", "step_time_uniform_ms", "step_time_priority_ms",
            "priority_overhead_fraction", "continuity_overhead_fraction", "continuity_check_us",
            "recalibration_overhead_fraction")
    out = {k: median([r[k] for r in runs]) for k in keys}
    for arm in ("uniform", "priority"):
        out[f"final_{arm}_minority_f1"] = median([r[f"final_{arm}"].get("minority_f1") for r in runs])
        out[f"final_{arm}_minority_recall"] = median([r[f"final_{arm}"].get("minority_recall") for r in runs])
    out["reached_uniform"] = sum(r["steps_to_target_uniform"] is not None for r in runs)
    out["reached_priority"] = sum(r["steps_to_target_priority"] is not None for r in runs)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from pdml_ray.bench.common import check_device, finish, print_table

    check_device(args.device)
    if args.device != "cpu":
        print("note: this benchmark trains a small MLP; it runs on the CPU whatever --device says")
    torch.set_num_threads(1)  # both arms share one core; the machine may be shared
    # Collapses are counted in the JSON (priority_stats); one warning line per collapse would bury the table.
    logging.getLogger("pdml_ray.priority.continuity").setLevel(logging.ERROR)
    reps = args.repetitions or (3 if args.quick else 10)
    max_steps = args.max_steps or (900 if args.quick else 1500)
    print("pdml-ray bench sampling: one process, no Ray. Real: generated data, torch MLP training, all timings;\n"
          "uniform and priority arms interleaved step by step (same init, batch, lr, budget).")
    # Warm-up, discarded: first calls into torch and numpy (allocators, lazy imports, kernel choice)
    # cost milliseconds once per process and would land on whichever arm runs first.
    _pair(args.imbalance, args, args.seed + 10_000, 60, 30, args.target_f1)
    runs, controls = [], []
    for r in range(reps):
        seed = args.seed + r
        runs.append(_pair(args.imbalance, args, seed, max_steps, args.eval_every, args.target_f1))
        # Balanced data reaches the target within tens of steps: evaluate every step to resolve it.
        controls.append(_pair(1, args, seed, min(max_steps, 300), 1, args.control_target_f1))
        print(f"  seed {seed}: steps to F1>={args.target_f1}: uniform {runs[-1]['steps_to_target_uniform']}, "
              f"priority {runs[-1]['steps_to_target_priority']}; control {controls[-1]['steps_to_target_uniform']} "
              f"vs {controls[-1]['steps_to_target_priority']}; continuity collapses (peaked/flat) "
              f"{runs[-1]['priority_stats']['collapsed_peaked']:.0f}/{runs[-1]['priority_stats']['collapsed_flat']:.0f}")
    summary, control = _summary(runs), _summary(controls)
    tree = _sumtree_timing(10 if args.quick else 50, args.seed)
    result = {
        "benchmark": "sampling",
        "note": "one process, no Ray: the sampling algorithm and all its overhead on a real (generated) task",
        "target_metric": "minority_f1 (positive-class F1 on a balanced held-out set, threshold 0.5)",
        "target_value": args.target_f1, "imbalance": args.imbalance, "dataset_size": args.dataset_size,
        "batch_size": args.batch_size, "lr": args.lr, "max_steps": max_steps, "repetitions": reps,
        "sample_priority": {"exponent": args.temperature, "uniform_mix": args.uniform_mix,
                            "unseen_score": args.unseen_score},
        "plan_ahead": args.plan_ahead, "continuity_check_interval": args.check_interval,
        **summary,
        "control": {"target_value": args.control_target_f1, **control},
        "sumtree": tree,
        "runs": runs, "control_runs": controls,
    }
    rows = [["steps to target", summary["steps_to_target_uniform"], summary["steps_to_target_priority"],
             summary["step_ratio"], control["step_ratio"]],
            ["time to target (s)", summary["time_to_target_uniform_s"], summary["time_to_target_priority_s"],
             summary["time_ratio"], control["time_ratio"]],
            ["final minority F1", summary["final_uniform_minority_f1"], summary["final_priority_minority_f1"], "", ""],
            ["step time (ms)", summary["step_time_uniform_ms"], summary["step_time_priority_ms"], "", ""]]
    print_table(["median over seeds", "uniform", "priority", "uniform/priority", "control ratio"], rows,
                title=f"imbalance {args.imbalance}, N={args.dataset_size}, batch {args.batch_size}, {reps} seed(s)")
    print(f"priority overhead {summary['priority_overhead_fraction']:.1%} of a priority step; continuity checks "
          f"{summary['continuity_overhead_fraction']:.3%} ({summary['continuity_check_us']:.0f} us per check, every "
          f"{args.check_interval} steps), recalibrations {summary['recalibration_overhead_fraction']:.3%}; sum-tree draw+update B={tree['batch']} in "
          f"N={tree['n']:,}: {tree['draw_update_ms_median']:.2f} ms median")
    return finish(args, result, emulated={"nothing": "single process; no speeds, bandwidth or stragglers emulated"})
