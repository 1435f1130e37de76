"""A vectorised sum-tree over N non-negative float scores: draw B indices and update B scores in O(B log N).

Layout: one flat float64 array ``tree`` of length 2L, L = the next power of two >= N. Leaf i lives at
``tree[L + i]`` (leaves N..L-1 are padding and stay 0); internal node k holds
``tree[2k] + tree[2k+1]``; the root, ``tree[1]``, is the total. ``tree[0]`` is unused.

Both operations walk the log2(L) levels with array operations over the whole batch, so the Python
loop runs log N times (24 for N = 10^7), never B times. Internal sums are recomputed from their two
children on every update (never adjusted by deltas), so rounding errors do not accumulate however
long the tree lives. Memory: 16 L bytes (256 MiB for N = 10^7).
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """Scores ``s_i >= 0`` of N items; ``draw`` returns index i with probability ``s_i / sum(s)``."""

    def __init__(self, num_items: int, initial: float | np.ndarray = 0.0) -> None:
        if not isinstance(num_items, (int, np.integer)) or num_items < 1:
            raise ValueError(f"SumTree needs num_items >= 1, got {num_items!r}")
        self.num_items = int(num_items)
        self.depth = max(1, (self.num_items - 1).bit_length())  # levels below the root; L = 2**depth
        self.num_leaves = 1 << self.depth
        self.tree = np.zeros(2 * self.num_leaves, dtype=np.float64)
        self.set_all(initial)

    # ---------------------------------------------------------------- bulk
    def set_all(self, values: float | np.ndarray) -> None:
        """Replace every score (scalar or shape (N,)) and rebuild all sums: O(N)."""
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), (self.num_items,))
        _check_values(values)
        L = self.num_leaves
        self.tree[L:L + self.num_items] = values
        self.tree[L + self.num_items:] = 0.0
        lo = L
        while lo > 1:  # level with nodes [lo // 2, lo) from children [lo, 2 lo)
            self.tree[lo // 2:lo] = self.tree[lo:2 * lo:2] + self.tree[lo + 1:2 * lo:2]
            lo //= 2

    def values(self, indices: np.ndarray | None = None) -> np.ndarray:
        """Scores of ``indices`` (all N if None); a copy for None, a gather otherwise."""
        leaves = self.tree[self.num_leaves:self.num_leaves + self.num_items]
        return leaves.copy() if indices is None else leaves[np.asarray(indices, dtype=np.int64)]

    @property
    def total(self) -> float:
        return float(self.tree[1])

    # ---------------------------------------------------------------- O(B log N)
    def update(self, indices: np.ndarray, values: np.ndarray | float, *, unique: bool = False) -> None:
        """Set ``s[indices] = values``. With duplicate indices the LAST occurrence wins.

        indices: int (B,); values: float (B,) or a scalar, each finite and >= 0. ``unique=True``
        promises sorted indices without duplicates and skips the de-duplication.
        """
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size == 0:
            return
        vals = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape)
        _check_values(vals)
        if idx.min() < 0 or idx.max() >= self.num_items:
            raise IndexError(f"SumTree.update: indices must lie in [0, {self.num_items})")
        # Last write wins: np.unique on the reversed batch returns each index's first position there,
        # i.e. its last position in the batch.
        if unique:
            uniq = idx
        else:
            uniq, first_in_reversed = np.unique(idx[::-1], return_index=True)
            vals = vals[::-1][first_in_reversed]
        nodes = uniq + self.num_leaves
        self.tree[nodes] = vals
        pairs = self.tree.reshape(-1, 2)  # row k = (tree[2k], tree[2k+1]): node k's children, one gather
        for _ in range(self.depth):
            # Sibling leaves share a parent, so ``nodes`` repeats entries; every copy writes the same
            # sum, so the repeats are harmless and cheaper than de-duplicating each level.
            nodes >>= 1
            children = pairs[nodes]  # (k, 2)
            self.tree[nodes] = children[:, 0] + children[:, 1]

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` i.i.d. indices (int64, shape (count,)) with P(i) = s_i / sum(s), i.e. with replacement.

        Raises ValueError when every score is 0 (there is no distribution to draw from); callers that
        mix in a uniform floor handle that case before calling (see SamplePrioritizer).
        """
        total = self.tree[1]
        if not total > 0.0:
            raise ValueError("SumTree.draw: all scores are 0; set some score > 0 or sample uniformly instead")
        u = rng.random(count) * total  # (count,) targets in [0, total)
        node = self._descend(u)
        # Rounding can leave a target a hair past the last non-empty leaf of a subtree and land on
        # an empty leaf (probability ~1e-16 per draw); draw those again.
        for _ in range(8):
            empty = self.tree[node] <= 0.0
            if not empty.any():
                break
            node[empty] = self._descend(rng.random(int(empty.sum())) * total)
        return node - self.num_leaves

    def _descend(self, u: np.ndarray) -> np.ndarray:
        """Leaf node (position in ``tree``) under each target u (modified in place), root to leaf."""
        node = np.ones(u.shape, dtype=np.int64)
        for _ in range(self.depth):
            node <<= 1
            left = self.tree[node]
            go_right = u >= left
            np.subtract(u, left, out=u, where=go_right)
            node += go_right
        return node


def _check_values(values: np.ndarray) -> None:
    if values.size and not (np.all(np.isfinite(values)) and values.min() >= 0.0):
        raise ValueError("SumTree scores must be finite and >= 0 (got a negative, NaN or inf score)")
