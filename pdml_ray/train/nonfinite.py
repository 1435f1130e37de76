"""The non-finite guard's rule and state, apart from the step block that runs it (``step.StepScope``).

**Non-finite losses and gradients** (``NodePriorityConfig.check_nonfinite``, on by default). A worker
whose per-sample losses are not all finite is *excluded* from the step: its gradient counts for
nothing and the others' weights are renormalised over the workers that remain
(``w_i' = w_i ok_i / sum_j w_j ok_j``), so the step's update is the mean gradient over the good
workers' samples. Every rank learns which workers were excluded from one all-reduce of a
``3 x world_size`` vector, the same collective on every rank, so nobody waits for a collective another
skipped. Under DDP that vector travels inside backward, appended to the first gradient bucket (no
synchronisation point and no collective are added to the step; see ``wrappers``); under FSDP2 and P3
``step.loss`` all-reduces it before returning. After backward the combined gradient is checked once more (it is
identical on every rank under DDP; FSDP2 agrees on its shards with one more tiny all-reduce): if it is
still not finite (an overflow inside backward while every loss was finite), or every worker was
excluded, the step's gradients are dropped (``p.grad = None``), so the ``optimizer.step()`` that
follows leaves the parameters and the optimizer's state (momentum, Adam's moments and step count) as
they were. The check runs at the end of the block, or earlier if an optimizer steps inside it: a
global optimizer step pre-hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``,
installed with the first step block) runs the open block's check before any ``optimizer.step()``,
so an ``optimizer.step()`` inside the block after backward never applies a non-finite step.
``step.excluded`` (ranks), ``step.dropped`` and ``ctx.nonfinite`` (counts per worker) say what happened; an excluded worker's step is reported with loss NaN and no per-sample losses (a NaN
would poison the sample priorities). A worker excluded ``max_consecutive_nonfinite`` steps in a row
(or that many dropped steps in a row) ends the run: every rank raises ``NonFiniteError`` naming the
worker (rank and accelerator type) and the step.

Not caught: a NaN that reaches the gradients of a finite loss on one rank is only seen after the
reduction (the whole step is dropped, the worker is not named); an ``optimizer.step()`` inside the
block *before* backward (it sees no gradient of this step); a loss computed outside ``step.loss``
is not checked at all; P3 ordering applies its per-layer updates itself, so a dropped step still
updates under P3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(slots=True)
class NonFiniteCounts:
    """What the non-finite guard did so far on this worker (the same on every rank): ``ctx.nonfinite``."""

    world_size: int
    limit: int
    """``max_consecutive_nonfinite``: the run ends when a count of consecutive steps reaches it."""
    excluded: list[int] = field(default_factory=list)
    """Per worker (by rank): steps whose contribution was excluded for a NaN or infinite loss."""
    consecutive: list[int] = field(default_factory=list)
    """Per worker: excluded steps in a row up to the latest step."""
    dropped_steps: int = 0
    """Steps whose gradients were dropped: every worker excluded, or the combined gradient not finite."""
    consecutive_dropped: int = 0
    events: list[tuple[int, tuple[int, ...], bool]] = field(default_factory=list)
    """The latest 100 steps with an exclusion or a drop: (step, excluded ranks, dropped)."""

    _in_a_row: bool = True
    """Some count in ``consecutive`` may be above 0 (False: all are 0, the common case)."""

    def __post_init__(self) -> None:
        self.excluded = self.excluded or [0] * self.world_size
        self.consecutive = self.consecutive or [0] * self.world_size

    @property
    def total_excluded(self) -> int:
        return sum(self.excluded)

    def record(self, step: int, bad: tuple[int, ...], dropped: bool) -> tuple[int | None, int] | None:
        """Count one step; returns (the rank that reached the limit, or None for dropped steps, and its
        count) when the run must stop."""
        if bad or self._in_a_row:  # a clean step after clean steps (nearly every step) touches no list
            for j in range(self.world_size):
                if j in bad:
                    self.excluded[j] += 1
                    self.consecutive[j] += 1
                else:
                    self.consecutive[j] = 0
            self._in_a_row = bool(bad)
        grads_only = dropped and not bad  # finite losses everywhere, non-finite combined gradient
        self.dropped_steps += int(dropped)
        self.consecutive_dropped = self.consecutive_dropped + 1 if grads_only else 0
        if bad or dropped:
            self.events = (self.events + [(step, bad, dropped)])[-100:]
        if bad:
            worst = max(bad, key=lambda j: self.consecutive[j])
            if self.consecutive[worst] >= self.limit:
                return worst, self.consecutive[worst]
        if self.consecutive_dropped >= self.limit:
            return None, self.consecutive_dropped
        return None


def grads_nonfinite(params: list[torch.nn.Parameter], sharded: bool, device: torch.device) -> torch.Tensor:
    """A 1-element float32 tensor on ``device``, > 0 when any gradient holds an inf or a NaN; the same
    on every rank (under FSDP2 each rank holds a shard, so the ranks agree with one tiny all-reduce).
    Nothing waits for the device here: the caller reads it together with the step's flags, one
    synchronisation per step. DDP does not come here: its hook has the answer from the squared norms it
    takes of each bucket anyway (``wrappers.DDPHook.combined_nonfinite``).

    The check is PyTorch's own (``torch._amp_foreach_non_finite_check_and_unscale_`` with a scale of
    1, as ``torch.amp.GradScaler`` runs it): one fused kernel per device and dtype instead of a kernel
    per gradient, which matters on a GPU where a model's hundreds of small launches cost milliseconds
    (and ~3x faster on a CPU too, measured)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        g = g.to_local() if hasattr(g, "to_local") else g
        if g.numel() and not g.is_sparse:
            groups.setdefault((g.device, g.dtype), []).append(g)
    found = torch.zeros(1, device=device)
    for (dev, _), grads in groups.items():
        flag = torch.zeros(1, device=dev)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, torch.ones(1, device=dev))
        found += flag.to(device)
    if sharded and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(found)
    return found
