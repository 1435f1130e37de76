"""One replica of one pipeline stage: forward, real autograd backward, gradient accumulation, step.

A plain class (no Ray): ``pdml_ray.actors.pipeline`` wraps it in ``ray.remote``; unit tests drive it
directly. Per micro-batch it keeps the input it received (as a leaf that requires grad, so that
backward yields the gradient to send upstream) and the output it produced, until that micro-batch's
backward. Parameter gradients accumulate across micro-batches in ``param.grad`` until
``sum_grads_and_step`` replaces them with the sum over the stage's replicas and takes one optimizer
step, so every replica of a stage applies the identical update and the replicas stay identical.

Every call returns its result together with a ``CallTiming``: measured compute seconds, plus the
seconds slept to EMULATE a slower device (``pdml_ray.emulation``, speed factor ``speed``). Two
compute modes (``pdml_ray.emulation.COMPUTE_MODES``): ``real`` sleeps (1/speed - 1) x the measured
compute; ``sleep`` runs the real (small) computation for the gradients and then sleeps
samples x ``per_sample_s`` / speed for a forward and ``BACKWARD_SLEEP_FACTOR`` times that for a
backward, so that many actors on a few cores still show each replica's speed exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

from pdml_ray.emulation import COMPUTE_MODES, check_speed, emulate_speed, sleep_compute
from pdml_ray.errors import ConfigError, PlanError, StateError
from pdml_ray.pipeline.layer_moves import LayerPayload, export_layers, move_layers

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

BACKWARD_SLEEP_FACTOR = 2.0
"""In the sleep compute mode a backward sleeps this many times a forward's time (backward ~ 2x forward)."""


@dataclass(frozen=True, slots=True)
class CallTiming:
    """How long one forward or backward call took on the worker (not counting queueing or transfer)."""

    compute_s: float
    """Measured wall time of the real computation, seconds."""
    emulated_s: float
    """Extra seconds slept to emulate a speed factor below 1 (0.0 at full speed)."""
    loss: float | None = None
    """The micro-batch's scaled loss (last stage forward only): the losses of a step sum to the batch mean."""

    @property
    def latency_s(self) -> float:
        """What a scheduler sees: compute plus emulated slowdown, seconds."""
        return self.compute_s + self.emulated_s


