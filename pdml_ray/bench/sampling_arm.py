"""``bench sampling``'s task and arms: the generated imbalanced binary task, and one arm's training run.

The task: negatives ~ N(0, I) in ``_DIM`` dimensions, positives in ``_CLUSTERS`` tight clusters at
distance ``_RADIUS`` from the origin, 1 positive in ``imbalance + 1`` training samples, a share of
the training labels flipped (``label_noise``), and a balanced held-out set with clean labels. An arm
(``Arm``) trains a small torch MLP with Adam on it, one step at a time, by its sampling rule (uniform,
class-balanced, or a ``SamplePrioritizer``'s plans) and loss (mean, importance-weighted, focal,
Selective-Backprop), timing its steps and keeping its metric history. ``pdml_ray.bench.sampling`` runs
the arms interleaved and compares them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from pdml_ray.priority.selective_backprop import BackpropSelector

_DIM = 16         # feature dimension
_CLUSTERS = 4     # positive clusters
_RADIUS = 4.0     # distance of positive cluster centres from the origin (negatives ~ N(0, I))
_SPREAD = 0.5     # std of positives around their centre
_HOLDOUT = 2000   # held-out samples per class
_FOCAL_GAMMA = 2.0


def make_task(imbalance: int, n: int, seed: int, label_noise: float = 0.0):
    """Training set (x (n, d) float32, y (n,) float32) with n // (imbalance + 1) positives, a random
    ``label_noise`` share of its labels flipped, and a balanced held-out set with clean labels; the
    cluster centres depend only on ``seed``."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((_CLUSTERS, _DIM))
    centres *= _RADIUS / np.linalg.norm(centres, axis=1, keepdims=True)

    def draw(n_neg: int, n_pos: int, r: np.random.Generator):
        pos = centres[r.integers(0, _CLUSTERS, n_pos)] + _SPREAD * r.standard_normal((n_pos, _DIM))
        x = np.concatenate([r.standard_normal((n_neg, _DIM)), pos]).astype(np.float32)
        y = np.concatenate([np.zeros(n_neg), np.ones(n_pos)]).astype(np.float32)
        return x, y

    n_pos = max(1, n // (imbalance + 1))
    x, y = draw(n - n_pos, n_pos, rng)
    if label_noise > 0:
        flip = np.random.default_rng(seed + 20_011).random(n) < label_noise
        y[flip] = 1.0 - y[flip]
    return (x, y), draw(_HOLDOUT, _HOLDOUT, np.random.default_rng(seed + 10_007))


def class_balanced_draw(rng: np.random.Generator, class_indices: Sequence[np.ndarray], count: int) -> np.ndarray:
    """``count`` i.i.d. sample indices (int64) drawn class-balanced: each draw picks one of the K classes
    uniformly, then a sample of that class uniformly, so P(i) = 1 / (K n_class(i)), as torch's
    ``WeightedRandomSampler`` with weights 1 / class count does. ``class_indices[k]``: the indices of class k."""
    per_class = rng.multinomial(count, np.full(len(class_indices), 1.0 / len(class_indices)))
    parts = [c[rng.integers(0, c.size, size=k)] for c, k in zip(class_indices, per_class)]
    return np.concatenate(parts).astype(np.int64)


class Arm:
    """One training run: model, optimiser, sampler, clocks (seconds) and the metric history."""

    def __init__(self, name: str, x, y, args, seed: int, lr: float, prioritizer=None, selection_s: float = 0.0) -> None:
        import torch

        torch.manual_seed(seed)  # same initial weights in every arm
        self.name, self.x, self.y, self.n = name, x, y, x.shape[0]
        h = args.hidden
        self.model = torch.nn.Sequential(torch.nn.Linear(_DIM, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                                          torch.nn.ReLU(), torch.nn.Linear(h, 1))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.sp = prioritizer
        labels = y.numpy()
        self.classes = [np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)] if name == "label_balanced" else None
        self.focal = name == "focal"
        cfg = prioritizer.config if prioritizer is not None else None
        self.selector = (BackpropSelector(cfg.backprop_share, cfg.percentile_window)
                         if cfg is not None and cfg.mode == "selective-backprop" else None)
        self.plan_ahead = args.plan_ahead
        self._plans: list = []               # plans drawn for the rest of the interval
        self._uniform: np.ndarray = np.empty(0, dtype=np.int64)  # uniform draws for the rest of the interval
        self._feedback: list[tuple] = []     # (indices, losses) of the interval's steps so far
        self._step_s = 0.0                   # the interval's step seconds so far (without selection)
        self.rng = np.random.default_rng(seed + 1)
        self.batch = args.batch_size
        # everything of a step: sampling, weights, forward, backward, table updates; from step 0 it holds
        # the selection work done before training (rho_loss: the irreducible-loss model, ``selection_s``)
        self.train_s = selection_s
        self.overhead_s = selection_s  # the selection part of train_s: plan() + update() + that work
        self.hit_step: int | None = None
        self.hit_s: float | None = None
        self.last: dict[str, float] = {}

    def step(self, step: int) -> None:
        import torch
        import torch.nn.functional as F

        t0 = time.perf_counter()
        w, feedback = None, False
        if self.classes is not None:
            idx = class_balanced_draw(self.rng, self.classes, self.batch)
        elif self.sp is None:
            # an interval's draws at once, as the table draws its uniform plans: with the table seeded
            # like this arm (``bench sampling``'s trial), a priority arm drawing uniformly trains on these same batches
            if not self._uniform.size:
                self._uniform = self.rng.integers(0, self.n, self.batch * self.plan_ahead)
            idx, self._uniform = self._uniform[:self.batch], self._uniform[self.batch:]
        else:
            # As in the Ray Train path: at each interval boundary the table takes the interval's
            # losses in one update, then hands out the next interval's plans from one draw.
            if not self._plans:
                if self._step_s:  # the pay switch's cost reference, once per interval as the deriver does
                    self.sp.note_step_seconds(self._step_s / self.plan_ahead)
                    self._step_s = 0.0
                if self._feedback:
                    idx_all, loss_all = (np.concatenate(a) for a in zip(*self._feedback))
                    self.sp.update(idx_all, loss_all, step - 1)
                    self._feedback = []
                self._plans = self.sp.plans(step, self.plan_ahead, [self.batch])
            plan = self._plans.pop(0)
            idx, weights, feedback = plan.indices[0], plan.weights[0], plan.feedback
            # sum(w l) / sum(w) as one dot product: w normalised here, one autograd op in the step; a
            # uniform plan (switched off, every weight 1) takes the plain mean, as the uniform arm does
            w = None if plan.uniform else torch.from_numpy(weights / weights.sum())
        t1 = time.perf_counter()
        ti = torch.from_numpy(idx)
        if self.selector is not None:
            per_sample, loss = self._selective_backprop_loss(self.selector, ti, w)
        else:
            logits, target = self.model(self.x[ti]).squeeze(1), self.y[ti]
            per_sample = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
            trained = per_sample
            if self.focal:  # (1 - p_t)^gamma down-weights the well-classified samples
                p = torch.sigmoid(logits)
                trained = per_sample * (1.0 - (p * target + (1.0 - p) * (1.0 - target))) ** _FOCAL_GAMMA
            loss = trained.mean() if w is None else trained @ w
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        t2 = time.perf_counter()
        if self.sp is not None:
            if feedback:  # as ctx.step: only the losses the table asked for (the pay switch off: none)
                self._feedback.append((idx, per_sample.detach().numpy()))
            self._step_s += t2 - t1
            self.overhead_s += (t1 - t0) + (time.perf_counter() - t2)
        self.train_s += time.perf_counter() - t0

    def _selective_backprop_loss(self, selector: BackpropSelector, ti, w):
        """Selective-Backprop as ``ctx.step``'s ``backprop_rows`` runs it: the whole batch scored without
        gradients, the high-loss share forwarded again and backpropagated alone (the chosen rows' mean, as
        the masked form). Returns every sample's loss (the table's feedback) and the loss to backpropagate."""
        import torch
        import torch.nn.functional as F

        x, target = self.x[ti], self.y[ti]
        with torch.no_grad():  # the scoring forward: no graph over the batch
            per_sample = F.binary_cross_entropy_with_logits(self.model(x).squeeze(1), target, reduction="none")
        t_sel = time.perf_counter()
        rows = torch.from_numpy(selector.rows(per_sample.numpy()))  # (k,) int64
        self.overhead_s += time.perf_counter() - t_sel
        chosen = F.binary_cross_entropy_with_logits(self.model(x[rows]).squeeze(1), target[rows], reduction="none")
        scale = per_sample.numel() / max(rows.numel(), 1)  # w sums to 1 over the batch: rescaled to the chosen
        loss = chosen.mean() if w is None else (chosen * scale) @ w[rows]
        return per_sample, loss

    def evaluate(self, step: int, xt, yt, target: float) -> None:
        import torch

        with torch.no_grad():
            pred = (self.model(xt).squeeze(1) > 0).float()
        tp = float((pred * yt).sum()); fp = float((pred * (1 - yt)).sum()); fn = float(((1 - pred) * yt).sum())
        recall, precision = tp / max(tp + fn, 1.0), tp / max(tp + fp, 1.0)
        f1 = 2 * precision * recall / max(precision + recall, 1e-12)
        accuracy = float((pred == yt).float().mean())  # on the clean, balanced test split
        self.last = {"minority_f1": f1, "minority_recall": recall, "minority_precision": precision,
                     "accuracy": accuracy, "step": step}
        if self.hit_step is None and f1 >= target:
            self.hit_step, self.hit_s = step, self.train_s

    def result(self, max_steps: int) -> dict[str, Any]:
        """This arm's figures for one seed; ``*_bounded`` count a miss as the budget."""
        out: dict[str, Any] = {
            "steps_to_target": self.hit_step, "time_to_target_s": self.hit_s, "reached": self.hit_step is not None,
            "steps_bounded": self.hit_step if self.hit_step is not None else max_steps,
            "time_bounded_s": self.hit_s if self.hit_s is not None else self.train_s,
            "train_s": self.train_s, "step_time_ms": 1e3 * self.train_s / max_steps, "final": self.last}
        if self.sp is not None:
            stats = self.sp.stats()
            checks = max(stats.continuity_checks, 1)
            out.update(
                priority_overhead_fraction=self.overhead_s / self.train_s,
                continuity_overhead_fraction=stats.continuity_seconds / self.train_s,
                continuity_update_fraction=stats.continuity_update_seconds / self.train_s,
                continuity_check_us=1e6 * (stats.continuity_seconds - stats.continuity_update_seconds) / checks,
                recalibration_overhead_fraction=stats.recalibration_seconds / self.train_s,
                priority_stats=dataclasses.asdict(stats),
                # the pay switch's verdicts: (first step of the probe, measured gain, priority on after it)
                switch_verdicts=[list(v) for v in self.sp.switch.verdicts])
        if self.selector is not None:  # the share of the forwarded samples that was backpropagated
            sel = self.selector
            out["backprop_fraction"] = sel.trained / max(sel.trained + sel.forward_only, 1)
        return out
