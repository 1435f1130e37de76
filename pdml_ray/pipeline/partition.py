"""Split a sequential model into pipeline stages: consecutive layers, balanced by parameter count.

Pure torch (no Ray). A stage is an ``nn.Sequential`` of consecutive layers of the model; stage k
holds layers ``[bounds[k], bounds[k+1])``. Cuts are given as the index of the first layer of
stages 1..S-1, the same convention as ``torch.distributed.pipelining``'s split points.

Balancing minimises the largest stage's parameter count (the pipeline's bottleneck when compute
follows parameters, as in an MLP), then the sum of squared stage sizes so that ties spread evenly.
Parameter-free layers (ReLU, Dropout) weigh nothing; on ties they stay with the layer before them.
Layer re-balancing (``pdml_ray.pipeline.rebalance``) moves these cuts while a run trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from pdml_ray.errors import PlanError

if TYPE_CHECKING:  # torch is imported where a model is split: the cut arithmetic serves the scheduler too
    from torch import nn


def layer_param_counts(layers: Sequence[nn.Module]) -> list[int]:
    """Number of parameters (elements, not tensors) of each layer; shared parameters count once per layer."""
    return [sum(p.numel() for p in layer.parameters()) for layer in layers]


def balanced_cuts(weights: Sequence[int | float], num_stages: int, *, rates: Sequence[float] | None = None,
                  cut_ranges: Sequence[tuple[int, int]] | None = None) -> tuple[int, ...]:
    """First-layer indices of stages 1..S-1 for ``num_stages`` non-empty consecutive parts of ``weights``.

    Exact linear partition by dynamic programming, O(S * n^2) for n layers; models split for a
    pipeline have tens to hundreds of layers, so this is instantaneous. Minimises (max part, sum of
    squared parts) lexicographically, a part's size being its weight times its stage's ``rates`` entry
    (seconds per unit of weight on that stage's devices; None: 1 everywhere). ``cut_ranges`` bounds
    each cut to [low, high] (layer re-balancing keeps each layer within one stage of where it was).
    """
    n = len(weights)
    _check_stage_count(n, num_stages)
    rate = [1.0] * num_stages if rates is None else [float(r) for r in rates]
    ranges = [(1, n - 1)] * (num_stages - 1) if cut_ranges is None else list(cut_ranges)
    if len(rate) != num_stages or min(rate) <= 0 or len(ranges) != num_stages - 1:
        raise PlanError(f"balanced_cuts needs {num_stages} rates > 0 and {num_stages - 1} cut ranges, got "
                        f"{rates} and {cut_ranges}")
    prefix = [0.0]
    for w in weights:
        if w < 0:
            raise PlanError(f"layer weights must be >= 0, got {w}")
        prefix.append(prefix[-1] + float(w))

    def part(i: int, j: int) -> float:  # weight of layers [i, j)
        return prefix[j] - prefix[i]

    inf = (float("inf"), float("inf"))
    # best[s][j]: best (max, sum of squares) splitting layers [0, j) into s parts; prev[s][j]: last cut
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    prev = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = (0.0, 0.0)
    for s in range(1, num_stages + 1):
        low, high = ranges[s - 1] if s < num_stages else (n, n)
        for j in range(max(s, low), min(n - (num_stages - s), high) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == inf:
                    continue
                w = rate[s - 1] * part(i, j)
                cand = (max(best[s - 1][i][0], w), best[s - 1][i][1] + w * w)
                if cand <= best[s][j]:  # on ties the later cut wins: a ReLU stays with its Linear
                    best[s][j], prev[s][j] = cand, i
    if best[num_stages][n] == inf:
        raise PlanError(f"no cuts of {n} layers into {num_stages} non-empty stages within the cut ranges {ranges}")
    cuts: list[int] = []
    j = n
    for s in range(num_stages, 1, -1):
        j = prev[s][j]
        cuts.append(j)
    return tuple(reversed(cuts))


def stage_bounds(num_layers: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` per stage for ``cuts``; raises PlanError unless 0 < cuts strictly increasing < num_layers."""
    cuts = list(cuts)
    if any(not isinstance(c, int) for c in cuts):
        raise PlanError(f"cuts must be integer layer indices, got {cuts}")
    edges = [0, *cuts, num_layers]
    if any(a >= b for a, b in zip(edges, edges[1:])):
        raise PlanError(f"cuts {cuts} must be strictly increasing layer indices in (0, {num_layers}) "
                        f"so that every stage gets at least one layer")
    return list(zip(edges, edges[1:]))


def split_sequential(model: nn.Sequential | Sequence[nn.Module], num_stages: int,
                     cuts: Sequence[int] | None = None) -> list[nn.Sequential]:
    """Split ``model`` into ``num_stages`` ``nn.Sequential`` stages of consecutive layers.

    ``cuts`` (len num_stages - 1) overrides the parameter-count balancing. The stages hold the
    model's own layer objects, not copies: running them in order is running the model. Copy them
    (``copy.deepcopy``) before giving one to each replica.
    """
    from torch import nn

    layers = list(model)
    _check_stage_count(len(layers), num_stages)
    if cuts is None:
        cuts = balanced_cuts(layer_param_counts(layers), num_stages)
    elif len(cuts) != num_stages - 1:
        raise PlanError(f"{num_stages} stages need {num_stages - 1} cuts, got {len(cuts)}: {list(cuts)}")
    return [nn.Sequential(*layers[a:b]) for a, b in stage_bounds(len(layers), cuts)]


def _check_stage_count(num_layers: int, num_stages: int) -> None:
    if not isinstance(num_stages, int) or num_stages < 1:
        raise PlanError(f"num_stages must be a positive integer, got {num_stages!r}")
    if num_stages > num_layers:
        raise PlanError(f"cannot split {num_layers} layers into {num_stages} non-empty stages; "
                        f"use at most {num_layers} stages or a model with more layers")
