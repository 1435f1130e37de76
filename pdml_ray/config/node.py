"""Node priorities' config and the accelerator prior that seeds them before any measurement."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdml_ray.config.checks import MAX_REAL, MAX_STEPS, check_range, require
from pdml_ray.emulation import check_speed
from pdml_ray.errors import shown

# Relative training throughput by accelerator type, used as the prior before any measurement.
# Rough dense-BF16 ratios (H100 SXM = 1.0); only the ratios matter, and measurements replace them
# within the first decision intervals. Users override or extend them with ``NodePriorityConfig.prior``.
DEFAULT_ACCELERATOR_PRIOR: dict[str, float] = {
    "H200": 1.15,
    "H100": 1.0,
    "A100": 0.32,
    "L40S": 0.37,
    "A10G": 0.13,
    "L4": 0.12,
    "V100": 0.13,
    "T4": 0.04,
    "CPU": 0.01,
}


MAX_GLOBAL_BATCH = 1 << 30
"""Largest global batch (samples per step): batch shares are float64, exact far beyond it (2^53)."""


@dataclass(kw_only=True, slots=True)
class NodePriorityConfig:
    """Node priorities: each worker's share of a fixed global batch balances its predicted step time
    (a fitted fixed cost per step plus a per-sample rate, see ``pdml_ray.priority.node``)."""

    global_batch_size: int | None = None
    """Samples per optimizer step over all workers; per-worker batch sizes always sum to it. Required
    (no silent default: it sets the learning dynamics). ``batch`` gives it, checked."""
    ema_alpha: float = 0.1
    """Weight of the newest report in each worker's step-time fit: every later report makes an
    older one count ``1 - ema_alpha`` times less (0.1: about the last 20 reports carry the fit;
    1.0 = only the newest report, which leaves no noise estimate, so only ``hysteresis`` gates)."""
    warmup_steps: int = 2
    """Steps whose reports are ignored at the start (allocator and kernel warm-up distort timings)."""
    min_batch: int = 1
    """Smallest per-worker batch. Every worker keeps at least this many samples per step."""
    max_batch: int | None = None
    """Largest per-worker batch (memory cap); None means no cap."""
    batchnorm: str = "floor"
    """What ``ctx.prepare_model`` does with a model holding BatchNorm layers that normalise over the
    worker's own batch (torch's ``_BatchNorm`` subclasses, not ``SyncBatchNorm``). ``"floor"`` (default):
    every worker's batch stays at or above ``batchnorm_min_batch``, announced to the scheduler.
    ``"sync"``: the layers become ``SyncBatchNorm``, whose statistics are over the global batch, as one
    process computes them, so no floor is needed (GPUs only: torch's SyncBatchNorm has no CPU kernels).
    ``"local"``: local statistics at any batch size (no floor; a 2-sample batch normalises by noise)."""
    batchnorm_min_batch: int = 16
    """The floor of ``batchnorm="floor"`` (samples per worker), capped at the uniform share
    ``global_batch_size // workers``. 16: a batch mean's standard error is ``sigma / sqrt(b)``, a
    quarter of the feature's spread at 16 against 0.71 of it at 2, and the batch variance's relative
    standard error ``sqrt(2 / (b - 1))`` is 0.37 at 16 against 1.4 at 2; BatchNorm's accuracy is known
    to hold down to about 16 samples per worker and to fall quickly below (Wu and He, Group
    Normalization, 2018: ResNet-50 on ImageNet)."""
    hysteresis: float = 0.01
    """Floor on a switch's gain: keep the current batch sizes unless the new ones cut the predicted step
    time by more than this fraction, however certain the gain (the noise gate is ``decision_confidence``)."""
    decision_confidence: float = 2.0
    """The noise gate, in standard errors: new batch sizes must be predicted faster than the current ones
    by more than this many standard errors of the predicted difference (from each worker's fitted
    step-time noise and effective number of reports). Higher switches less on noise and later on real
    changes; 0 switches on any predicted gain above ``hysteresis``."""
    prior: dict[str, float] = field(default_factory=dict)
    """Relative speeds by accelerator type; merged over DEFAULT_ACCELERATOR_PRIOR."""
    emulated_speeds: list[float] | None = None
    """Per-worker emulated speed factors in (0, 1] for CPU machines and tests (see pdml_ray.emulation)."""
    emulated_per_sample_s: float | None = None
    """Sleep compute mode (EMULATED, for benchmarks and tests): each worker sleeps
    ``samples x emulated_per_sample_s / speed`` per step in place of having its measured compute scaled
    by ``1/speed``. Its real forward/backward still makes the gradients; keep that small so the sleep
    dominates and contention on a small machine cannot decide the result (see pdml_ray.emulation)."""
    enabled: bool = True
    """False keeps uniform shares (the baseline) while still measuring and reporting."""
    check_nonfinite: bool = True
    """Guard each step against a worker whose loss is NaN or infinite (``pdml_ray.train.step``): its
    contribution to that step is excluded (the other workers' gradient weights are renormalised over
    them), the exclusion is counted, and training continues. A step whose combined gradient is still
    not finite (an overflow in backward) has its gradients dropped, so ``optimizer.step()`` leaves the
    model as it was. Costs one tiny all-reduce per step inside backward (measured in the README).
    False: no checks at all, as before (a NaN on one worker then spreads to every worker's model)."""
    max_consecutive_nonfinite: int = 3
    """Steps in a row the same worker may be excluded (or the combined gradient be dropped) before the
    run ends with a ``NonFiniteError`` naming the worker and the step, raised on every rank. A worker
    that keeps producing NaN is broken (bad data shard, bad device, diverged model), not unlucky."""

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), f"node_priority.enabled must be true or false, got {shown(self.enabled)}")
        check_range(self.global_batch_size, "node_priority.global_batch_size", 1, MAX_GLOBAL_BATCH, whole=True,
                    none_ok=True, hint="samples per optimizer step over all workers, e.g. 1024")
        require(isinstance(self.check_nonfinite, bool),
                f"node_priority.check_nonfinite must be true or false, got {shown(self.check_nonfinite)}")
        check_range(self.max_consecutive_nonfinite, "node_priority.max_consecutive_nonfinite", 1, 1_000_000,
                    whole=True, hint="steps in a row one worker may be excluded for a NaN or infinite loss before "
                                     "the run stops, e.g. 3")
        check_range(self.ema_alpha, "node_priority.ema_alpha", 0.0, 1.0, open_low=True, hint="e.g. 0.5")
        check_range(self.warmup_steps, "node_priority.warmup_steps", 0, MAX_STEPS, whole=True, hint="steps")
        check_range(self.min_batch, "node_priority.min_batch", 0, MAX_GLOBAL_BATCH, whole=True, hint="samples")
        check_range(self.max_batch, "node_priority.max_batch", max(1, self.min_batch), MAX_GLOBAL_BATCH, whole=True,
                    none_ok=True, hint="samples per worker, at least min_batch; None: no cap")
        require(self.batchnorm in ("floor", "sync", "local"),
                f"node_priority.batchnorm must be 'floor' (keep every batch >= batchnorm_min_batch), 'sync' "
                f"(SyncBatchNorm, GPUs) or 'local' (no floor), got {shown(self.batchnorm)}")
        check_range(self.batchnorm_min_batch, "node_priority.batchnorm_min_batch", 1, MAX_GLOBAL_BATCH, whole=True,
                    hint="samples per worker for BatchNorm's local statistics, e.g. 16")
        check_range(self.hysteresis, "node_priority.hysteresis", 0.0, 1.0, open_high=True,
                    hint="a fraction of step time")
        check_range(self.decision_confidence, "node_priority.decision_confidence", 0.0, 10.0,
                    hint="standard errors, e.g. 2.0; 0 turns the noise gate off")
        require(isinstance(self.prior, dict) and all(isinstance(k, str) for k in self.prior),
                f"node_priority.prior must be a mapping of accelerator type (a string) to relative speed, e.g. "
                f"{{'H100': 1.0, 'A100': 0.32}}, got {shown(self.prior)}")
        for name, speed in self.prior.items():
            check_range(speed, f"node_priority.prior[{shown(name, 40)}]", 0.0, MAX_REAL, open_low=True,
                        hint="a relative speed")
        if self.emulated_speeds is not None:
            require(isinstance(self.emulated_speeds, (list, tuple)) and 1 <= len(self.emulated_speeds) <= 1 << 16,
                    f"node_priority.emulated_speeds must be a list of speed factors in (0, 1], one per worker, or "
                    f"None, got {shown(self.emulated_speeds)}")
            for i, s in enumerate(self.emulated_speeds):
                check_speed(s, f"node_priority.emulated_speeds[{i}]")
        check_range(self.emulated_per_sample_s, "node_priority.emulated_per_sample_s", 0.0, 1.0, open_low=True,
                    none_ok=True, hint="seconds per sample, e.g. 5e-4")

    @property
    def emulation(self) -> str | None:
        """What is EMULATED in this config, in words for every output; None when nothing is."""
        if self.emulated_speeds is None and self.emulated_per_sample_s is None:
            return None
        speeds = ",".join(f"{s:g}" for s in self.emulated_speeds) if self.emulated_speeds else "all 1"
        if self.emulated_per_sample_s is not None:
            return (f"EMULATED compute: sleep {self.emulated_per_sample_s * 1e3:g} ms/sample / speed, "
                    f"speeds {speeds}")
        return f"EMULATED speeds {speeds} (measured compute scaled by 1/speed)"

    def accelerator_prior(self) -> dict[str, float]:
        """The effective prior table: defaults overridden by the user's entries."""
        return {**DEFAULT_ACCELERATOR_PRIOR, **self.prior}

    @property
    def batch(self) -> int:
        """``global_batch_size``, which must be set: ConfigError naming the field if it is not."""
        require(self.global_batch_size is not None,
                "node_priority.global_batch_size is not set: give the samples per optimizer step over all "
                "workers, e.g. PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=1024))")
        return self.global_batch_size  # type: ignore[return-value]

    def check_workers(self, num_workers: int) -> None:
        """Check that ``num_workers`` workers can satisfy the batch bounds; say what to change if not."""
        check_range(num_workers, "the number of workers", 1, MAX_GLOBAL_BATCH, whole=True)
        self.batch  # noqa: B018 - raises when the global batch size is missing
        require(self.min_batch * num_workers <= self.batch,
                 f"node_priority.min_batch={self.min_batch} x {num_workers} workers exceeds "
                 f"global_batch_size={self.global_batch_size}; lower min_batch or raise global_batch_size")
        if self.max_batch is not None:
            require(self.max_batch * num_workers >= self.batch,
                     f"node_priority.max_batch={self.max_batch} x {num_workers} workers is below "
                     f"global_batch_size={self.global_batch_size}; raise max_batch or lower global_batch_size")
        if self.emulated_speeds is not None:
            require(len(self.emulated_speeds) == num_workers,
                     f"node_priority.emulated_speeds has {len(self.emulated_speeds)} entries for "
                     f"{num_workers} workers; give one speed per worker")
