"""Frozen records that cross process boundaries: what workers report, what the scheduler decides.

The wire format between workers and the scheduler: ``WorkerReport`` goes in; at a decision boundary
(``Boundary``) each enabled deriver may publish one decision (``NodeDecision``, ``SampleDecision``,
...), and rank 0 fetches them together as a ``StepBundle``. Every decision carries ``version`` and
``effective_step``, stamped by the scheduler alone: a worker adopts a decision at exactly its
effective step and never rewrites it, so the scheduler's history and the workers' agree.

Decisions are data: they print, validate, serialise (``to_dict``/``from_dict``) and can be logged
for replay. Runtimes carry them out; nothing here knows about Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pdml_ray.batching import round_to_batch_sizes
from pdml_ray.errors import PlanError
from pdml_ray.pipeline.plan import Plan, validate as validate_plan
from pdml_ray.pipeline.rebalance import LayerMove


MIN_COMPUTE_S = 1e-6
"""Shortest possible compute time of a step (seconds): less is a clock or unit error, never a measurement."""
MAX_COMPUTE_S = 1e6
"""Longest compute time (seconds, ~11.6 days) a step's report may carry."""
MAX_RATE = 1e9
"""Most samples per second one worker can compute: a report implying more is refused, not folded in."""
MAX_SAMPLES = 2 ** 40
"""Most samples one report may carry (one worker's batch in one step)."""
MAX_STEP = 2 ** 62
"""Largest step number a report may carry (steps are int64 in the sample table)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why the scheduler refused a report: the field at fault (counted by kind) and a message."""

    field: str
    message: str


def _integer(x: object) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _real(x: object, nan_ok: bool = False) -> bool:
    """A finite real number (Python or numpy, not a bool); NaN too with ``nan_ok``."""
    if not isinstance(x, (int, float, np.integer, np.floating)) or isinstance(x, (bool, np.bool_)):
        return False
    try:
        v = float(x)
    except OverflowError:  # an int beyond float64
        return False
    return math.isfinite(v) or (nan_ok and math.isnan(v))


def _sequence(x: object) -> bool:
    return isinstance(x, (list, tuple))


def _numbers(x: object) -> bool:
    """A list or tuple of real numbers (their ranges are ``validate``'s business)."""
    return isinstance(x, (list, tuple)) and (all(type(v) is float or type(v) is int for v in x)  # noqa: E721
                                             or all(isinstance(v, (int, float, np.integer, np.floating))
                                                    and not isinstance(v, (bool, np.bool_)) for v in x))


def _integers(xs: tuple) -> bool:
    """All integers (``_integer``); plain ints are checked first, ~5x cheaper (a decision of 256 workers)."""
    return all(type(v) is int for v in xs) or all(_integer(v) for v in xs)  # noqa: E721


def _reals(xs: tuple) -> bool:
    """All finite reals (``_real``); plain finite floats first (``v - v == 0.0``: finite only), ~5x cheaper."""
    return all(type(v) is float and v - v == 0.0 for v in xs) or all(_real(v) for v in xs)  # noqa: E721


