"""Micro-batch sizes known before a step: a per-stage cost model over them, and micro-batch orders.

A runtime, or the simulator, tells a schedule each step's micro-batch sizes before it plans that step
(``tell_sizes(step, sizes)``, every schedule has it; static ones ignore it). A size is relative: 1.0 is
the nominal micro-batch that ``PipelineConfig.memory_limit`` counts activations in and ``stage_costs``
times (a micro-batch's tokens over the nominal micro-batch's, say). Activations are taken to grow
linearly with size.

``SizeModel`` learns, per stage, what a micro-batch of size s costs relative to a nominal one:

    g_k(s) = (c0 + c1 s + c2 s^2) / (c0 + c1 + c2)

a fixed part, a per-token part and an attention part (quadratic in sequence length), like the node
axis's step-time line with the quadratic term added, since with long-tailed sequence lengths a line
under-predicts exactly the long micro-batches that decide the makespan. Each stage's coefficients are
a least-squares fit of measured latency over the estimate of a nominal micro-batch (every replica and
kind of the stage pooled), over exponentially decayed sums (the newest step weighs ``alpha``), with the
size terms ridged towards zero: sizes that never vary teach nothing, and g stays 1.

Reordering needs no model of its own: ``orders_to_try`` gives the few micro-batch orders worth
predicting (as given, shortest first, short ones at both ends, long ones in the middle, longest first),
and ``relabel`` applies one to any plan (a static order runs its i-th micro-batch slot with micro-batch
``order[i]``).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from pdml_ray.errors import ReportError, StateError
from pdml_ray.pipeline.listsched import single_pipeline_schedule
from pdml_ray.pipeline.plan import Action, Kind, Plan
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator, split_backward_work

RIDGE = 1e-4
"""Weight, in measurements' worth, pulling the per-token and attention coefficients towards zero: sizes that
never vary leave all of a micro-batch's cost fixed (g = 1) instead of an arbitrary split."""
MIN_RELATIVE_COST = 0.05
"""Least g_k(s) taken (a fit extrapolated to a tiny micro-batch cannot go to zero or below)."""
UNEVEN_SIZES = 0.05
"""Coefficient of variation of a step's sizes below which they count as equal (nothing to reorder or fit)."""


def check_sizes(sizes: object, microbatches: int) -> tuple[float, ...]:
    """``sizes`` as a tuple of ``microbatches`` positive finite floats; ReportError saying what is wrong."""
    values: tuple[float, ...] = ()
    if isinstance(sizes, (list, tuple, np.ndarray)) and len(sizes) == microbatches:
        try:
            values = tuple(float(x) for x in sizes)
        except (TypeError, ValueError):
            values = ()
    if len(values) != microbatches or not all(0.0 < x < 1e6 for x in values):
        raise ReportError(f"micro-batch sizes must be {microbatches} positive numbers below 1e6 (one per micro-batch, "
                          f"relative to the nominal micro-batch), got {str(sizes)[:120]}")
    return values


def uneven(sizes: Sequence[float]) -> bool:
    """Whether a step's sizes differ enough to plan around (coefficient of variation >= ``UNEVEN_SIZES``)."""
    a = np.asarray(sizes, dtype=np.float64)
    return bool(a.size > 1 and a.std() > UNEVEN_SIZES * a.mean())


def _features(s: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(s), s, s * s], axis=-1)  # (n, 3): fixed, per token, attention


class SizeModel:
    """Per stage, a micro-batch's cost relative to a nominal one as a function of its size (module docstring)."""

    def __init__(self, stages: int, alpha: float) -> None:
        self.stages, self.alpha = stages, alpha
        self.gram = np.zeros((stages, 3, 3))  # decayed sum of phi phi^T per stage
        self.moment = np.zeros((stages, 3))  # decayed sum of phi x ratio per stage
        self.coef = np.tile(np.array([1.0, 0.0, 0.0]), (stages, 1))  # (stages, 3): c0, c1, c2

    def update(self, stage: np.ndarray, size: np.ndarray, ratio: np.ndarray) -> None:
        """One step's measurements: per measurement its stage, its micro-batch's size and its latency over
        the nominal estimate. Refits every stage that had measurements."""
        phi = _features(size)
        self.gram *= 1.0 - self.alpha
        self.moment *= 1.0 - self.alpha
        np.add.at(self.gram, stage, phi[:, :, None] * phi[:, None, :])
        np.add.at(self.moment, stage, phi * ratio[:, None])
        penalty = np.diag([0.0, 1.0, 1.0])  # the fixed part is not pulled: it carries the ratio's scale
        for k in np.unique(stage):
            scale = max(1.0, float(self.gram[k, 0, 0]))  # measurements' worth in the decayed sums
            lhs = self.gram[k] + RIDGE * scale * penalty
            self.coef[k] = np.linalg.solve(lhs, self.moment[k])

    def relative_cost(self, sizes: Sequence[float]) -> np.ndarray:
        """(stages, micro-batches): g_k(s_m), each micro-batch's cost over a nominal one's at each stage."""
        phi = _features(np.asarray(sizes, dtype=np.float64))  # (M, 3)
        nominal = np.maximum(self.coef.sum(axis=1), 1e-12)[:, None]  # g_k(1)'s numerator, (S, 1)
        return np.maximum(self.coef @ phi.T / nominal, MIN_RELATIVE_COST)

    def state_dict(self) -> dict[str, list]:
        return {"gram": self.gram.tolist(), "moment": self.moment.tolist(), "coef": self.coef.tolist()}

    def load_state_dict(self, state: dict[str, list]) -> None:
        for name in ("gram", "moment", "coef"):
            value = np.array(state[name], dtype=np.float64)
            if value.shape != getattr(self, name).shape or not np.isfinite(value).all():
                raise StateError(f"saved size model {name} has shape {value.shape}, this pipeline needs "
                                  f"{getattr(self, name).shape}; load a state saved for the same stages")
            setattr(self, name, value)


