"""Per-worker gradient weights ``w_i = b_i / B`` through the standard wrappers: DDP and FSDP2.

Every rank must end with ``sum_i w_i g_i`` (``g_i``: the mean gradient over its own ``b_i`` samples),
the mean gradient over the global batch. How each wrapper gets there:

- **DDP** (``DistributedDataParallel``): a communication hook. DDP's default hook divides each
  bucket by the world size after a SUM all-reduce; ours multiplies the bucket by ``w_i`` before it
  instead, so the SUM is the weighted sum. No extra pass over the gradients, nothing changes in the
  user's loss, and DDP keeps doing everything else it does (bucketing, overlap with backward,
  ``no_sync`` accumulation, buffers such as BatchNorm's running statistics broadcast from rank 0).
  The hook also notes when the last bucket became ready: that is when backward's compute ended, so
  compute time excludes the all-reduce and the wait for slower ranks that ``backward()`` blocks on.
- **FSDP2** (``fully_shard``): its reduce-scatter averages over ranks, and it offers no per-bucket
  hook, so the loss is scaled by ``w_i * world_size``: the average of ``w_i N g_i`` is ``sum w_i g_i``.
  Its collectives run inside forward and backward (an all-gather before each sharded module, a
  reduce-scatter after its backward), each waiting for every rank: each parameter group's
  ``unshard``, ``wait_for_unshard``, ``post_backward`` and ``finalize_backward`` is bracketed by the
  step timer's ``pause()``/``resume()``, so compute time is the model's compute without them
  (otherwise a fast rank's time holds its wait for a slow one and the shares drift towards equal).
  FSDP2 has no public hook there; the brackets wrap those methods of each ``FSDPParamGroup`` (torch
  2.11 to 2.13; 2.11 keeps one group per module, 2.13 a list), and where they are missing the compute
  time includes the collectives (``timed_comm`` False).
- **A plain module** is wrapped in DDP (as ``ray.train.torch.prepare_model`` does) and gets the
  hook. pdml-ray's own bucketed weighted all-reduce was removed: side by side with DDP's hook it did
  not measurably win (``bench hetero``: speedup 1.87 vs 1.80, inside the repeats' spread), and DDP
  brings buffers, ``no_sync`` and years of tuning.

**Collectives inside DDP's forward.** DDP broadcasts rank 0's buffers (BatchNorm's running statistics)
at the start of every forward, a collective that waits for rank 0: the time between DDP's forward and
the user module's forward is bracketed the same way (two forward pre-hooks).

**BatchNorm** (``NodePriorityConfig.batchnorm``). BatchNorm layers that normalise over the rank's own
batch (torch's ``_BatchNorm``, not ``SyncBatchNorm``) see ``b_i`` samples, not B: with node priorities a
slow worker's few samples would normalise by noise. ``prepare_batchnorm`` finds them; by default
(``"floor"``) it returns a floor, ``batchnorm_min_batch``, that the context announces to the scheduler
and every decision then keeps; ``"sync"`` converts them to ``SyncBatchNorm`` (statistics over the global
batch, GPUs only), which needs no floor. With ``SyncBatchNorm`` in a DDP model the weight ``w_i`` goes
on the loss instead of the buckets (``DDPHook.loss_scale``): SyncBatchNorm's backward sums the ranks'
output gradients, which are then exactly the global batch's.

**Non-finite losses** (``step.loss``, ``NodePriorityConfig.check_nonfinite``): a rank whose loss is
NaN or infinite contributes nothing to the step, and the others' weights are renormalised over the
ranks that remain, ``w_i' = w_i ok_i / sum_j w_j ok_j`` (the weights sum to 1). Under DDP this
happens inside the hook, with no extra synchronisation point and no extra collective: the step's
first bucket carries a ``3 x world_size`` vector appended to it (which ranks are excluded,
``w_j ok_j``, ``w_j``; a half-precision bucket sends it in its own float64 all-reduce instead), every
bucket of an excluded rank is zeroed before its all-reduce (its NaN never leaves it), and each
reduced bucket is multiplied by ``sum_j w_j / sum_j w_j ok_j`` (only when some rank was excluded).
Whether the combined gradient is finite (it can overflow where every loss was finite) comes from the
squared norms the hook takes of each bucket anyway (each rank's ``grad_norm``): the step's last bucket
carries every rank's sum of them (or, after an earlier first bucket, one float64 all-reduce of its own),
and that sum is finite exactly when nothing sent was an inf, a NaN or above ~1.8e19
(``DDPHook.combined_nonfinite``). It replaced a pass over every gradient after backward, a memory-bound
check that on ``bench hetero``'s real-compute model (1.3 M parameters, 2 cores) cost ~0.7% of the step.
Under FSDP2 (and P3) the vector is all-reduced in ``step.loss`` itself (FSDP2's compute time already
includes its collectives); an excluded rank's reduce-scatter input is zeroed by a custom
reduce-scatter installed on every ``fully_shard`` module.

FSDP1 (``FullyShardedDataParallel``) and other wrappers are refused with a message naming the
supported ones: their reductions would silently average the weighted gradients again.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from pdml_ray.config.node import NodePriorityConfig
from pdml_ray.errors import ConfigError, UsageError
from pdml_ray.train.timing import StepTimer

Sync = Literal["auto", "ddp"]


class GradientCombiner:
    """What a step needs from a wrapper: arm the weight, scale the loss, and when compute ended. (The
    combination itself completes inside backward, in DDP's or FSDP2's own reduction.)"""

    name = "none"
    on_compute_end: Callable[[], None] | None = None
    """Called (cheaply, never blocking) where backward's compute is known to end: DDP's last bucket."""
    weight: float = 1.0
    comm_timer: StepTimer | None = None
    """The step timer whose ``pause()``/``resume()`` bracket collectives inside the compute (set by the
    context at ``prepare_model``)."""
    timed_comm: bool = True
    """Whether collectives inside forward and backward are kept out of the compute time."""

    def pause(self) -> None:
        """A collective starts inside the step's compute (cheap; from module hooks on any thread)."""
        if self.comm_timer is not None:
            self.comm_timer.pause()

    def resume(self) -> None:
        """... and ends."""
        if self.comm_timer is not None:
            self.comm_timer.resume()

    def local_grad_norm(self) -> torch.Tensor | None:
        """This rank's gradient norm over its own batch this step, before any combination, as a 0-d float32
        tensor on the gradients' device (reading it waits for nothing once backward is done); None where the
        wrapper never sees the local gradient whole (FSDP2 reduce-scatters inside backward)."""
        return None
    """This step's weight ``b_i / B``, as armed (and renormalised over the finite ranks)."""
    excluded: bool = False
    """This rank's contribution to the current step is excluded (its loss was not finite)."""

    def begin(self, weight: float) -> None:
        """Arm one step's backward with this rank's weight ``b_i / B``."""
        self.weight, self.excluded = weight, False

    def reweight(self, weight: float, excluded: bool) -> None:
        """After ``begin``, before backward: the weight renormalised over the ranks whose loss was finite,
        and whether this rank is excluded (the generic path of ``step.loss``)."""
        self.weight, self.excluded = weight, excluded

    def guard(self, ok: torch.Tensor, rank: int, world_size: int) -> bool:
        """Exclude this rank inside backward if ``ok`` (a 0-d bool tensor: its loss is finite) is false.
        True: this combiner does it (DDP's hook), and ``flags()`` gives the ``3 x world_size`` vector it
        all-reduced during backward (``[excluded_j..., w_j ok_j..., w_j...]`` summed over ranks). False: the
        caller must agree on the flags before backward (``step.loss`` does)."""
        return False

    def flags(self) -> torch.Tensor | None:
        """The flag vector ``guard`` all-reduced during this step's backward (None: none was)."""
        return None

    def loss_scale(self, weight: float) -> float:
        """Factor on the step's loss (1.0 unless the wrapper averages over ranks on its own)."""
        return 1.0

    def compute_end(self) -> float | None:
        """``time.perf_counter()`` when backward's compute ended, if known (else the caller's now)."""
        return None

    def combined_nonfinite(self) -> bool | None:
        """Whether this step's combined gradient holds an inf or a NaN, as the reduction found it (read on
        the host once backward is done), or None: the caller checks the gradients themselves
        (``nonfinite.grads_nonfinite``)."""
        return None

    @property
    def launch_s(self) -> float:
        """Seconds of communication launch spent inside backward (not compute)."""
        return 0.0


