"""The straggler-policy seam: a policy decides, as data, what each worker computes and sends, when a
step has enough results, and how to combine them. Policies are pure (no Ray, no clocks).

Per step and worker a policy gives a ``WorkerTask``: the partitions to compute fresh and the coded
message to send, ``m_i = sum_(p, c) c * g_p`` over the worker's LATEST gradient ``g_p`` of each
partition p (computed this step or earlier). The worker answers with an ``Arrival`` naming, for each
term, the step at which that gradient was computed. ``ready(step, arrivals, alive)`` says whether the
arrivals so far suffice; ``combine(step, arrivals)`` returns a ``Combination``: one weight per worker,
so the applied gradient is ``sum_i w_i m_i`` (``combine_messages``), plus exactly what that sum
contains, per (partition, computed step), with which total weight.

Gradient target, for every policy: the MEAN over the P data partitions of the partition gradients,
``(1/P) sum_p g_p`` (each partition's gradient is the mean over its samples; partitions are equal in
size), i.e. the full-batch gradient. A combination is ``exact`` when its contents hold every
partition exactly once, at one version, with weight 1/P; ``max_staleness`` says how old those
versions are (0 for fresh gradients).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Mapping, Sequence

import torch

from pdml_ray.errors import PlanError

if TYPE_CHECKING:
    from pdml_ray.config.gradient import GradientPriorityConfig
    from pdml_ray.decisions import GradientDecision


@dataclass(frozen=True, slots=True)
class WorkerTask:
    """What ``worker`` does at ``step``: compute ``compute`` fresh, then send ``sum c * g_p`` over ``send``."""

    worker: int
    step: int
    compute: tuple[int, ...]
    send: tuple[tuple[int, float], ...]
    """(partition, coefficient) pairs of the message; the gradient used is the latest of that partition."""
    catch_up: tuple[tuple[int, int], ...] = ()
    """(partition, at_step): recompute a gradient the worker missed, at the parameters published at
    ``at_step`` (pipelined coding keeps every holder of a partition on the same version this way)."""

    @property
    def param_steps(self) -> tuple[int, ...]:
        """The older steps whose parameters the worker needs besides this step's, ascending."""
        return tuple(sorted({s for _, s in self.catch_up}))

    @property
    def partitions_computed(self) -> int:
        return len(self.compute) + len(self.catch_up)


@dataclass(frozen=True, slots=True)
class Arrival:
    """A worker's answer for ``step``: the terms its message holds, (partition, coefficient, computed_step)."""

    worker: int
    step: int
    terms: tuple[tuple[int, float, int], ...]

    def versions(self) -> dict[int, int]:
        return {p: v for p, _, v in self.terms}

    @property
    def oldest(self) -> int:
        """Oldest computed step among the message's terms (the freshness of the whole message)."""
        return min((v for _, _, v in self.terms), default=-1)


@dataclass(frozen=True, slots=True)
class PartitionTerm:
    """``weight * g_p`` as computed at ``computed_step``: one term of what a combination contains."""

    partition: int
    computed_step: int
    weight: float


@dataclass(frozen=True, slots=True)
class Combination:
    """How the aggregator combines the messages of step ``step``, and what the result contains."""

    step: int
    weights: tuple[tuple[int, float], ...]
    """(worker, weight): the applied gradient is ``sum w * message``."""
    contents: tuple[PartitionTerm, ...]
    """Total weight per (partition, computed step) in the applied gradient (terms with |w| < 1e-12 dropped)."""
    num_partitions: int
    exact: bool
    """Every partition exactly once, at one version, with weight 1 / num_partitions (to 1e-6 relative)."""
    decode_error: float = 0.0
    """Gradient codes: the bound on the float32 decode's error, in units of the mean partition-gradient
    norm (``coding.Decoding.error_bound``, from the code's matrix alone); 0 for plain averages."""
    note: str = ""

    @property
    def partitions(self) -> frozenset[int]:
        return frozenset(t.partition for t in self.contents)

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(p for p in range(self.num_partitions) if p not in self.partitions)

    @property
    def max_staleness(self) -> int:
        return max((self.step - t.computed_step for t in self.contents), default=0)

    @property
    def mix(self) -> float:
        """max over partitions of sum_versions |weight| x P: 1.0 when each partition is in once at one
        version; larger when versions of a partition mix with coefficients of both signs (pgc-cr)."""
        per: dict[int, float] = defaultdict(float)
        for t in self.contents:
            per[t.partition] += abs(t.weight)
        return max(per.values(), default=0.0) * self.num_partitions

    def describe(self) -> str:
        terms = " ".join(f"g{t.partition}@{t.computed_step}x{t.weight * self.num_partitions:.3g}"
                         for t in sorted(self.contents, key=lambda t: (t.partition, t.computed_step)))
        return (f"step {self.step}: {'exact' if self.exact else 'approximate'} ({self.note}); contents x1/P: {terms}; "
                f"max staleness {self.max_staleness}")


