"""A vectorised sum-tree over N non-negative float scores: draw B indices and update B scores in O(B log N).

Layout: a K-ary tree (K = 16) stored level by level in flat float64 arrays. ``levels[D]`` holds the
N leaves, padded with zeros to a multiple of K; ``levels[d][j]`` is the sum of its K children
``levels[d + 1][K j : K j + K]`` (padding nodes stay 0); ``levels[0][0]`` is the total.

Both operations walk the D = ceil(log_K N) levels with array operations over the whole batch, so
the Python loop runs D times (6 for N = 10^7), never B times. A wide fan-out keeps the number of
numpy calls per step small, which is what a step of a few hundred indices costs on a CPU; the
(B, K) work per level is tiny. Internal sums are recomputed from their children on every update
(never adjusted by deltas), so rounding errors do not accumulate however long the tree lives.
Memory: about 8 * 16/15 * N bytes (81 MiB for N = 10^7).
"""

from __future__ import annotations

import numpy as np

from pdml_ray.errors import ConfigError, PlanError, ReportError

FANOUT = 16
_SHIFT = 4  # log2(FANOUT): parent = child >> _SHIFT
_EXCLUSIVE = np.triu(np.ones((FANOUT, FANOUT)), 1)  # x @ _EXCLUSIVE = exclusive running sums of x's rows
_ONES = np.ones(FANOUT)  # x @ _ONES = row sums (a tiny matmul beats .sum(axis=1) and .cumsum(axis=1))