def _check_fields(d: object, what: str, required: Mapping[str, Callable[[object], bool]],
                  optional: Mapping[str, type]) -> None:
    """Raise PlanError unless ``d`` is a mapping with every required field passing its check (a
    predicate) and each optional one present only with its type: what a decision's ``from_dict`` reads."""
    if not isinstance(d, Mapping):
        raise PlanError(f"a {what} must be a mapping of its fields, got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    if missing:
        raise PlanError(f"a {what} needs the fields {sorted(required)}; {missing} missing")
    for k, check in required.items():
        if not check(d[k]):
            raise PlanError(f"{what}: field {k!r} has the wrong type ({type(d[k]).__name__}: {d[k]!r:.80})")
    for k, kind in optional.items():
        if k in d and not isinstance(d[k], kind):
            raise PlanError(f"{what}: field {k!r} must be a {kind.__name__}, got {type(d[k]).__name__}")


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """One worker's telemetry for one training step.

    ``compute_s`` is forward + backward + optimizer time excluding any wait on collectives
    (``wait_s``); throughput is ``samples / compute_s``. With emulated speeds, the emulated sleep is
    part of ``compute_s`` (it stands for slower compute). ``forward_only`` of the ``samples`` had a
    forward pass and no backward (Selective-Backprop's low-loss share, where the loop skips their
    backward): the node model counts them at a forward's cost, not a trained sample's
    (``pdml_ray.priority.node``, "Forward-only samples").
    """

    worker_id: int
    step: int
    samples: int
    compute_s: float
    wait_s: float = 0.0
    step_s: float = float("nan")
    """Wall time of the whole step at this worker (compute, waits, scheduler overhead)."""
    overhead_s: float = 0.0
    """Time this worker spent on pdml-ray bookkeeping in the step (reports, decision checks)."""
    loss: float = float("nan")
    grad_norm: float = float("nan")
    accelerator_type: str = "CPU"
    # Per-sample feedback for sample priorities: int64 indices (B,) and float32 losses (B,).
    sample_indices: np.ndarray | None = field(default=None, compare=False)
    sample_losses: np.ndarray | None = field(default=None, compare=False)
    forward_only: int = 0
    """Samples of this step forwarded and not backpropagated (0 <= forward_only <= samples); 0: every
    sample was trained."""

    def problem(self, num_workers: int, num_samples: int | None = None) -> str | None:
        """Why this report must not move any priority, or None if it is sound (``rejection``'s message)."""
        rejection = self.rejection(num_workers, num_samples)
        return None if rejection is None else rejection.message

    def rejection(self, num_workers: int, num_samples: int | None = None) -> "Rejection | None":
        """Why this report must not move any priority (the field at fault and a message naming the fix),
        or None if it is sound. Never raises, whatever the fields hold: this is where reports enter.

        ``num_samples``: the data set size, when known; per-sample indices must lie in [0, num_samples).
        Sound means: integer ids and steps in range; ``samples >= 1`` with a physically possible compute
        time (``MIN_COMPUTE_S <= compute_s <= MAX_COMPUTE_S`` and at most ``MAX_RATE`` samples/s), or
        an idle step (``samples == 0``, a worker given no samples; see ``idle``); finite, non-negative
        times; ``loss`` and ``grad_norm`` finite or NaN (NaN: not measured), never infinite;
        per-sample feedback as two 1-D numpy arrays of equal length, integer indices and finite losses;
        ``0 <= forward_only <= samples``.
        """
        w, step = self.worker_id, self.step
        # Fast path, the common case (plain ints and floats, no per-sample feedback): the same rules in
        # one expression, ~5x cheaper than the checks below, which run for anything it does not pass
        # and give the reason. NaN fails every comparison; ``x - x == 0.0`` holds for finite x only.
        s, c, st, loss, g = self.samples, self.compute_s, self.step_s, self.loss, self.grad_norm
        if (type(w) is int and type(step) is int and type(s) is int and type(c) is float  # noqa: E721
                and type(self.wait_s) is float and type(self.overhead_s) is float and type(st) is float  # noqa: E721
                and type(loss) is float and type(g) is float and type(self.accelerator_type) is str  # noqa: E721
                and self.sample_indices is None and self.sample_losses is None
                and type(self.forward_only) is int and 0 <= self.forward_only <= s  # noqa: E721
                and 0 <= w < num_workers and 0 <= step <= MAX_STEP and 0 < s <= MAX_SAMPLES
                and MIN_COMPUTE_S <= c <= MAX_COMPUTE_S and s <= MAX_RATE * c
                and 0.0 <= self.wait_s <= MAX_COMPUTE_S and 0.0 <= self.overhead_s <= MAX_COMPUTE_S
                and (st != st or 0.0 <= st < math.inf) and (loss != loss or loss - loss == 0.0)
                and (g != g or 0.0 <= g < math.inf)):
            return None
        if not (_integer(w) and 0 <= w < num_workers):
            return Rejection("worker_id", f"unknown worker {w!r} (have {num_workers}, ids 0..{num_workers - 1})")
        where = f"worker {w}"
        if not (_integer(step) and 0 <= step <= MAX_STEP):
            return Rejection("step", f"{where}: step={step!r} must be an integer in [0, {MAX_STEP}]")
        where = f"worker {w} step {step}"
        if not (_integer(self.samples) and 0 <= self.samples <= MAX_SAMPLES):
            return Rejection("samples", f"{where}: samples={self.samples!r} must be an integer in [0, {MAX_SAMPLES}] "
                                        "(> 0 for a measured step)")
        fo = self.forward_only
        if not (_integer(fo) and 0 <= fo <= self.samples):
            return Rejection("forward_only", f"{where}: forward_only={fo!r} must be an integer from 0 to samples="
                                             f"{self.samples} (the samples of this step that had a forward pass and "
                                             "no backward; 0 when every sample was trained)")
        c = self.compute_s
        if not _real(c):
            return Rejection("compute_s", f"{where}: compute_s={c!r} must be a finite number of seconds")
        if self.samples > 0:
            if not (MIN_COMPUTE_S <= c <= MAX_COMPUTE_S):
                return Rejection("compute_s", f"{where}: compute_s={c!r} is not a possible step time; it must lie "
                                              f"in [{MIN_COMPUTE_S:g}, {MAX_COMPUTE_S:g}] seconds")
            if self.samples > MAX_RATE * c:
                return Rejection("compute_s", f"{where}: {self.samples} samples in compute_s={c!r} is "
                                              f"{self.samples / c:.3g} samples/s, more than {MAX_RATE:.0e} samples/s "
                                              "is not a possible measurement")
        elif not (0.0 <= c <= MAX_COMPUTE_S):
            return Rejection("compute_s", f"{where}: compute_s={c!r} must lie in [0, {MAX_COMPUTE_S:g}] seconds")
        for name in ("wait_s", "overhead_s"):
            v = getattr(self, name)
            if not (_real(v) and 0.0 <= v <= MAX_COMPUTE_S):
                return Rejection(name, f"{where}: {name}={v!r} must be a finite number of seconds >= 0")
        for name in ("step_s", "loss", "grad_norm"):  # NaN: not measured
            v = getattr(self, name)
            if not (_real(v, nan_ok=True) and (math.isnan(v) or (name == "loss" or v >= 0.0))):
                return Rejection(name, f"{where}: {name}={v!r} must be a finite number (>= 0 but for loss) or NaN "
                                       "for 'not measured'; a worker whose loss or gradient is infinite is refused")
        if not isinstance(self.accelerator_type, str):
            return Rejection("accelerator_type", f"{where}: accelerator_type={self.accelerator_type!r} must be a string "
                                                 "such as 'A100'")
        idx, losses = self.sample_indices, self.sample_losses
        if (idx is None) != (losses is None):
            return Rejection("sample_losses", f"{where}: sample_indices and sample_losses come together")
        if idx is not None and losses is not None:
            if not (isinstance(idx, np.ndarray) and isinstance(losses, np.ndarray) and idx.ndim == 1
                    and losses.ndim == 1):
                return Rejection("sample_indices", f"{where}: sample_indices and sample_losses must be 1-D numpy "
                                                   f"arrays, got {type(idx).__name__} and {type(losses).__name__}")
            if len(idx) != len(losses):
                return Rejection("sample_losses", f"{where}: {len(idx)} indices vs {len(losses)} losses")
            if idx.dtype.kind not in "iu" or losses.dtype.kind not in "fiu":
                return Rejection("sample_indices", f"{where}: sample_indices must be integers and sample_losses "
                                                   f"numbers, got dtypes {idx.dtype} and {losses.dtype}")
            if len(idx) and num_samples is not None and (int(idx.min()) < 0 or int(idx.max()) >= num_samples):
                return Rejection("sample_indices", f"{where}: sample indices must lie in [0, {num_samples}) "
                                                   "(positions in the data set)")
            with np.errstate(invalid="ignore"):
                if len(losses) and not np.isfinite(losses).all():
                    return Rejection("sample_losses", f"{where}: a per-sample loss is NaN or infinite; the worker's "
                                                      "loss diverged, its report is refused")
        return None

    @property
    def idle(self) -> bool:
        """A step the worker ran with no samples (min_batch = 0): it says the worker is alive, measures nothing."""
        return self.samples == 0

    @property
    def throughput(self) -> float:
        """Compute throughput in samples/s (collective waits excluded)."""
        return self.samples / self.compute_s if self.compute_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class NodeDecision:
    """Per-worker batch sizes and gradient weights, effective from ``effective_step`` on.

    ``grad_weights[i] = batch_sizes[i] / sum(batch_sizes)``: a SUM all-reduce of ``w_i * g_i``, with
    ``g_i`` the mean gradient over worker i's batch, equals the mean gradient over the global batch.
    """

    version: int
    effective_step: int
    batch_sizes: tuple[int, ...]
    grad_weights: tuple[float, ...]
    shares: tuple[float, ...]
    """The un-rounded throughput shares the batch sizes were derived from (sum to 1)."""
    reason: str = ""

    @classmethod
    def uniform(cls, global_batch_size: int, num_workers: int, reason: str = "uniform") -> "NodeDecision":
        shares = np.full(num_workers, 1.0 / num_workers)
        sizes = round_to_batch_sizes(shares, global_batch_size, 0, None)
        return cls.from_sizes(0, 0, sizes, shares, reason)

    @classmethod
    def from_sizes(cls, version: int, effective_step: int, batch_sizes, shares, reason: str = "") -> "NodeDecision":
        sizes = tuple(int(b) for b in batch_sizes)
        total = sum(sizes)
        return cls(version=version, effective_step=effective_step, batch_sizes=sizes,
                   grad_weights=tuple(b / total for b in sizes), shares=tuple(float(s) for s in shares),
                   reason=reason)

    @property
    def global_batch_size(self) -> int:
        return sum(self.batch_sizes)

    def validate(self, global_batch_size: int | None = None, min_batch: int = 0, max_batch: int | None = None,
                 num_workers: int | None = None) -> None:
        """Raise PlanError unless this is a decision the node deriver could have made: one integer batch
        size per worker (``num_workers``, when given) within [min_batch, max_batch] summing to
        ``global_batch_size`` (when given; else to something positive), the weights their batch shares,
        and finite shares >= 0. A new decision and one restored from a checkpoint are checked alike."""
        n = len(self.batch_sizes)
        if n == 0 or len(self.grad_weights) != n or len(self.shares) != n or (num_workers is not None
                                                                              and n != num_workers):
            raise PlanError(f"decision v{self.version}: {n} sizes, {len(self.grad_weights)} weights, "
                            f"{len(self.shares)} shares; expected one of each per worker"
                            + (f" ({num_workers})" if num_workers is not None else ""))
        if not _integers(self.batch_sizes):
            raise PlanError(f"decision v{self.version}: batch sizes {self.batch_sizes!r} must be integers")
        if not (_reals(self.grad_weights) and _reals(self.shares)) or min(self.shares) < 0:
            raise PlanError(f"decision v{self.version}: weights {self.grad_weights!r} and shares {self.shares!r} "
                            "must be finite numbers (shares >= 0)")
        low, high = min(self.batch_sizes), max(self.batch_sizes)
        if low < max(min_batch, 0) or (max_batch is not None and high > max_batch):
            raise PlanError(f"decision v{self.version}: batch sizes {self.batch_sizes} must lie in "
                            f"[{max(min_batch, 0)}, {max_batch if max_batch is not None else 'no cap'}] "
                            "(node_priority.min_batch, max_batch)")
        total = sum(self.batch_sizes)
        if total <= 0 or (global_batch_size is not None and total != global_batch_size):
            raise PlanError(f"decision v{self.version}: batch sizes {self.batch_sizes} sum to {total}, "
                            f"expected {global_batch_size if global_batch_size is not None else 'a positive total'}"
                            " (node_priority.global_batch_size)")
        for b, w in zip(self.batch_sizes, self.grad_weights):
            if abs(w - b / total) > 1e-9:
                raise PlanError(f"decision v{self.version}: weight {w} != batch share {b}/{total}")

    def to_dict(self) -> dict:
        return {"version": self.version, "effective_step": self.effective_step, "batch_sizes": list(self.batch_sizes),
                "grad_weights": list(self.grad_weights), "shares": list(self.shares), "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping) -> "NodeDecision":
        """The decision ``to_dict`` wrote; PlanError if a field is missing or of the wrong type (its
        values are checked by ``validate``)."""
        _check_fields(d, "node decision", {"version": _integer, "effective_step": _integer, "batch_sizes": _numbers,
                                           "grad_weights": _numbers, "shares": _numbers}, {"reason": str})
        return cls(version=int(d["version"]), effective_step=int(d["effective_step"]),
                   batch_sizes=tuple(d["batch_sizes"]), grad_weights=tuple(d["grad_weights"]),
                   shares=tuple(d["shares"]), reason=d.get("reason", ""))

    def __str__(self) -> str:
        sizes = " ".join(str(b) for b in self.batch_sizes)
        return f"NodeDecision v{self.version} @step {self.effective_step}: batch [{sizes}] ({self.reason})"


@dataclass(frozen=True, slots=True)
class SamplePlan:
    """The samples each worker trains on in one step, with their importance weights.

    ``indices[i]`` (int64, shape (b_i,)) and ``weights[i]`` (float32, shape (b_i,)) belong to worker i;
    the loss of worker i is ``mean(weights[i] * per_sample_loss)``. Weights are normalised so that
    their maximum over the whole step is 1 (prioritised-replay convention).
    """

    step: int
    indices: tuple[np.ndarray, ...]
    weights: tuple[np.ndarray, ...]
    backprop_threshold: float | None = None
    """selective-backprop: the cluster's loss percentile (the ``1 - backprop_share`` quantile of the last
    losses the scheduler's table took from every worker); each worker backpropagates its samples at or
    above it. None: each worker's own percentile."""
    feedback: bool = True
    """Whether the table takes this step's per-sample losses. False while the pay switch has priority
    draws off and no probe measures the step's interval: the table would skip them, so the worker
    neither copies them off the device nor sends them (``PaySwitch.wants_losses``)."""
    uniform: bool = False
    """Every weight is 1 (the table drew uniformly): a worker may take the plain mean of the losses
    without reading the weights (``validate`` checks that they are ones). The pay switch's off state
    makes most plans uniform; a per-step check of the weights on the host (a numpy reduction after
    the training step, its code cold) cost ~40 us a step in ``bench sampling``'s control."""

    def validate(self, batch_sizes: tuple[int, ...] | None = None, num_samples: int | None = None) -> None:
        """Raise PlanError unless every worker has a 1-D integer index array and a float weight array of
        the same length (its batch size, when given), indices in [0, num_samples), weights finite >= 0."""
        if not (isinstance(self.indices, (tuple, list)) and isinstance(self.weights, (tuple, list))):
            raise PlanError(f"sample plan step {self.step}: indices and weights must be sequences of arrays, one per worker")
        if len(self.indices) != len(self.weights):
            raise PlanError(f"sample plan step {self.step}: {len(self.indices)} index arrays vs {len(self.weights)} weight arrays")
        if batch_sizes is not None and not (isinstance(batch_sizes, (tuple, list)) and len(batch_sizes) == len(self.indices)
                                            and all(_integer(b) for b in batch_sizes)):
            raise PlanError(f"sample plan step {self.step}: {len(self.indices)} workers' arrays vs batch sizes {batch_sizes!r}")
        if num_samples is not None and not (_integer(num_samples) and num_samples >= 1):
            raise PlanError(f"sample plan step {self.step}: num_samples must be an integer >= 1, got {num_samples!r}")
        for i, (idx, w) in enumerate(zip(self.indices, self.weights)):
            if not (isinstance(idx, np.ndarray) and isinstance(w, np.ndarray) and idx.ndim == 1
                    and idx.dtype.kind in "iu" and w.dtype.kind == "f"):
                raise PlanError(f"sample plan step {self.step}: worker {i} needs a 1-D integer index array and a float "
                                f"weight array, got {type(idx).__name__} and {type(w).__name__}")
            if idx.shape != w.shape:
                raise PlanError(f"sample plan step {self.step}: worker {i} has {idx.shape} indices vs {w.shape} weights")
            if batch_sizes is not None and len(idx) != batch_sizes[i]:
                raise PlanError(f"sample plan step {self.step}: worker {i} got {len(idx)} samples, decision says {batch_sizes[i]}")
            if num_samples is not None and len(idx) and (idx.min() < 0 or idx.max() >= num_samples):
                raise PlanError(f"sample plan step {self.step}: worker {i} index out of [0, {num_samples})")
            if len(w) and not (np.all(np.isfinite(w)) and w.min() >= 0):
                raise PlanError(f"sample plan step {self.step}: worker {i} has negative or non-finite weights")
        if self.uniform and not all(bool(np.all(w == 1.0)) for w in self.weights):
            raise PlanError(f"sample plan step {self.step}: marked uniform, but not every weight is 1")
        if self.backprop_threshold is not None and not (isinstance(self.backprop_threshold, (int, float))
                                                        and math.isfinite(self.backprop_threshold)):
            raise PlanError(f"sample plan step {self.step}: backprop_threshold must be a finite number or None, "
                            f"got {self.backprop_threshold!r}")

    def to_dict(self) -> dict:
        """Plain fields; the index and weight arrays stay numpy arrays (``pdml_ray.state_format`` stores them)."""
        out = {"step": self.step, "indices": list(self.indices), "weights": list(self.weights)}
        if self.backprop_threshold is not None:
            out["backprop_threshold"] = self.backprop_threshold
        if self.uniform:
            out["uniform"] = True
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "SamplePlan":
        """The plan ``to_dict`` wrote; PlanError unless it is well formed (``validate``)."""
        _check_fields(d, "sample plan", {"step": _integer, "indices": _sequence, "weights": _sequence},
                      {"backprop_threshold": float, "uniform": bool})
        plan = cls(step=int(d["step"]), indices=tuple(d["indices"]), weights=tuple(d["weights"]),
                   backprop_threshold=d.get("backprop_threshold"), uniform=d.get("uniform", False))
        plan.validate()
        return plan


@dataclass(frozen=True, slots=True)
class SampleDecision:
    """Sample plans for the steps from ``effective_step`` up to the next decision boundary."""

    version: int
    effective_step: int
    plans: tuple[SamplePlan, ...]

    def validate(self) -> None:
        """Raise PlanError unless every plan is well formed (``SamplePlan.validate``)."""
        if not isinstance(self.plans, (tuple, list)) or not all(isinstance(p, SamplePlan) for p in self.plans):
            raise PlanError(f"sample decision v{self.version}: plans must be a sequence of SamplePlan")
        for plan in self.plans:
            plan.validate()

    def to_dict(self) -> dict:
        return {"version": self.version, "effective_step": self.effective_step,
                "plans": [p.to_dict() for p in self.plans]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "SampleDecision":
        """The decision ``to_dict`` wrote; PlanError unless its plans are well formed."""
        _check_fields(d, "sample decision", {"version": _integer, "effective_step": _integer, "plans": _sequence}, {})
        return cls(version=int(d["version"]), effective_step=int(d["effective_step"]),
                   plans=tuple(SamplePlan.from_dict(p) for p in d["plans"]))

    def __str__(self) -> str:
        steps = f"{self.plans[0].step}..{self.plans[-1].step}" if self.plans else "none"
        return f"SampleDecision v{self.version} @step {self.effective_step}: plans for steps {steps}"


@dataclass(frozen=True, slots=True)
class GradientDecision:
    """Per-worker gradient priorities and the top-K rule, effective from ``effective_step`` on.

    A straggler-tolerant policy applies, of the gradients that arrived in a step, the top
    ``k_fraction`` by ``priorities`` plus every worker not applied for ``max_wait`` steps
    (``pdml_ray.priority.gradient.select_topk``); an asynchronous one weighs a gradient ``s`` steps stale
    by ``staleness_weight(s, max_staleness)`` and refuses it beyond ``max_staleness``.
    """

    version: int
    effective_step: int
    priorities: tuple[float, ...]
    """One priority per worker (>= 0; higher = apply first): alpha * grad + beta * data + gamma * node."""
    k_fraction: float
    """Fraction of the arrived gradients to apply, in (0, 1]."""
    weights: tuple[float, float, float]
    """(alpha, beta, gamma) the priorities were combined with."""
    max_wait: int
    """No-starvation bound M (steps)."""
    max_staleness: int
    """Staleness bound S (steps) for asynchronous policies."""
    reason: str = ""

    def validate(self, num_workers: int | None = None) -> None:
        """Raise PlanError unless priorities are finite and >= 0 (one per worker), K in (0, 1], weights on
        the simplex and the bounds non-negative."""
        n = len(self.priorities)
        if n == 0 or (num_workers is not None and n != num_workers):
            raise PlanError(f"gradient decision v{self.version}: {n} priorities, expected {num_workers}")
        if not (_reals(self.priorities) and min(self.priorities) >= 0):
            raise PlanError(f"gradient decision v{self.version}: priorities must be finite and >= 0, got {self.priorities}")
        if not (_real(self.k_fraction) and 0.0 < self.k_fraction <= 1.0):
            raise PlanError(f"gradient decision v{self.version}: k_fraction {self.k_fraction} not in (0, 1]")
        if (len(self.weights) != 3 or not all(_real(w) for w in self.weights) or min(self.weights) < 0
                or abs(sum(self.weights) - 1.0) > 1e-6):
            raise PlanError(f"gradient decision v{self.version}: weights {self.weights} are not on the simplex")
        if not (_integer(self.max_wait) and _integer(self.max_staleness) and self.max_wait >= 1
                and self.max_staleness >= 0):
            raise PlanError(f"gradient decision v{self.version}: max_wait {self.max_wait} must be >= 1 and "
                            f"max_staleness {self.max_staleness} >= 0")

    def to_dict(self) -> dict:
        return {"version": self.version, "effective_step": self.effective_step, "priorities": list(self.priorities),
                "k_fraction": self.k_fraction, "weights": list(self.weights), "max_wait": self.max_wait,
                "max_staleness": self.max_staleness, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping) -> "GradientDecision":
        """The decision ``to_dict`` wrote; PlanError if a field is missing or of the wrong type (its
        values are checked by ``validate``)."""
        _check_fields(d, "gradient decision", {"version": _integer, "effective_step": _integer,
                                               "priorities": _numbers, "k_fraction": _real, "weights": _numbers,
                                               "max_wait": _integer, "max_staleness": _integer}, {"reason": str})
        if len(d["weights"]) != 3:
            raise PlanError(f"gradient decision: weights must be (alpha, beta, gamma), got {d['weights']!r:.80}")
        w = tuple(float(x) for x in d["weights"])
        return cls(version=d["version"], effective_step=d["effective_step"],
                   priorities=tuple(float(p) for p in d["priorities"]), k_fraction=float(d["k_fraction"]),
                   weights=(w[0], w[1], w[2]), max_wait=int(d["max_wait"]), max_staleness=int(d["max_staleness"]),
                   reason=d.get("reason", ""))

    def __str__(self) -> str:
        pri = " ".join(f"{p:.3g}" for p in self.priorities)
        a, b, g = self.weights
        return (f"GradientDecision v{self.version} @step {self.effective_step}: priorities [{pri}], "
                f"K {self.k_fraction:.2f}, weights ({a:.2f}, {b:.2f}, {g:.2f}) ({self.reason})")


@dataclass(frozen=True, slots=True)
class MicroBatchPlan:
    """The pipeline axis's decision: the micro-batch plan of the global step ``effective_step``.

    ``record`` is the adaptive schedule's reason for it (osprey's lane weights and bottlenecks, auto's
    choice), a JSON-able dict; None for a static schedule. ``layer_move``: layers that move between
    stages before this step runs (``pdml_ray.pipeline.rebalance``), or None."""

    version: int
    effective_step: int
    plan: Plan
    record: Mapping | None = None
    layer_move: LayerMove | None = None

    def validate(self) -> None:
        """Raise PlanError unless the plan is well formed (``pdml_ray.pipeline.plan.validate``)."""
        if not isinstance(self.plan, Plan):
            raise PlanError(f"micro-batch plan v{self.version}: plan must be a Plan, got {type(self.plan).__name__}")
        validate_plan(self.plan)

    def to_dict(self) -> dict:
        return {"version": self.version, "effective_step": self.effective_step, "plan": self.plan.to_dict(),
                "record": dict(self.record) if self.record is not None else None,
                "layer_move": self.layer_move.to_dict() if self.layer_move is not None else None}

    @classmethod
    def from_dict(cls, d: dict) -> "MicroBatchPlan":
        """The decision ``to_dict`` wrote; the plan is validated (PlanError otherwise)."""
        if not isinstance(d, dict) or not {"version", "effective_step", "plan"} <= set(d):
            raise PlanError("a micro-batch plan must be a mapping with version, effective_step and plan")
        move = d.get("layer_move")
        return cls(version=d["version"], effective_step=d["effective_step"], plan=Plan.from_dict(d["plan"]),
                   record=d.get("record"), layer_move=LayerMove.from_dict(move) if move is not None else None)

    def __str__(self) -> str:
        p = self.plan
        return (f"MicroBatchPlan v{self.version} @step {self.effective_step}: {p.schedule or 'plan'} over "
                f"{p.num_stages} stages x {list(p.replicas)}, {p.num_microbatches} micro-batches")


P3_METHODS = ("config", "rule")
"""How a ``P3Decision`` was made: ``config`` (``P3Config``'s fixed slice size and credit, published as they
are), ``rule`` (``pdml_ray.p3.auto.tune`` over the measured link)."""
MAX_SLICE_ELEMENTS = 1 << 40
"""Most elements a P3 slice or credit window may span (``P3Config``'s bound on its fields)."""


@dataclass(frozen=True, slots=True)
class P3Decision:
    """The P3 axis's decision: the slice size and credit window both P3 runtimes run with, from
    ``effective_step`` on, and the link figures it was derived from (NaN where nothing was measured)."""

    version: int
    effective_step: int
    slice_elements: int
    """Elements (parameters) per slice; a layer's last slice may be smaller."""
    credit_bytes: int
    """Bytes in flight at most on a link (the window no longer overtakeable)."""
    method: str
    """``config`` or ``rule`` (``P3_METHODS``)."""
    bandwidth_Bps: float = float("nan")
    """The link's measured (or EMULATED) bandwidth, bytes/s, the rule decided from; NaN for ``config``."""
    latency_s: float = float("nan")
    """Its one-way latency, seconds; NaN for ``config``."""
    overhead_s: float = float("nan")
    """Its per-message overhead, seconds; NaN for ``config``."""
    reason: str = ""

    def validate(self) -> None:
        """Raise PlanError unless the slice size and credit are integers in [1, 2^40], the method a known
        one, and the link figures of a ``rule`` decision finite (bandwidth > 0, latency and overhead >= 0)."""
        if not (_integer(self.slice_elements) and _integer(self.credit_bytes)
                and 1 <= self.slice_elements <= MAX_SLICE_ELEMENTS and 1 <= self.credit_bytes <= MAX_SLICE_ELEMENTS):
            raise PlanError(f"P3 decision v{self.version}: slice_elements {self.slice_elements!r:.40} and credit_bytes "
                            f"{self.credit_bytes!r:.40} must be integers in [1, 2^40]")
        if self.method not in P3_METHODS:
            raise PlanError(f"P3 decision v{self.version}: method {self.method!r:.40} is not one of {P3_METHODS}")
        link = (self.bandwidth_Bps, self.latency_s, self.overhead_s)
        if not all(_real(v, nan_ok=True) for v in link) or (
                self.method == "rule" and not (_reals(link) and self.bandwidth_Bps > 0 and min(link) >= 0)):
            raise PlanError(f"P3 decision v{self.version}: link figures {link!r:.120} must be numbers; a rule's "
                            "finite, bandwidth > 0, latency and overhead >= 0")

    def to_dict(self) -> dict:
        return {"version": self.version, "effective_step": self.effective_step,
                "slice_elements": self.slice_elements, "credit_bytes": self.credit_bytes, "method": self.method,
                "bandwidth_Bps": self.bandwidth_Bps, "latency_s": self.latency_s, "overhead_s": self.overhead_s,
                "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping) -> "P3Decision":
        """The decision ``to_dict`` wrote; PlanError if a field is missing or of the wrong type (its
        values are checked by ``validate``)."""
        _check_fields(d, "P3 decision", {"version": _integer, "effective_step": _integer,
                                         "slice_elements": _integer, "credit_bytes": _integer,
                                         "method": lambda m: isinstance(m, str),
                                         "bandwidth_Bps": lambda v: _real(v, nan_ok=True),
                                         "latency_s": lambda v: _real(v, nan_ok=True),
                                         "overhead_s": lambda v: _real(v, nan_ok=True)}, {"reason": str})
        return cls(version=int(d["version"]), effective_step=int(d["effective_step"]),
                   slice_elements=int(d["slice_elements"]), credit_bytes=int(d["credit_bytes"]), method=d["method"],
                   bandwidth_Bps=float(d["bandwidth_Bps"]), latency_s=float(d["latency_s"]),
                   overhead_s=float(d["overhead_s"]), reason=d.get("reason", ""))

    def __str__(self) -> str:
        link = (f" for {self.bandwidth_Bps * 8 / 1e9:.3g} Gb/s, latency {self.latency_s * 1e6:.0f} us, overhead "
                f"{self.overhead_s * 1e6:.0f} us" if self.method == "rule" else "")
        return (f"P3Decision v{self.version} @step {self.effective_step}: slice {self.slice_elements:,d} elements, "
                f"credit {self.credit_bytes:,d} bytes ({self.method}{link})")


class Decision(Protocol):
    """What every deriver's decision record has: the scheduler stamps both fields (and nothing else)."""

    @property
    def version(self) -> int: ...

    @property
    def effective_step(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Boundary:
    """A decision boundary as rank 0 asks for it: decisions for ``num_steps`` steps from ``first_step``."""

    first_step: int
    num_steps: int
    batch_sizes: tuple[int, ...]
    """The per-worker batch sizes the workers run with unless a new node decision comes."""


@dataclass(frozen=True, slots=True)
class StepBundle:
    """What rank 0 fetches at a decision boundary: per enabled deriver (by registry name), the decision
    to adopt at the bundle's first step; a deriver with nothing new has no entry."""

    decisions: Mapping[str, Decision] = field(default_factory=dict)

    def get(self, name: str) -> Decision | None:
        return self.decisions.get(name)

    def __bool__(self) -> bool:
        return bool(self.decisions)
