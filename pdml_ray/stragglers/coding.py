"""Gradient codes (Tandon et al. 2017): which partitions each worker holds, with which coefficients,
and how the aggregator decodes the sum of all partition gradients from any n - s workers.

n workers, n data partitions, tolerance s. Worker i holds s + 1 partitions and sends one coded
message ``m_i = sum_p B[i, p] * g_p``, with ``g_p`` the gradient on partition p. For a set ``A`` of
workers that arrived, a decoding vector ``a`` with ``a @ B[A] = 1`` gives
``sum_i a_i m_i = sum_p g_p``.

- **FR** (fractional repetition): the n workers form n / (s + 1) groups of s + 1; every worker of
  group k holds the same partitions ``k(s+1) .. k(s+1)+s`` with coefficient 1. Any n - s workers
  leave at least one per group; the decode picks one per group with coefficient 1 (0/1 decoding).
  Needs (s + 1) | n.
- **CR** (cyclic repetition): worker i holds partitions ``i, i+1, .., i+s (mod n)``. ``B`` is built by
  Tandon et al.'s Algorithm 2: a seeded random ``H`` (s x n) with zero row sums; each row of ``B``
  has ``B[i, i] = 1`` and solves ``H B[i]^T = 0`` on its support, so the rows span the null space of
  ``H`` (which contains the all-ones vector) and any n - s rows are independent with probability 1.
  The decode solves the (n - s) x n system ``a @ B[A] = 1`` by least squares in float64, cached per
  arrived set. Random CR matrices can be badly conditioned: every decode reports its relative
  residual ``||a @ B[A] - 1|| / ||1||`` (``Decoding.relative_error``).

Precision: matrices and decoding vectors are float64; messages should be float32 or wider (never
half). In float64 the decode of the sum is exact to ~1e-12 relative; with float32 messages the
decoded sum carries about ``sum_i |a_i| * ||m_i|| * 6e-8`` of rounding, the bound
``float32_error_bound`` states and the tests check.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from pdml_ray.errors import ConfigError, PlanError

SCHEMES = ("fr", "cr")
FLOAT32_EPS = float(np.finfo(np.float32).eps)


def check_code(n: int, s: int, scheme: str) -> None:
    """Raise ConfigError unless (n, s, scheme) describes a valid gradient code."""
    if scheme not in SCHEMES:
        raise ConfigError(f"gradient code scheme must be one of {list(SCHEMES)}, got {scheme!r}")
    if not (isinstance(n, int) and n >= 1):
        raise ConfigError(f"a gradient code needs n >= 1 workers, got n={n!r}")
    if not (isinstance(s, int) and s >= 0):
        raise ConfigError(f"stragglers s must be an integer >= 0, got s={s!r}")
    if s >= n:
        raise ConfigError(f"stragglers s={s} must be below the number of workers n={n} "
                          "(at least one worker has to arrive); lower --stragglers or add workers")
    if scheme == "fr" and n % (s + 1):
        raise ConfigError(f"FR gradient coding needs (s + 1) | n: s + 1 = {s + 1} does not divide n = {n}; "
                          f"use the CR scheme, or n a multiple of {s + 1}")


def fr_groups(n: int, s: int) -> tuple[tuple[int, ...], ...]:
    """FR's groups: group k = workers (and partitions) k(s+1) .. k(s+1)+s."""
    check_code(n, s, "fr")
    return tuple(tuple(range(k * (s + 1), (k + 1) * (s + 1))) for k in range(n // (s + 1)))


def fr_matrix(n: int, s: int) -> np.ndarray:
    """FR encoding matrix B (n x n, float64, 0/1): B[i, p] = 1 iff worker i holds partition p."""
    B = np.zeros((n, n))
    for group in fr_groups(n, s):
        B[np.ix_(group, group)] = 1.0
    return B


def cr_support(n: int, s: int) -> tuple[tuple[int, ...], ...]:
    """CR placement: worker i holds partitions i, i+1, .., i+s (mod n)."""
    return tuple(tuple((i + j) % n for j in range(s + 1)) for i in range(n))


def cr_matrix(n: int, s: int, seed: int = 0) -> np.ndarray:
    """CR encoding matrix B (n x n, float64) by Tandon et al.'s Algorithm 2 (see the module doc)."""
    check_code(n, s, "cr")
    B = np.zeros((n, n))
    if s == 0:
        return np.eye(n)
    rng = np.random.default_rng(seed)
    H = rng.standard_normal((s, n))
    H[:, -1] = -H[:, :-1].sum(axis=1)  # H @ 1 = 0: the all-ones vector lies in null(H)
    for i, support in enumerate(cr_support(n, s)):
        others = list(support[1:])
        # H[:, others] x = -H[:, i]: s equations, s unknowns (generically invertible)
        x = np.linalg.solve(H[:, others], -H[:, i])
        B[i, i] = 1.0
        B[i, others] = x
    return B


@dataclass(frozen=True, slots=True)
class Decoding:
    """How to combine the messages of ``workers``: ``sum_k coefficients[k] * m_{workers[k]} = sum_p g_p``."""

    workers: tuple[int, ...]
    coefficients: tuple[float, ...]
    relative_error: float
    """``||a @ B[A] - 1|| / ||1||`` in float64: how far the decode is from the exact sum."""

    def as_dict(self) -> dict[int, float]:
        return {w: c for w, c in zip(self.workers, self.coefficients) if c != 0.0}


class GradientCode:
    """An (n, s) gradient code, FR or CR: encoding matrix, supports, cached decoding per arrived set."""

    def __init__(self, n: int, s: int, scheme: str, seed: int = 0) -> None:
        check_code(n, s, scheme)
        self.n, self.s, self.scheme = n, s, scheme
        self.matrix = fr_matrix(n, s) if scheme == "fr" else cr_matrix(n, s, seed)  # (n, n) float64
        self.supports = tuple(tuple(int(p) for p in np.flatnonzero(row)) for row in self.matrix)
        self._cache: dict[frozenset[int], Decoding | None] = {}

    def __repr__(self) -> str:
        return f"GradientCode({self.scheme.upper()}, n={self.n}, s={self.s})"

    def coefficients(self, worker: int) -> tuple[tuple[int, float], ...]:
        """(partition, coefficient) pairs of worker's coded message."""
        return tuple((p, float(self.matrix[worker, p])) for p in self.supports[worker])

    def encode(self, partition_grads: np.ndarray) -> np.ndarray:
        """Messages (n, d) from partition gradients (n, d): ``B @ G``, in G's dtype (float32 or wider)."""
        G = np.asarray(partition_grads)
        if G.dtype not in (np.float32, np.float64):
            raise PlanError(f"encode gradients in float32 or float64, got {G.dtype} (half loses the decode)")
        return (self.matrix @ G.astype(np.float64)).astype(G.dtype)

    def decodable(self, arrived: Iterable[int]) -> bool:
        return self.decode(arrived) is not None

    def decode(self, arrived: Iterable[int]) -> Decoding | None:
        """The decoding vector for the workers in ``arrived``, or None if they cannot give the sum.

        FR: one arrived worker per group, coefficient 1 (the lowest id of each group). CR: the
        minimum-norm least-squares solution of ``a @ B[A] = 1`` in float64, accepted when its
        relative residual is below 1e-8. Cached per arrived set.
        """
        key = frozenset(int(w) for w in arrived)
        if key in self._cache:
            return self._cache[key]
        if not key <= set(range(self.n)):
            raise PlanError(f"arrived workers {sorted(key)} are not all in 0..{self.n - 1}")
        result: Decoding | None
        if self.scheme == "fr":
            result = self._decode_fr(key)
        else:
            result = self._decode_cr(key)
        self._cache[key] = result
        return result

    def _decode_fr(self, key: frozenset[int]) -> Decoding | None:
        chosen = []
        for group in fr_groups(self.n, self.s):
            present = [w for w in group if w in key]
            if not present:
                return None
            chosen.append(present[0])
        return Decoding(tuple(chosen), (1.0,) * len(chosen), 0.0)

    def _decode_cr(self, key: frozenset[int]) -> Decoding | None:
        workers = tuple(sorted(key))
        if not workers:
            return None
        A = self.matrix[list(workers)]  # (|A|, n)
        a, *_ = np.linalg.lstsq(A.T, np.ones(self.n), rcond=None)
        err = relative_error(a, A)
        if err > 1e-8:
            return None
        return Decoding(workers, tuple(float(x) for x in a), err)


def relative_error(a: np.ndarray, rows: np.ndarray) -> float:
    """``||a @ rows - 1|| / ||1||``: the decode's distance from the exact all-ones combination."""
    n = rows.shape[1]
    return float(np.linalg.norm(a @ rows - np.ones(n)) / np.sqrt(n))


def float32_error_bound(decoding: Decoding, messages: np.ndarray) -> float:
    """Bound on ``||decoded - exact|| / ||exact||`` when the messages (n, d) are rounded to float32.

    Rounding each message costs at most eps32 * ||m_i||; the decode multiplies it by |a_i|, and the
    float64 decode's own residual adds ``relative_error`` times the partition gradients' scale.
    Returned relative to the norm of the exact decoded sum (``sum_i a_i m_i`` in float64).
    """
    m = np.asarray(messages, dtype=np.float64)
    exact = sum(c * m[w] for w, c in zip(decoding.workers, decoding.coefficients))
    rounding = sum(abs(c) * np.linalg.norm(m[w]) for w, c in zip(decoding.workers, decoding.coefficients))
    scale = max(float(np.linalg.norm(exact)), 1e-300)
    return float(2 * FLOAT32_EPS * rounding / scale)


def straggler_sets(n: int, s: int) -> Iterable[tuple[int, ...]]:
    """Every set of exactly n - s arrived workers (for exhaustive checks)."""
    return itertools.combinations(range(n), n - s)