class SumTree:
    """Scores ``s_i >= 0`` of N items; ``draw`` returns index i with probability ``s_i / sum(s)``."""

    def __init__(self, num_items: int, initial: float | np.ndarray = 0.0) -> None:
        if not isinstance(num_items, (int, np.integer)) or num_items < 1:
            raise ConfigError(f"SumTree needs num_items >= 1 (one per sample), got {num_items!r}")
        self.num_items = int(num_items)
        self.depth = 1  # levels below the root
        while FANOUT ** self.depth < self.num_items:
            self.depth += 1
        # Level sizes bottom-up, each padded to a multiple of K only (not to K^d): the whole tree is
        # ~N * 16/15 floats, which keeps it cache-resident for the N of a typical data set.
        sizes = [-(-self.num_items // FANOUT) * FANOUT]
        for _ in range(self.depth - 1):
            sizes.append(-(-(sizes[-1] // FANOUT) // FANOUT) * FANOUT)
        self.levels = [np.zeros(1, dtype=np.float64)] + [np.zeros(n, dtype=np.float64) for n in reversed(sizes)]
        # (rows, K) views: row j holds the K children of node j of level d
        self._children = self._child_views()
        self.set_all(initial)

    def _child_views(self) -> list[np.ndarray]:
        return [lvl.reshape(-1, FANOUT) for lvl in self.levels[1:]]

    def __setstate__(self, state: dict) -> None:
        """A copy (``copy.deepcopy``, pickle) gets views of its own levels: the copied views would be
        arrays of their own, and the sums written through them would never reach the copy's levels."""
        self.__dict__.update(state)
        self._children = self._child_views()

    # ---------------------------------------------------------------- bulk
    @property
    def leaves(self) -> np.ndarray:
        """The N scores as a read-only view (no copy)."""
        view = self.levels[-1][:self.num_items]
        view.flags.writeable = False
        return view

    def set_all(self, values: float | np.ndarray) -> None:
        """Replace every score (scalar or shape (N,)) and rebuild all sums: O(N)."""
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), (self.num_items,))
        _check_values(values)
        with np.errstate(over="ignore"):
            _check_total(float(values.sum()))
        self.levels[-1][:self.num_items] = values
        self.levels[-1][self.num_items:] = 0.0
        for d in range(self.depth - 1, -1, -1):
            rows = self._children[d].shape[0]
            self._children[d].sum(axis=1, out=self.levels[d][:rows])

    def values(self, indices: np.ndarray | None = None) -> np.ndarray:
        """Scores of ``indices`` (all N if None); a copy for None, a gather otherwise."""
        leaves = self.levels[-1][:self.num_items]
        return leaves.copy() if indices is None else leaves[np.asarray(indices, dtype=np.int64)]

    @property
    def total(self) -> float:
        return float(self.levels[0][0])

    # ---------------------------------------------------------------- O(B log N)
    def update(self, indices: np.ndarray, values: np.ndarray | float, *, unique: bool = False) -> None:
        """Set ``s[indices] = values``. With duplicate indices the LAST occurrence wins.

        indices: int (B,); values: float (B,) or a scalar, each finite and >= 0. ``unique=True``
        promises indices without duplicates and skips the de-duplication.
        """
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size == 0:
            return
        vals = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape)
        _check_values(vals)
        if idx.min() < 0 or idx.max() >= self.num_items:
            raise ReportError(f"SumTree.update: indices must lie in [0, {self.num_items}) (positions in the data set)")
        if unique:
            nodes = idx
        else:
            # Last write wins: np.unique on the reversed batch returns each index's first position
            # there, i.e. its last position in the batch (numpy leaves repeated fancy writes unordered).
            nodes, first_in_reversed = np.unique(idx[::-1], return_index=True)
            vals = vals[::-1][first_in_reversed]
        old = self.levels[-1][nodes]
        with np.errstate(over="ignore"):  # validate, then write: the new total must stay finite
            _check_total(self.total - float(old.sum()) + float(vals.sum()))
        self._write(nodes, vals)
        if not np.isfinite(self.levels[0][0]):  # rounding at the very edge of float64: undo
            self._write(nodes, old)
            _check_total(float("inf"))

    def _write(self, nodes: np.ndarray, vals: np.ndarray) -> None:
        """Write distinct leaves ``nodes`` and recompute their ancestors (``nodes`` is consumed)."""
        nodes = nodes.copy()
        self.levels[-1][nodes] = vals
        for d in range(self.depth - 1, -1, -1):
            # Siblings share a parent, so ``nodes`` repeats entries; every copy writes the same sum,
            # so the repeats are harmless and cheaper than de-duplicating each level.
            nodes >>= _SHIFT
            self.levels[d][nodes] = np.take(self._children[d], nodes, axis=0) @ _ONES

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` i.i.d. indices (int64, shape (count,)) with P(i) = s_i / sum(s), i.e. with replacement.

        Raises PlanError (a ValueError) when every score is 0 (there is no distribution to draw from); callers that
        mix in a uniform floor handle that case before calling (see SamplePrioritizer).
        """
        total = self.levels[0][0]
        if not total > 0.0:
            raise PlanError("SumTree.draw: all scores are 0; set some score > 0 or sample uniformly instead")
        if total < _TINY_TOTAL:  # a few subnormal units: targets u * total lose all precision
            return self._draw_exact(count, rng)
        leaf = self._descend(rng.random(count) * total)
        # Rounding can leave a target a hair past the last non-empty child of a node and land on an
        # empty leaf (probability ~1e-16 per draw); draw those again.
        for _ in range(8):
            empty = self.levels[-1][leaf] <= 0.0
            if not empty.any():
                break
            leaf[empty] = self._descend(rng.random(int(empty.sum())) * total)
        empty = self.levels[-1][leaf] <= 0.0
        if empty.any():
            leaf[empty] = self._draw_exact(int(empty.sum()), rng)
        return leaf

    def _draw_exact(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``draw`` by one pass over the leaves, scaled by a power of two so their total is near 1 (exact
        for subnormal leaves): O(N), for totals too small for the descent and rounding leftovers."""
        _, exponent = np.frexp(self.levels[0][0])
        cdf = np.cumsum(np.ldexp(self.levels[-1][:self.num_items], -int(exponent)))
        leaf = np.searchsorted(cdf, rng.random(count) * cdf[-1], side="right")  # lands on a positive leaf
        return np.minimum(leaf, self.num_items - 1).astype(np.int64)

    def _descend(self, u: np.ndarray) -> np.ndarray:
        """Leaf under each target u in [0, total) (u: float (B,), modified in place), root to leaf."""
        rows = np.arange(u.size)
        node = np.zeros(u.size, dtype=np.int64)
        for d in range(self.depth):
            before = np.take(self._children[d], node, axis=0) @ _EXCLUSIVE  # (B, K): mass left of each child
            # Child j is chosen when before[j] <= u < before[j + 1], i.e. it is the last child whose
            # ``before`` is <= u (before[0] = 0 always is). An empty child has the same ``before`` as
            # its right neighbour, so it is never the last one, except at the end of a node, which
            # only rounding reaches (u == the node's total): ``draw`` redraws those.
            choice = ((before <= u[:, None]) @ _ONES).astype(np.int64) - 1
            u -= before[rows, choice]
            node = (node << _SHIFT) + choice
        return node


_TINY_TOTAL = 1e-290
"""Below this total, ``draw`` goes through ``_draw_exact`` (2^52 x the smallest normal float64)."""


def _check_total(total: float) -> None:
    if not np.isfinite(total):
        raise ReportError("SumTree: these scores would make the total overflow float64 (inf); scores must sum "
                          "to a finite number, so refuse or rescale the huge score first")


def _check_values(values: np.ndarray) -> None:
    if values.size and not (np.all(np.isfinite(values)) and values.min() >= 0.0):
        raise ReportError("SumTree scores must be finite and >= 0 (got a negative, NaN or inf score)")