class StageWorker:
    """Holds one stage's module copy, its optimizer and the per-micro-batch state for backward."""

    def __init__(self, stage: int, replica: int, num_stages: int, module: nn.Module, *,
                 loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None, lr: float = 0.1,
                 optimizer: OptimizerFactory | None = None, speed: float = 1.0,
                 num_threads: int | None = None, compute: str = "real", per_sample_s: float = 0.0) -> None:
        if compute not in COMPUTE_MODES:
            raise ConfigError(f"compute must be one of {list(COMPUTE_MODES)}, got {compute!r}")
        if compute == "sleep" and not (isinstance(per_sample_s, (int, float)) and 0.0 < per_sample_s < float("inf")):
            raise ConfigError(f"compute='sleep' needs per_sample_s > 0 seconds (e.g. 0.0005), got {per_sample_s!r}")
        if not 0 <= stage < num_stages:
            raise PlanError(f"stage {stage} out of range for {num_stages} stages")
        if stage == num_stages - 1 and loss_fn is None:
            raise PlanError("the last stage computes the loss: pass loss_fn (e.g. nn.MSELoss())")
        if num_threads is not None:
            # Several stage actors share a few cores; one intra-op thread each avoids oversubscription.
            torch.set_num_threads(num_threads)
        self.stage, self.replica, self.num_stages = stage, replica, num_stages
        self.module = module
        self.loss_fn = loss_fn
        self._optimizer_factory = optimizer or (lambda params: torch.optim.SGD(params, lr=lr))
        self.optimizer = self._optimizer_factory(self.module.parameters())
        self.speed = 1.0
        self.set_speed(speed)
        self.compute, self.per_sample_s = compute, float(per_sample_s)
        # microbatch -> (input leaf or None on stage 0, output or scaled loss on the last stage, samples)
        self._saved: dict[int, tuple[Tensor | None, Tensor, int]] = {}

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def describe(self) -> dict[str, float | int]:
        """Identity and size; also a cheap call to wait for the actor to be up."""
        return {"stage": self.stage, "replica": self.replica, "speed": self.speed,
                "params": sum(p.numel() for p in self.module.parameters())}

    def set_speed(self, speed: float) -> None:
        """Emulated speed factor in (0, 1]; 1.0 disables emulation."""
        self.speed = check_speed(speed, f"speed of stage {self.stage} replica {self.replica}")

    # -- one micro-batch --------------------------------------------------------------------------

    def forward(self, microbatch: int, x: Tensor, target: Tensor | None = None,
                loss_scale: float = 1.0) -> tuple[Tensor | None, CallTiming]:
        """Run the stage on ``x`` (b, ...) and keep what backward needs.

        Returns the activations (b, ...) for the next stage, detached; the last stage instead computes
        ``loss_fn(out, target) * loss_scale`` and returns None (the loss value is in the timing).
        ``loss_scale`` is micro-batch size / global batch, so with a mean-reduced loss the
        accumulated gradient is the mean over the global batch.
        """
        if microbatch in self._saved:
            raise PlanError(f"stage {self.stage} replica {self.replica}: forward of micro-batch {microbatch} "
                            "ran twice without its backward")
        start = time.perf_counter()
        samples = int(x.shape[0])
        x_in: Tensor | None = None
        if self.stage > 0:
            # A leaf that requires grad: backward fills x_in.grad, the gradient sent to stage - 1.
            x_in = x.detach().requires_grad_(True)
            x = x_in
        out = self.module(x)
        result: Tensor | None
        loss: float | None = None
        if self.is_last:
            if target is None or self.loss_fn is None:
                raise PlanError(f"last stage forward of micro-batch {microbatch} needs its targets and a loss_fn")
            scaled = self.loss_fn(out, target) * loss_scale
            self._saved[microbatch] = (x_in, scaled, samples)
            result, loss = None, float(scaled.detach())
        else:
            self._saved[microbatch] = (x_in, out, samples)
            result = out.detach()
        compute_s = time.perf_counter() - start
        return result, CallTiming(compute_s, self._slow_down(compute_s, samples, 1.0), loss)

    def backward(self, microbatch: int, grad_output: Tensor | None = None) -> tuple[Tensor | None, CallTiming]:
        """Backpropagate micro-batch ``microbatch``; parameter gradients accumulate.

        ``grad_output`` (b, ...) is d loss / d output from the next stage (None on the last stage,
        which starts from its loss). Returns d loss / d input for the previous stage (None on stage 0).
        """
        if microbatch not in self._saved:
            raise PlanError(f"stage {self.stage} replica {self.replica}: backward of micro-batch {microbatch} "
                            "without its forward on this replica (a backward must run where its forward ran)")
        start = time.perf_counter()
        x_in, out, samples = self._saved.pop(microbatch)
        if self.is_last:
            out.backward()
        else:
            if grad_output is None:
                raise PlanError(f"stage {self.stage} backward of micro-batch {microbatch} needs grad_output")
            out.backward(grad_output)
        grad_input = x_in.grad if x_in is not None else None
        compute_s = time.perf_counter() - start
        return grad_input, CallTiming(compute_s, self._slow_down(compute_s, samples, BACKWARD_SLEEP_FACTOR))

    def _slow_down(self, compute_s: float, samples: int, factor: float) -> float:
        """Sleep to emulate this replica's speed (mode ``compute``); returns the seconds slept."""
        if self.compute == "sleep":
            return sleep_compute(samples, factor * self.per_sample_s, self.speed)
        return emulate_speed(compute_s, self.speed)

    # -- one global step --------------------------------------------------------------------------

    def grads(self) -> list[Tensor]:
        """This replica's accumulated parameter gradients (zeros for a replica that ran nothing)."""
        return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for p in self.module.parameters()]

    def apply_grads(self, summed: Sequence[Tensor]) -> None:
        """Replace the accumulated gradients by ``summed`` (one tensor per parameter, same order)."""
        params = list(self.module.parameters())
        if len(summed) != len(params):
            raise PlanError(f"apply_grads got {len(summed)} tensors for {len(params)} parameters")
        for p, g in zip(params, summed):
            p.grad = g.detach().clone().to(dtype=p.dtype, device=p.device)

    def step(self) -> None:
        """One optimizer step on the current gradients, then zero them."""
        if self._saved:
            raise PlanError(f"stage {self.stage} replica {self.replica}: optimizer step with micro-batches "
                            f"{sorted(self._saved)} still waiting for their backward")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def discard_step(self) -> None:
        """Drop a failed step's saved activations and accumulated gradients (the parameters are untouched)."""
        self._saved.clear()
        self.optimizer.zero_grad(set_to_none=True)

    def sum_grads(self, *replica_grads: Sequence[Tensor]) -> None:
        """Replace the accumulated gradients by the sum of all replicas' (in the order given); no step.

        The first half of ``sum_grads_and_step``: the runtime checks that every stage summed before any
        replica steps, so that a replica lost during the exchange can still be made up for.
        """
        self.apply_grads([torch.stack(list(gs)).sum(dim=0) for gs in zip(*replica_grads)])

    def sum_grads_and_step(self, *replica_grads: Sequence[Tensor]) -> float:
        """Sum the gradients of all replicas of this stage (in the order given), apply, step.

        Every replica receives the same lists in the same order, so each computes the bitwise-same
        sum and the replicas stay identical. Returns the seconds it took.
        """
        start = time.perf_counter()
        summed = [torch.stack(list(gs)).sum(dim=0) for gs in zip(*replica_grads)]
        self.apply_grads(summed)
        self.step()
        return time.perf_counter() - start

    # -- parameters -------------------------------------------------------------------------------

    def get_parameters(self) -> list[Tensor]:
        """Copies of this stage's parameters, in ``module.parameters()`` order."""
        return [p.detach().clone() for p in self.module.parameters()]

    def set_parameters(self, values: Sequence[Tensor]) -> None:
        """Overwrite the parameters and restart the optimizer (its state belonged to the old ones)."""
        params = list(self.module.parameters())
        if len(values) != len(params):
            raise StateError(f"set_parameters got {len(values)} tensors for {len(params)} parameters")
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        self._saved.clear()
        self.optimizer = self._optimizer_factory(self.module.parameters())
        self.optimizer.zero_grad(set_to_none=True)

    # -- layer moves (``pdml_ray.pipeline.layer_moves``), between steps ------------------------------

    def export_layers(self, front: int, back: int) -> tuple[LayerPayload | None, LayerPayload | None]:
        """Copies of this stage's first ``front`` and last ``back`` layers with their optimizer state."""
        return export_layers(self.module, self.optimizer, front, back)

    def move_layers(self, drop_front: int, drop_back: int, add_front: LayerPayload | None,
                    add_back: LayerPayload | None) -> int:
        """Give up layers at either end and take the neighbours' (optimizer state kept); returns the layer count."""
        if self._saved:
            raise PlanError(f"stage {self.stage} replica {self.replica}: layers move between steps, not with "
                            f"micro-batches {sorted(self._saved)} in flight")
        self.module, self.optimizer = move_layers(self.module, self.optimizer, self._optimizer_factory,
                                                  drop_front=drop_front, drop_back=drop_back,
                                                  add_front=add_front, add_back=add_back)
        return len(self.module)