def orders_to_try(costs: Sequence[float]) -> dict[str, tuple[int, ...]]:
    """Micro-batch orders worth predicting for micro-batches of relative ``costs``, by name: 'given' (as
    the data loader gave them), 'ascending', 'ends' (the shortest at both ends: the pipeline's fill and
    drain expose the first forward chain and the last backward chain, the longest in the middle) and
    'descending'; duplicates dropped."""
    given = tuple(range(len(costs)))
    up = tuple(sorted(given, key=lambda m: (costs[m], m)))
    ends = up[0::2] + up[1::2][::-1]  # small, ..., large, ..., small
    out: dict[str, tuple[int, ...]] = {}
    for name, order in (("given", given), ("ascending", up), ("ends", ends), ("descending", up[::-1])):
        if order not in out.values():
            out[name] = order
    return out


def relabel(plan: Plan, order: Sequence[int]) -> Plan:
    """``plan`` with its i-th micro-batch slot running micro-batch ``order[i]`` (same orders, same placement
    of slots; activation sizes, if the plan has them, follow their micro-batches)."""
    orders = {key: tuple(Action(a.stage, a.replica, a.kind, order[a.microbatch]) for a in acts)
              for key, acts in plan.orders.items()}
    return dataclasses.replace(plan, orders=orders)


def lanes_by_load(cost: Sequence[float], periods: Sequence[float]) -> list[list[int]]:
    """Micro-batches of relative ``cost`` over lanes of ``periods`` (seconds per nominal micro-batch):
    the longest first, each to the lane whose predicted busy time (its costs summed, times its period)
    ends lowest. Per lane, its micro-batches."""
    load: list[float] = [0.0] * len(periods)
    mine: list[list[int]] = [[] for _ in periods]
    for m in sorted(range(len(cost)), key=lambda m: (-cost[m], m)):
        j = min(range(len(periods)), key=lambda j: ((load[j] + cost[m]) * periods[j], j))
        load[j] += cost[m]
        mine[j].append(m)
    return mine


def sized_lanes(lane_costs: Sequence[tuple[Sequence[float], Sequence[float]]], caps: Sequence[float],
                sizes: Sequence[float], relative_cost: np.ndarray, transfer_s: float = 0.0
                ) -> tuple[list[list[list[tuple[Kind, int]]]], float, list[int]]:
    """Osprey's lane plans for micro-batches of known sizes: ([lane][stage] -> [(kind, micro-batch)],
    predicted makespan in seconds, micro-batches per lane).

    ``lane_costs[j]`` are lane j's members' (forward_s, backward_s) per stage for a nominal micro-batch,
    ``relative_cost`` (stages, micro-batches) scales them per micro-batch (``SizeModel.relative_cost``).
    The longest micro-batch first, each goes to the lane whose predicted busy time (its micro-batches'
    relative costs summed, times its period) ends lowest; each lane then runs its micro-batches in
    whichever of ``orders_to_try`` its list-scheduled run (1F1B's rule) finishes first, holding at most
    ``caps`` (per stage) in sizes; a micro-batch larger than a cap runs there alone.
    """
    S, L = relative_cost.shape[0], len(lane_costs)
    cost = relative_cost.mean(axis=0).tolist()  # (M,): relative cost over the stages
    mine = lanes_by_load(cost, [max(f + b for f, b in zip(*lane_costs[j])) for j in range(L)])
    caps = [max(c, max(sizes)) for c in caps]
    scale = relative_cost.tolist()
    out: list[list[list[tuple[Kind, int]]]] = [[[] for _ in range(S)] for _ in range(L)]
    makespan = 0.0
    for j in range(L):
        if not mine[j]:  # a lane without micro-batches (fewer of them than lanes)
            continue
        best: tuple[float, list[int], list[list[tuple[Kind, int]]]] | None = None
        for order in orders_to_try([cost[m] for m in mine[j]]).values():
            ids = [mine[j][i] for i in order]
            raw, done = single_pipeline_schedule(*lane_costs[j], len(ids), caps, transfer_s,
                                                 scale=[[scale[k][m] for m in ids] for k in range(S)],
                                                 sizes=[sizes[m] for m in ids])
            if best is None or max(done) < best[0]:
                best = (max(done), ids, raw)
        assert best is not None
        makespan = max(makespan, best[0])
        out[j] = [[(kind, best[1][i]) for kind, i in raw_k] for raw_k in best[2]]
    return out, makespan, [len(x) for x in mine]


