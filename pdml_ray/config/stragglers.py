"""Straggler-tolerant data parallelism's config: which policy, for how many workers and stragglers,
with what step timeout and emulated compute.

Policy names are validated against the one registry (``pdml_ray.stragglers.registry``), and gradient
codes against ``pdml_ray.stragglers.coding`` (FR and pipelined CR need (s + 1) | n; a CR code must
decode within 1e-4 in float32), imported when a config is checked: neither imports anything from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdml_ray.config.checks import finite, require


@dataclass(frozen=True, kw_only=True, slots=True)
class StragglerConfig:
    """One straggler-tolerant data-parallel run."""

    policy: str = "gc-cr"
    """A name from ``pdml_ray.stragglers.registry.POLICIES``."""
    workers: int = 8
    """n: data partitions and workers (``backup`` adds ``stragglers`` more workers)."""
    stragglers: int = 1
    """s: stragglers tolerated per step (for ``backup``: the number b of backup workers)."""
    lr: float = 1.0
    """SGD learning rate of the aggregator's update."""
    step_timeout_s: float = 30.0
    """A step that has not got what its policy needs after this many seconds stops the run as stalled
    (it never hangs), e.g. ``sync`` after a worker silently stopped answering."""
    per_sample_ms: float = 0.0
    """EMULATED compute per sample at full speed (milliseconds), slept by the worker times the straggler
    model's factor; 0 = real compute only."""
    code_seed: int = 0
    """Seed of the generator the CR encoding matrix's random H is drawn from (redrawn until the code
    decodes within 1e-4 in float32; ``pdml_ray.stragglers.coding``)."""

    def __post_init__(self) -> None:
        from pdml_ray.stragglers.registry import POLICIES

        require(self.policy in POLICIES, f"stragglers.policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
        require(isinstance(self.workers, int) and not isinstance(self.workers, bool) and self.workers >= 1,
                f"stragglers.workers must be an integer >= 1 (e.g. 8), got {self.workers!r}")
        require(isinstance(self.stragglers, int) and not isinstance(self.stragglers, bool)
                and 0 <= self.stragglers < self.workers,
                f"stragglers.stragglers must be an integer in [0, workers={self.workers}) (e.g. 1), got {self.stragglers!r}")
        require(isinstance(self.code_seed, int) and not isinstance(self.code_seed, bool) and self.code_seed >= 0,
                f"stragglers.code_seed must be an integer >= 0 (e.g. 0), got {self.code_seed!r}")
        if self.policy in ("gc-fr", "gc-cr", "pgc-fr", "pgc-cr"):
            from pdml_ray.stragglers.coding import check_code, cr_matrix

            check_code(self.workers, self.stragglers, self.policy[-2:], pipelined=self.policy.startswith("pgc"))
            if self.policy.endswith("cr"):  # draws the code now: one not accurate in float32 is refused here
                cr_matrix(self.workers, self.stragglers, self.code_seed)
        require(finite(self.lr) and self.lr > 0, f"stragglers.lr must be > 0 (e.g. 1.0), got {self.lr!r}")
        require(finite(self.step_timeout_s) and self.step_timeout_s > 0,
                f"stragglers.step_timeout_s must be > 0 seconds (e.g. 30), got {self.step_timeout_s!r}")
        require(finite(self.per_sample_ms) and self.per_sample_ms >= 0,
                f"stragglers.per_sample_ms must be >= 0 milliseconds (0 = no emulated compute), got {self.per_sample_ms!r}")
