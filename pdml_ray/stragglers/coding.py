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
  The decode solves ``a @ B[A] = 1`` (minimum norm) in float64, cached per arrived set.

**Precision: a code is accepted by its float32 error, from the matrix alone.** The workers build
their messages in float32 (``pdml_ray.stragglers.worker``: ``c * g`` summed over s + 1 partitions),
the aggregator sums ``a_i m_i`` in float64 (``policy.combine_messages``). With u = 2^-24 (float32's
unit roundoff) and ``gamma_k = k u / (1 - k u)``, the standard error analysis of a sum of s + 1
products with a coefficient rounded to float32 gives ``fl32(m_i) = sum_p B[i, p] g_p (1 + t_ip)``
elementwise with ``|t_ip| <= gamma_{s+2}``; the float64 sum of at most n terms adds
``gamma64_n`` (u = 2^-53) to each; the float64 decoding vector leaves the residual
``r = a @ B[A] - 1``. So, elementwise and then by the triangle inequality,

    decoded - sum_p g_p = sum_p (r_p + sum_i a_i B[i, p] t'_ip) g_p,
    ||decoded - sum_p g_p|| <= sum_p c_p ||g_p|| <= bound * sum_p ||g_p||,
    c_p = |r_p| + (gamma_{s+2} + gamma64_n + gamma_{s+2} gamma64_n) * sum_i |a_i| |B[i, p]|,
    bound = max_p c_p.

Dividing by n: the applied mean gradient is within ``bound`` times the mean partition-gradient norm
of the exact mean (``Decoding.error_bound``; the relative error of the update when partitions'
gradients agree, larger relative to the update when they cancel). The bound depends on the matrix
only, never on the messages. Its size is the decoding coefficients' magnitude times float32's
epsilon: ``sum_i |a_i| |B[i, p]|`` is at least 1 and grows with the conditioning of ``B[A]``
(``||a||_2 <= sqrt(n) / sigma_min(B[A])``). An FR decode (0/1 coefficients) has ``bound =
gamma_{s+2} + ...``, about 2e-7 at s = 1. A random CR matrix can be far worse: at n = 10, s = 6,
``code_seed=0``'s first draw decodes survivors (5, 6, 8, 9) with coefficients up to 2.3e6 and a
condition number of 2.2e11: bound 6.6, and a float32 decode of random gradients measured 28% off
the exact sum (0.09 in the bound's units), although its float64 residual is 1e-9. So CR matrices are drawn from ``code_seed``'s generator,
one after another (the first draw is the same as before this check), until every set of n - s
survivors has ``bound <= MAX_DECODE_BOUND`` (1e-4), at most ``MAX_CODE_DRAWS`` times; otherwise
the code is refused with a ``ConfigError`` naming the worst survivor set and its bound. A decode of
more than n - s arrivals uses the minimum-norm vector when its bound is within the limit, else the
(checked) lowest n - s of them. Every ``Decoding`` carries its bound, which the policies report as
each step's ``decode_error``.

Messages must be float32 or wider (never half).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from pdml_ray.errors import ConfigError, PlanError

SCHEMES = ("fr", "cr")
FLOAT32_EPS = float(np.finfo(np.float32).eps)
MAX_DECODE_BOUND = 1e-4
"""A code is accepted when every survivor set's float32 bound (module doc) is at most this."""
MAX_CODE_DRAWS = 256
"""Random CR matrices drawn from ``code_seed``'s generator before a code is refused."""
MAX_SURVIVOR_SETS = 20_000
"""CR codes with more survivor sets than this (C(n, s)) cannot be checked at start-up and are refused."""
_CHUNK = 512  # survivor sets checked per batched pseudo-inverse (bounds memory: 512 x n x n float64)


def _gamma(k: int, unit_roundoff: float) -> float:
    return k * unit_roundoff / (1 - k * unit_roundoff)


def check_code(n: int, s: int, scheme: str, *, pipelined: bool = False) -> None:
    """Raise ConfigError unless (n, s, scheme) describes a valid gradient code (``pipelined``: for
    pipelined coding, whose CR schedule is exact only when (s + 1) | n)."""
    if scheme not in SCHEMES:
        raise ConfigError(f"gradient code scheme must be one of {list(SCHEMES)}, got {scheme!r}")
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise ConfigError(f"a gradient code needs n >= 1 workers, got n={n!r}")
    if not (isinstance(s, int) and not isinstance(s, bool) and s >= 0):
        raise ConfigError(f"stragglers s must be an integer >= 0, got s={s!r}")
    if s >= n:
        raise ConfigError(f"stragglers s={s} must be below the number of workers n={n} "
                          "(at least one worker has to arrive); lower --stragglers or add workers")
    if scheme == "fr" and n % (s + 1):
        raise ConfigError(f"FR gradient coding needs (s + 1) | n: s + 1 = {s + 1} does not divide n = {n}; "
                          f"use the CR scheme, or n a multiple of {s + 1}")
    if pipelined and n % (s + 1):
        raise ConfigError(f"pipelined CR coding (pgc-cr) needs (s + 1) | n: s + 1 = {s + 1} does not divide "
                          f"n = {n}, so the holders of a partition compute it at different steps and a decode "
                          "mixes its versions with large weights (not the exact gradient); use gc-cr, or n a "
                          f"multiple of {s + 1}")


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


def _draw_cr(n: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """One CR encoding matrix B (n x n, float64) by Tandon et al.'s Algorithm 2 (see the module doc)."""
    B = np.zeros((n, n))
    H = rng.standard_normal((s, n))
    H[:, -1] = -H[:, :-1].sum(axis=1)  # H @ 1 = 0: the all-ones vector lies in null(H)
    for i, support in enumerate(cr_support(n, s)):
        others = list(support[1:])
        # H[:, others] x = -H[:, i]: s equations, s unknowns (generically invertible)
        B[i, i] = 1.0
        B[i, others] = np.linalg.solve(H[:, others], -H[:, i])
    return B


def decode_bounds(matrix: np.ndarray, sets: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-norm decoding vectors (k, m) of ``sets`` (k arrived sets of m worker ids each) and each
    one's float32 error bound (k,) (module doc). Rank-deficient sets get a large bound (their residual)."""
    n = matrix.shape[1]
    rows = matrix[sets]  # (k, m, n)
    a = np.linalg.pinv(rows).sum(axis=1)  # (k, m): 1 @ pinv(B[A]), the minimum-norm solution of a @ B[A] = 1
    residual = np.einsum("km,kmn->kn", a, rows) - 1.0  # (k, n)
    amplification = np.einsum("km,kmn->kn", np.abs(a), np.abs(rows))  # sum_i |a_i| |B[i, p]|
    g32, g64 = _gamma(s + 2, FLOAT32_EPS / 2), _gamma(n, 2.0 ** -53)
    bound = (np.abs(residual) + (g32 + g64 + g32 * g64) * amplification).max(axis=1)
    return a, np.where(np.isfinite(bound), bound, np.inf)


def _worst_survivor_set(matrix: np.ndarray, s: int, stop_above: float) -> tuple[tuple[int, ...], float]:
    """The n - s survivor set with the largest bound (or the first found above ``stop_above``)."""
    n = matrix.shape[0]
    worst: tuple[tuple[int, ...], float] = ((), -1.0)
    sets, size = straggler_sets(n, s), 16  # small chunks first: most draws fail early
    while chunk := list(itertools.islice(sets, size)):
        size = min(4 * size, _CHUNK)
        _, bound = decode_bounds(matrix, np.array(chunk, dtype=np.int64), s)
        k = int(np.argmax(bound))
        if bound[k] > worst[1]:
            worst = (tuple(int(w) for w in chunk[k]), float(bound[k]))
        if worst[1] > stop_above:
            break
    return worst


@functools.lru_cache(maxsize=64)
def cr_matrix(n: int, s: int, seed: int = 0) -> np.ndarray:
    """The first CR encoding matrix (n x n, float64, read-only) drawn from ``seed`` whose every n - s
    survivor set decodes within ``MAX_DECODE_BOUND`` in float32; ConfigError when none of
    ``MAX_CODE_DRAWS`` draws does (module doc). Cached: a config check and the policy build it once."""
    check_code(n, s, "cr")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"the CR code's seed must be an integer >= 0 (e.g. 0), got {seed!r}")
    if s == 0:
        B = np.eye(n)
        B.flags.writeable = False
        return B
    if math.comb(n, s) > MAX_SURVIVOR_SETS:
        raise ConfigError(f"CR code n={n}, s={s}: its {math.comb(n, s):,} survivor sets are more than the "
                          f"{MAX_SURVIVOR_SETS:,} checked at start-up for float32 accuracy (random CR codes this "
                          "large are rarely accurate); use FR (gc-fr, s + 1 dividing n) or a smaller s")
    rng = np.random.default_rng(seed)
    best: tuple[tuple[int, ...], float] = ((), math.inf)
    best_matrix = np.eye(n)
    for _ in range(MAX_CODE_DRAWS):
        B = _draw_cr(n, s, rng)
        # a draw worse than the best so far is dropped at its first set above it (it cannot be accepted)
        worst = _worst_survivor_set(B, s, stop_above=best[1])
        if worst[1] <= MAX_DECODE_BOUND:
            B.flags.writeable = False
            return B
        if worst[1] < best[1]:
            best, best_matrix = worst, B
    rows = best_matrix[list(best[0])]
    a, _ = decode_bounds(best_matrix, np.array([best[0]]), s)
    raise ConfigError(f"no CR code for n={n}, s={s} (code_seed={seed}) decodes within {MAX_DECODE_BOUND:g} in "
                      f"float32: in the best of {MAX_CODE_DRAWS} draws, survivors {best[0]} have an error bound of "
                      f"{best[1]:.3g} (decoding coefficients up to {np.abs(a).max():.2g}, condition number "
                      f"{np.linalg.cond(rows):.2g}). Use FR (gc-fr, s + 1 dividing n), a smaller s, or another "
                      "code_seed")


@dataclass(frozen=True, slots=True)
class Decoding:
    """How to combine the messages of ``workers``: ``sum_k coefficients[k] * m_{workers[k]} = sum_p g_p``."""

    workers: tuple[int, ...]
    coefficients: tuple[float, ...]
    error_bound: float
    """Bound on the float32 decode's error, in units of the mean partition-gradient norm (module doc)."""

    def as_dict(self) -> dict[int, float]:
        return {w: c for w, c in zip(self.workers, self.coefficients) if c != 0.0}


def _worker_id(w: object, n: int) -> int:
    """``w`` as a worker id in 0..n-1; anything else (1.5, True, "0", NaN, None) is refused."""
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)):
        raise PlanError(f"arrived worker ids must be integers in 0..{n - 1}, got {w!r} ({type(w).__name__})")
    if not 0 <= w < n:
        raise PlanError(f"arrived worker id {int(w)} is not in 0..{n - 1}")
    return int(w)


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
        G = partition_grads
        if not isinstance(G, np.ndarray) or G.dtype not in (np.float32, np.float64):
            raise PlanError(f"encode gradients as a float32 or float64 array, got {getattr(G, 'dtype', type(G).__name__)} "
                            "(half loses the decode)")
        if G.ndim != 2 or G.shape[0] != self.n:
            raise PlanError(f"encode needs partition gradients of shape (n={self.n}, d), got {G.shape}")
        return (self.matrix @ G.astype(np.float64)).astype(G.dtype)

    def decodable(self, arrived: Iterable[int]) -> bool:
        return self.decode(arrived) is not None

    def decode(self, arrived: Iterable[int]) -> Decoding | None:
        """The decoding vector for the workers in ``arrived`` (integer ids in 0..n-1, duplicates count
        once), or None if they cannot give the sum within ``MAX_DECODE_BOUND`` in float32.

        FR: one arrived worker per group, coefficient 1 (the lowest id of each group). CR: the
        minimum-norm solution of ``a @ B[A] = 1`` (module doc). Cached per arrived set.
        """
        if isinstance(arrived, (str, bytes)) or not isinstance(arrived, Iterable):
            raise PlanError(f"arrived workers must be an iterable of integer worker ids, got {type(arrived).__name__}")
        key = frozenset(_worker_id(w, self.n) for w in arrived)
        if key in self._cache:
            return self._cache[key]
        result = self._decode_fr(key) if self.scheme == "fr" else self._decode_cr(key)
        self._cache[key] = result
        return result

    def _decode_fr(self, key: frozenset[int]) -> Decoding | None:
        chosen = []
        for group in fr_groups(self.n, self.s):
            present = [w for w in group if w in key]
            if not present:
                return None
            chosen.append(present[0])
        _, bound = decode_bounds(self.matrix, np.array([chosen]), self.s)
        return Decoding(tuple(chosen), (1.0,) * len(chosen), float(bound[0]))

    def _decode_cr(self, key: frozenset[int]) -> Decoding | None:
        workers = tuple(sorted(key))
        if not workers:
            return None
        a, bound = decode_bounds(self.matrix, np.array([workers]), self.s)
        if bound[0] > MAX_DECODE_BOUND and len(workers) > self.n - self.s:  # the lowest n - s were checked
            workers = workers[:self.n - self.s]
            a, bound = decode_bounds(self.matrix, np.array([workers]), self.s)
        if not bound[0] <= MAX_DECODE_BOUND:  # too few workers (rank-deficient), or not accurate enough
            return None
        return Decoding(workers, tuple(float(x) for x in a[0]), float(bound[0]))


def straggler_sets(n: int, s: int) -> Iterable[tuple[int, ...]]:
    """Every set of exactly n - s arrived workers (for exhaustive checks)."""
    return itertools.combinations(range(n), n - s)