def make_combination(step: int, weights: Mapping[int, float], arrivals: Sequence[Arrival], num_partitions: int,
                     decode_error: float = 0.0, note: str = "") -> Combination:
    """The combination of ``weights`` over ``arrivals``, with its contents computed term by term."""
    by_worker = {a.worker: a for a in arrivals}
    missing = [w for w in weights if w not in by_worker]
    if missing:
        raise PlanError(f"step {step}: weights for workers {missing} that did not arrive")
    total: dict[tuple[int, int], float] = defaultdict(float)
    for w, weight in weights.items():
        for p, c, v in by_worker[w].terms:
            total[(p, v)] += weight * c
    contents = tuple(PartitionTerm(p, v, x) for (p, v), x in sorted(total.items()) if abs(x) > 1e-12)
    target = 1.0 / num_partitions
    seen = [t.partition for t in contents]
    exact = (sorted(seen) == list(range(num_partitions))
             and all(abs(t.weight - target) <= 1e-6 * target for t in contents))
    return Combination(step, tuple(sorted((int(w), float(x)) for w, x in weights.items())), contents, num_partitions,
                       exact, decode_error, note)


def combine_messages(combination: Combination, messages: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """``sum_i w_i m_i`` accumulated in float64 (messages are float32 or wider, 1-D and of one length),
    returned in float64. A message that is missing, of another shape or dtype, or that makes the sum
    NaN or infinite is refused with a PlanError naming the worker (a NaN would reach the parameters)."""
    out: torch.Tensor | None = None
    for worker, weight in combination.weights:
        m = messages.get(worker)
        if not isinstance(m, torch.Tensor):
            raise PlanError(f"step {combination.step}: worker {worker}'s message is {type(m).__name__}, not a tensor")
        if m.dtype not in (torch.float32, torch.float64):
            raise PlanError(f"worker {worker}'s message is {m.dtype}; send float32 or wider (half loses the decode)")
        if m.dim() != 1 or (out is not None and m.shape != out.shape):
            raise PlanError(f"step {combination.step}: worker {worker}'s message has shape {tuple(m.shape)}; every "
                            f"message is one flat gradient of the same length{f' ({out.numel()})' if out is not None else ''}")
        term = weight * m.to(torch.float64)
        out = term if out is None else out + term
    if out is None:
        raise PlanError(f"step {combination.step}: a combination of no messages")
    if not bool(torch.isfinite(out).all()):
        bad = [w for w, _ in combination.weights if not bool(torch.isfinite(messages[w]).all())]
        raise PlanError(f"step {combination.step}: the combined gradient is NaN or infinite (non-finite messages "
                        f"from workers {bad}); check those workers' data and learning rate")
    return out


class StragglerPolicy(ABC):
    """One straggler policy: tasks, readiness, combination. Built by name from ``registry.POLICIES``.

    ``workers`` is n (data partitions of the main policies), ``stragglers`` is s (for ``backup``, the
    number b of backup workers). ``num_workers`` actors are needed; ``num_partitions`` partitions.
    """

    name: ClassVar[str] = ""
    asynchronous: ClassVar[bool] = False
    """True: a worker keeps computing across steps (it gets a new task only when ``gives_task`` says so)
    and an arrival from an older step is this step's too; False: every alive worker gets every step's
    task, which cuts its older one short, and only this step's arrivals count."""
    gradient_priority: GradientPriorityConfig | None = None
    """Set by policies that act on gradient priorities (topk, async): the runtime then feeds the step's
    reports to an in-process scheduler with these derivers (``pdml_ray.stragglers.gradient_feed``) and
    hands its decisions to ``adopt``."""

    def __init__(self, workers: int, stragglers: int, seed: int = 0) -> None:
        self.n, self.s, self.seed = int(workers), int(stragglers), int(seed)

    def gives_task(self, worker: int, step: int, in_flight: int | None) -> bool:
        """Whether ``worker``, still computing the task of step ``in_flight`` (None: idle), gets ``step``'s
        task (which cuts the older one short). Synchronous policies: always."""
        return True

    def adopt(self, decision: GradientDecision) -> None:
        """A new gradient-priority decision (only policies with ``gradient_priority`` get any)."""

    @property
    def num_workers(self) -> int:
        return self.n

    @property
    def num_partitions(self) -> int:
        return self.n

    @abstractmethod
    def placement(self, worker: int) -> tuple[int, ...]:
        """Partitions whose data ``worker`` holds."""

    @abstractmethod
    def task(self, worker: int, step: int) -> WorkerTask: ...

    @abstractmethod
    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        """Whether the arrivals so far (worker -> Arrival, this step only) are enough to combine."""

    @abstractmethod
    def feasible(self, alive: frozenset[int]) -> bool:
        """Whether steps can still complete with only the workers in ``alive``."""

    @abstractmethod
    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        """The combination of this step's arrivals (in arrival order); call only once ``ready``."""

    def describe(self) -> str:
        return f"{self.name}(n={self.n}, s={self.s})"


class OnePartitionEach(StragglerPolicy):
    """Shared by sync, ignore-stragglers and backup: worker i holds and computes partition i only."""

    def placement(self, worker: int) -> tuple[int, ...]:
        return (worker,)

    def task(self, worker: int, step: int) -> WorkerTask:
        return WorkerTask(worker, step, (worker,), ((worker, 1.0),))

    def average(self, step: int, arrivals: Sequence[Arrival], note: str) -> Combination:
        """Rescaled mean of the arrived partitions: weight 1/k each for k arrivals (unbiased when who
        arrives does not depend on the data)."""
        k = len(arrivals)
        return make_combination(step, {a.worker: 1.0 / k for a in arrivals}, arrivals, self.num_partitions, note=note)