def nonfinite_flags(ok: torch.Tensor, rank: int, world_size: int, weight: float,
                    device: torch.device) -> torch.Tensor:
    """This rank's part of the non-finite guard's ``3 x world_size`` float64 vector (zeros elsewhere;
    all-reduced, every rank's): ``[excluded_j | w_j ok_j | w_j]``. ``ok``: a 0-d bool, this rank's
    loss finite. A loss on the host (a CPU run) gives one tensor built from Python values, not an op a
    value (each small op is paid in the step there)."""
    if ok.device.type == "cpu":
        good = bool(ok)
        values = [0.0] * (3 * world_size)
        values[rank], values[world_size + rank], values[2 * world_size + rank] = (
            (0.0, weight, weight) if good else (1.0, 0.0, weight))
        return torch.tensor(values, dtype=torch.float64, device=device)
    flags = torch.zeros(3 * world_size, dtype=torch.float64, device=device)
    ok64 = ok.to(device=device, dtype=torch.float64)
    flags[rank] = 1.0 - ok64
    flags[world_size + rank] = ok64 * weight
    flags[2 * world_size + rank] = weight
    return flags


class DDPHook(GradientCombiner):
    """A ``DistributedDataParallel`` model: the weighting communication hook (see the module docstring)."""

    name = "ddp"

    def __init__(self, model: nn.parallel.DistributedDataParallel) -> None:
        self.weight = 1.0 / max(1, model.process_group.size() if hasattr(model, "process_group") else 1)
        self.group = getattr(model, "process_group", None)
        self._ok: torch.Tensor | None = None  # this step's "my loss is finite" (armed by step.loss)
        self._rank, self._world = 0, 1
        self._flags: torch.Tensor | None = None  # this step's flag vector, all-reduced with the first bucket
        self._flags_future: Any = None
        self._last_ready: float | None = None
        self._launch = 0.0
        self._launch_before_end: float | None = None
        self._grad_sq: torch.Tensor | None = None  # sum over this step's buckets of the local squared norm
        self._sq: torch.Tensor | None = None  # sum over ranks of the squared norms sent (guarded steps)
        self._sq_future: Any = None
        self.scale_loss = any(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
        """The weight goes on the loss, the buckets are summed as they are (SyncBatchNorm: see below)."""
        # DDP's forward broadcasts rank 0's buffers before the user module runs: not compute
        model.register_forward_pre_hook(lambda module, args: self.pause())
        model.module.register_forward_pre_hook(lambda module, args: self.resume())
        try:
            model.register_comm_hook(self, DDPHook._hook)
        except RuntimeError as e:  # DDP allows one hook, registered before the first backward
            raise UsageError(f"cannot weight this DDP model's gradients ({e}); pass the model to "
                             "ctx.prepare_model before any backward and without a communication hook "
                             "of its own") from None

    @staticmethod
    def _hook(state, bucket):
        # (DDPHook, dist.GradBucket) -> Future[Tensor]. No annotations: DDP checks them at registration
        # and this module's postponed (string) annotations would fail that check.
        t0 = time.perf_counter()
        if bucket.is_last():
            state._last_ready = t0
            state._launch_before_end = state._launch  # the last launch comes after compute ended
            if state.on_compute_end is not None:
                state.on_compute_end()
        tensor = bucket.buffer()
        # this rank's own gradient, before weighting and all-reduce: one norm per bucket, on the device
        norm = torch.linalg.vector_norm(tensor, dtype=torch.float32)
        if state.scale_loss:  # the bucket already carries w_i (from the loss): the norm of g_i is this / w_i
            norm = norm / state.weight if state.weight > 0 else norm
        state._grad_sq = norm * norm if state._grad_sq is None else state._grad_sq + norm * norm
        if not state.scale_loss:
            tensor.mul_(state.weight)
        if state._ok is None:  # no guard this step (step.loss not called, or check_nonfinite off)
            future = dist.all_reduce(tensor, group=state.group, async_op=True).get_future()
            state._launch += time.perf_counter() - t0
            return future.then(lambda f: f.value()[0])
        ok, n = state._ok, state._world
        if ok.device.type == "cpu":  # a host bool costs nothing here: zero only when excluded
            if not bool(ok):
                tensor.zero_()
        else:  # no host sync on a GPU: mask on the device
            tensor.masked_fill_(~ok, 0.0)
        numel, first, last = tensor.numel(), state._flags_future is None, bucket.is_last()
        # float64 side values: the flags with the step's first bucket, the squared norms sent with its last
        side = state._side(tensor.device, first, last) if first or last else None
        if side is not None and first and tensor.dtype in (torch.float32, torch.float64):
            # they ride the first bucket (the same on every rank): no extra collective
            tensor = torch.cat([tensor, side.to(tensor.dtype)])
            side = tensor[numel:]  # reduced in place
            future = side_future = dist.all_reduce(tensor, group=state.group, async_op=True).get_future()
        else:  # a later last bucket, or a half-precision one: they go alone, in float64
            side_future = (dist.all_reduce(side, group=state.group, async_op=True).get_future()
                           if side is not None else None)
            future = dist.all_reduce(tensor, group=state.group, async_op=True).get_future()
        if side is not None:
            if first:
                state._flags, state._flags_future = side[:3 * n], side_future
            if last:
                state._sq, state._sq_future = side[-1:], side_future
        flags, flags_future = state._flags, state._flags_future
        state._launch += time.perf_counter() - t0

        def renormalise(f):
            reduced = f.value()[0][:numel]
            if flags_future is not f:
                flags_future.wait()  # launched with an earlier bucket: done, or nearly
            good, total = flags[n:2 * n].sum(), flags[2 * n:].sum()  # sum_j w_j ok_j, sum_j w_j
            if good.device.type == "cpu":
                g, t = float(good), float(total)
                if g != t and g > 0:  # g == 0: every rank excluded, every bucket is zeros
                    reduced.mul_(t / g)
            else:
                reduced.mul_(torch.where(good > 0, total / good, torch.ones_like(good)).to(reduced.dtype))
            return reduced

        return future.then(renormalise)

    def loss_scale(self, weight: float) -> float:
        """``w_i`` on the loss with SyncBatchNorm (its backward sums every rank's output gradients across
        ranks, so they must already carry the global batch's ``1 / B``: weighting each rank's parameter
        gradients afterwards would leave the cross-rank terms at ``1 / b_j``); 1.0 otherwise."""
        return weight if self.scale_loss else 1.0

    def begin(self, weight: float) -> None:
        self.weight, self._last_ready, self._launch, self._launch_before_end = weight, None, 0.0, None
        self.excluded, self._ok, self._flags, self._flags_future = False, None, None, None
        self._grad_sq, self._sq, self._sq_future = None, None, None

    def local_grad_norm(self) -> torch.Tensor | None:
        return self._grad_sq.sqrt() if self._grad_sq is not None else None

    def guard(self, ok: torch.Tensor, rank: int, world_size: int) -> bool:
        self._ok, self._rank, self._world = ok, rank, world_size
        return True

    def flags(self) -> torch.Tensor | None:
        """This step's flag vector once backward is done (None if no bucket ran: no backward)."""
        return self._flags if self._flags_future is not None else None

    def _side(self, device: torch.device, flags: bool, sq: bool) -> torch.Tensor:
        """The float64 values all-reduced beside the buckets: the flags (``nonfinite_flags``) with the
        step's first bucket, and with its last this rank's squared gradient norm over the step's buckets
        as it sends them (0 when excluded: its buckets go as zeros; at the last bucket every norm is in)."""
        ok = self._ok
        assert ok is not None and self._grad_sq is not None
        parts = [nonfinite_flags(ok, self._rank, self._world, self.weight, device)] if flags else []
        if sq and ok.device.type == "cpu":  # a host value: one op
            parts.append(torch.tensor([float(self._grad_sq) if bool(ok) else 0.0], dtype=torch.float64))
        elif sq:
            parts.append(torch.where(ok, self._grad_sq.to(torch.float64), 0.0).reshape(1))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def combined_nonfinite(self) -> bool | None:
        """The sum over ranks of the squared norms they sent is finite exactly when no rank sent an inf or
        a NaN and no element reached ~1.8e19 (its square overflows float32; the sum of the buckets cannot
        overflow below that): then the combined gradient is finite. The norms are taken anyway (each
        rank's ``grad_norm``), so the check is one float on the step's collectives, not a pass over the
        gradients; a gradient with an element above ~1.8e19 counts as an overflow. None where no guarded
        bucket ran this step."""
        if self._sq_future is None or self._sq is None:
            return None
        self._sq_future.wait()  # with the last bucket: done by the end of backward, or nearly
        return not math.isfinite(float(self._sq))  # a GPU: one small read; the flags' read then waits for nothing

    def compute_end(self) -> float | None:
        return self._last_ready

    @property
    def launch_s(self) -> float:
        """Launch time inside the compute span (before the last bucket): only that is not compute."""
        return self._launch if self._launch_before_end is None else self._launch_before_end


class LossScale(GradientCombiner):
    """An FSDP2 (``fully_shard``) model: scale the loss by ``w_i * world_size`` under its averaging."""

    name = "fsdp"

    def __init__(self, world_size: int, model: nn.Module | None = None) -> None:
        self.world_size = world_size
        self.can_exclude = False
        """Whether an excluded rank's reduce-scatter input is zeroed (a custom reduce-scatter on every
        ``fully_shard`` module); if not, a NaN spreads and the step's combined gradient is dropped."""
        if model is not None:
            self.can_exclude = _install_excluding_reduce_scatter(model, self)
            self.timed_comm = _bracket_fsdp_collectives(model, self)

    def loss_scale(self, weight: float) -> float:
        return weight * self.world_size


def _install_excluding_reduce_scatter(model: nn.Module, owner: GradientCombiner) -> bool:
    """Give every FSDP2 module of ``model`` a reduce-scatter that zeroes its input while ``owner`` is
    excluded (FSDP2 has no per-bucket hook; this is its documented way to replace the collective)."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
    except ImportError:  # an older torch without custom collectives
        return False

    class ExcludingReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            if owner.excluded:
                input_tensor.zero_()  # NaN * 0 is NaN: zero, do not scale
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    comm = ExcludingReduceScatter()
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    try:
        for m in modules:
            m.set_custom_reduce_scatter(comm)
    except (ValueError, AttributeError):  # several parameter groups per module: no custom collective
        return False
    return bool(modules)


FSDP_COMM_METHODS = ("unshard", "wait_for_unshard", "post_backward", "finalize_backward")
"""The ``FSDPParamGroup`` methods (torch 2.13) inside which FSDP2 issues its collectives and the compute
stream waits for them: the all-gather (``unshard``), its copy-out (``wait_for_unshard``), the
reduce-scatter (``post_backward``) and backward's wait for the last ones (``finalize_backward``)."""


def _bracket_fsdp_collectives(model: nn.Module, owner: GradientCombiner) -> bool:
    """Bracket FSDP's collectives in every parameter group of ``model`` with ``owner.pause()`` and
    ``owner.resume()`` (an instance attribute over each method); False where this torch has no such
    groups or methods (the compute time then includes the collectives)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # an older torch without FSDP2
        return False
    groups = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()  # FSDP2's own accessor
            if hasattr(state, "_fsdp_param_groups"):  # torch 2.13: a list
                groups += [g for g in state._fsdp_param_groups if g is not None]
            elif (group := getattr(state, "_fsdp_param_group", None)) is not None:  # torch 2.11: one per module
                groups.append(group)
    if not groups or not all(hasattr(g, name) for g in groups for name in FSDP_COMM_METHODS):
        return False
    for group in groups:
        for name in FSDP_COMM_METHODS:
            setattr(group, name, _bracketed(getattr(group, name), owner))
    return True


def _bracketed(method: Callable[..., Any], owner: GradientCombiner) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        owner.pause()
        try:
            return method(*args, **kwargs)
        finally:
            owner.resume()
    return call


def batchnorm_layers(model: nn.Module) -> list[nn.Module]:
    """The BatchNorm layers of ``model`` whose statistics are over this rank's batch alone (torch's
    ``_BatchNorm`` subclasses: BatchNorm1d/2d/3d, their lazy forms; ``SyncBatchNorm`` excluded)."""
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)]


def prepare_batchnorm(model: nn.Module, config: NodePriorityConfig,
                      device: torch.device) -> tuple[nn.Module, int]:
    """The model (with ``SyncBatchNorm`` under ``batchnorm="sync"``) and the batch floor its BatchNorm
    layers need (0: none), per ``config.batchnorm`` (see the module docstring)."""
    layers = batchnorm_layers(model)
    if not layers or config.batchnorm == "local":
        return model, 0
    if config.batchnorm == "floor":
        return model, config.batchnorm_min_batch
    if device.type != "cuda":
        raise ConfigError(f"node_priority.batchnorm='sync' needs GPUs: torch's SyncBatchNorm has no CPU kernels "
                          f"(this worker runs on {device.type}); use batchnorm='floor' (every batch >= "
                          "batchnorm_min_batch) on CPUs")
    if isinstance(model, nn.parallel.DistributedDataParallel) or is_fsdp2(model):
        raise UsageError("node_priority.batchnorm='sync' converts BatchNorm layers before wrapping: pass the plain "
                         "module to ctx.prepare_model, or convert it yourself with "
                         "nn.SyncBatchNorm.convert_sync_batchnorm before DDP or fully_shard")
    return nn.SyncBatchNorm.convert_sync_batchnorm(model), 0


def _fsdp_class(name: str) -> type | None:
    """``torch.distributed.fsdp.<name>`` if that package is loaded, else None. A model can only be an
    FSDP (1 or 2) module once something imported the package (``fully_shard`` and FSDP1 live in it),
    so a DDP or plain model never pays its import: ~2 s of CPU per worker (DTensor, sympy)."""
    return getattr(sys.modules.get("torch.distributed.fsdp"), name, None)


def is_fsdp2(model: nn.Module) -> bool:
    fsdp_module = _fsdp_class("FSDPModule")  # None: not loaded, or an old torch without FSDP2
    return fsdp_module is not None and isinstance(model, fsdp_module)


def check_supported(model: nn.Module, sync: str) -> None:
    """Refuse what would silently give wrong gradients, before anything touches the model."""
    if sync not in ("auto", "ddp"):
        raise ConfigError(f"sync must be 'auto' or 'ddp', got {sync!r}")
    fsdp1 = _fsdp_class("FullyShardedDataParallel")
    if fsdp1 is not None and isinstance(model, fsdp1):
        raise UsageError("FSDP1 (FullyShardedDataParallel) is not supported: its reduction would average the "
                         "weighted gradients again. Shard with FSDP2 (torch.distributed.fsdp.fully_shard) or DDP")


def combiner_for(model: nn.Module, sync: Sync, world_size: int,
                 device: torch.device) -> tuple[nn.Module, GradientCombiner]:
    """The (possibly wrapped) model and how its gradients get their weights: a DDP model gets the hook,
    an FSDP2 model the loss scale, a plain module is wrapped in DDP with the hook. (``sync`` is kept
    for callers that name it: 'auto' and 'ddp' do the same.)"""
    check_supported(model, sync)
    own = getattr(model, "pdml_combiner", None)
    if isinstance(own, GradientCombiner):  # P3 ordering: p3_sync.prepare brings its own combiner
        return model, own
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model, DDPHook(model)
    if is_fsdp2(model):
        return model, LossScale(world_size, model)
    if dist.is_available() and dist.is_initialized():  # Ray Train's process group, any world size
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, DDPHook(ddp)
    return model, GradientCombiner()  # one process without a group: nothing to combine


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 modules are their own module)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def describe(combiner: Any) -> str:
    return {"ddp": "DDP with pdml-ray's weighting communication hook",
            "fsdp": "FSDP2 (fully_shard) with the loss scaled by w_i * world_size",
            "p3": "P3 ordering: per-slice all-reduces weighted b_i/B, per-layer optimizer steps"}.get(getattr(combiner, "name", ""), "no combination")