class KnownSizesSimulator(PipelineSimulator):
    """A noiseless simulator of one step whose micro-batches' costs and activations are predicted:
    the profile's per-stage costs scaled by ``relative_cost`` (stages, micro-batches), activations
    ``sizes`` (osprey's predictor for a step of told sizes)."""

    def __init__(self, profile: ClusterProfile, sizes: Sequence[float], relative_cost: np.ndarray) -> None:
        super().__init__(profile)
        self._sizes = np.asarray(sizes, dtype=np.float64)
        self._relative = np.asarray(relative_cost, dtype=np.float64)

    def sequence_lengths(self, step: int, microbatches: int) -> np.ndarray:
        return self._sizes

    def work(self, step: int, microbatches: int) -> np.ndarray:
        p = self.profile
        base = np.stack([np.asarray(p.forward_s), np.asarray(p.backward_s)], axis=1)[:, :, None]  # (S, 2, 1)
        return split_backward_work(base * self._relative[:, None, :], p.weight_fraction)


UNEVEN_SPREAD = 0.25
"""Coefficient of variation across a step's micro-batch cost factors below which they are taken as
equal: per-action noise of 20% gives factor estimates that spread by about a tenth, long-tailed
sequence lengths by far more."""


def relative_costs(rows: Sequence[tuple[int, int]], ratio: Sequence[float], sizes: Sequence[float] | None,
                   size_model: SizeModel) -> list[float]:
    """Per measurement (its (stage, micro-batch) in ``rows``, its seconds over the current estimate in
    ``ratio``): its micro-batch's cost at that stage over a nominal micro-batch's, which osprey divides the
    measurement by so that its estimates learn each replica's speed, not which micro-batches it happened
    to get.

    With the step's sizes told and uneven, ``size_model`` is refitted on the rows and gives the ratio.
    Without them, a micro-batch's factor is its median ratio over the stages (its sequence length is
    shared by every stage), normalised to mean one over the step; it needs measurements on three or more
    stages (``size_model.stages``), so that one slow replica on its path does not move the median, and
    factors spread less than ``UNEVEN_SPREAD`` are taken as equal (noise)."""
    if sizes is not None and uneven(sizes) and rows:
        stage = np.array([k for k, _ in rows])
        size = np.array([sizes[m] for _, m in rows])
        size_model.update(stage, size, np.array(ratio))
        g = size_model.relative_cost(sizes).tolist()  # [stage][micro-batch]
        return [g[k][m] for k, m in rows]
    ratios: dict[int, list[float]] = {}
    if size_model.stages >= 3:
        for (_, m), x in zip(rows, ratio):
            ratios.setdefault(m, []).append(x)
    factor = {m: float(np.median(v)) for m, v in ratios.items()}
    spread = float(np.std(list(factor.values())) / np.mean(list(factor.values()))) if factor else 0.0
    if spread < UNEVEN_SPREAD:  # micro-batches about equal: their estimated factors would only add noise
        return [1.0] * len(rows)
    mean = sum(factor.values()) / len(factor)
    return [factor[m] / mean for _, m in rows]


def estimates_simulator(est: Sequence[Sequence[Sequence[float]]], replicas: Sequence[int], memory_limit: int | None,
                        transfer_s: float, sizes: Sequence[float] | None = None,
                        relative_cost: np.ndarray | None = None) -> PipelineSimulator:
    """A noiseless simulator of osprey's estimates ``est[stage][replica]`` (F, B, I, W seconds): per stage
    the fastest replica's F, B and I : W split, the others as speeds relative to it (F + B seconds); with
    a step's ``sizes`` told, each micro-batch's costs scaled by its ``relative_cost`` per stage and its
    activation its size (``KnownSizesSimulator``)."""
    fastest = [min(row, key=lambda c: c[0] + c[1]) for row in est]
    speeds = tuple(tuple((f[0] + f[1]) / (c[0] + c[1]) for c in row) for row, f in zip(est, fastest))
    split = sum(f[3] for f in fastest) / max(1e-12, sum(f[2] + f[3] for f in fastest))
    profile = ClusterProfile(stages=len(est), replicas=tuple(replicas), forward_s=tuple(f[0] for f in fastest),
                             backward_s=tuple(f[1] for f in fastest), speeds=speeds,
                             weight_fraction=min(1.0, max(0.0, split)), memory_limit=memory_limit,
                             transfer_s=transfer_s)
    if sizes is None or relative_cost is None:
        return PipelineSimulator(profile)
    return KnownSizesSimulator(profile, sizes, relative_cost)
