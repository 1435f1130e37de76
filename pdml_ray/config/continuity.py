"""The continuity check's config: when a priority distribution counts as collapsed, how to recover."""

from __future__ import annotations

from dataclasses import dataclass

from pdml_ray.config.checks import finite, integer, require

@dataclass(kw_only=True, slots=True)
class ContinuityConfig:
    """Continuity check: catches a priority distribution that collapsed (too flat or too peaked)."""

    check_interval: int = 50
    """Steps between checks: a collapse is caught within this many steps (plus one update). 50 keeps a
    check of a 20,000-item sample table (one pass over it, ~70 us between training steps) under 0.1%
    of even a 2 ms step; collapses build up over tens of steps (``pdml-ray bench sampling``)."""
    running_sums_from: int = 1 << 20
    """Tables of at least this many items keep the check's sum of squares up to date with every score
    update (O(B) per update, so a check is O(1)) instead of one pass over the table per check (O(N)).
    A pass costs ~1 ns per item and the running sum ~10-40 us per update, so below ~10^6 items the
    pass per ``check_interval`` steps is the cheaper one; at 10^7 a pass costs 4-8 ms."""
    min_normalized_ess: float = 1e-3
    """Below this normalised effective sample size ((sum p)^2 / (N sum p^2)) the distribution is too
    peaked: it effectively covers fewer than this fraction of the items (and fewer than
    ``min_effective_items``). A healthy loss table on imbalanced data (1 positive in 200 carrying most
    of the loss) sits near 5e-3. For few items (nodes) raise it: 1/N is the minimum."""
    min_effective_items: float = 16.0
    """Too peaked also needs the distribution to cover fewer than this many items (normalised ESS x
    N), i.e. a handful. A rare class may rightly hold most of a large table's mass: 1 positive in
    1,000 among 100,000 samples covers ~100 items, a normalised ESS of 1e-3. ``math.inf`` judges by
    the fraction alone. Long vectors checked on a subsample count items of the subsample."""
    max_normalized_ess: float = 0.999
    """Too flat needs both: normalised ESS above this AND tie_fraction above max_tie_fraction."""
    max_tie_fraction: float = 0.9
    """Share of priorities tied (within relative tie_tolerance of the median) above which, with a
    normalised ESS above max_normalized_ess, the distribution counts as collapsed flat. Must be > 0.5."""
    tie_tolerance: float = 1e-3
    """Relative distance to the median within which two priorities count as tied."""
    max_check_items: int = 1 << 16
    """Vectors longer than this are measured on a random subsample of this many items (keeps a check O(1))."""
    recalibration_steps: int = 50
    """Steps the raised uniform mix is held after a recalibration."""
    recalibration_mix: float = 0.5
    """Uniform mix used while recovering from a collapse."""
    noise: float = 0.05
    """Std of the log-normal multiplicative noise injected into priorities on recalibration (breaks ties)."""
    reset_fraction: float = 0.5
    """On recalibration, priorities move this fraction of the way towards the prior (the median) in log
    space: p <- p^(1-f) * prior^f, which compresses a peak by the power (1-f)."""

    def __post_init__(self) -> None:
        require(integer(self.check_interval, 1),
                 f"continuity.check_interval must be an integer >= 1, got {self.check_interval!r}")
        require(integer(self.running_sums_from, 0),
                 f"continuity.running_sums_from must be an integer >= 0 (a number of items; 0 = always), "
                 f"got {self.running_sums_from!r}")
        require(finite(self.min_normalized_ess) and 0.0 <= self.min_normalized_ess < self.max_normalized_ess <= 1.0,
                 "continuity.min_normalized_ess must be >= 0 and below max_normalized_ess <= 1, got "
                 f"{self.min_normalized_ess!r} and {self.max_normalized_ess!r}")
        require(isinstance(self.min_effective_items, (int, float)) and self.min_effective_items >= 0.0,
                 f"continuity.min_effective_items must be >= 0 (a number of items), got {self.min_effective_items!r}")
        require(finite(self.max_tie_fraction) and 0.5 < self.max_tie_fraction <= 1.0,
                 f"continuity.max_tie_fraction must be in (0.5, 1] (ties are counted around the median), "
                 f"got {self.max_tie_fraction!r}")
        require(finite(self.tie_tolerance) and 0.0 <= self.tie_tolerance < 1.0,
                 f"continuity.tie_tolerance must be in [0, 1) (relative, e.g. 1e-3), got {self.tie_tolerance!r}")
        require(integer(self.max_check_items, 16),
                 f"continuity.max_check_items must be an integer >= 16, got {self.max_check_items!r}")
        require(finite(self.reset_fraction) and 0.0 <= self.reset_fraction <= 1.0,
                 f"continuity.reset_fraction must be in [0, 1] (0 = keep priorities), got {self.reset_fraction!r}")
        require(integer(self.recalibration_steps, 1),
                 f"continuity.recalibration_steps must be an integer >= 1, got {self.recalibration_steps!r}")
        require(finite(self.recalibration_mix) and 0.0 < self.recalibration_mix <= 1.0,
                 f"continuity.recalibration_mix must be in (0, 1], got {self.recalibration_mix!r}")
        require(finite(self.noise) and 0.0 <= self.noise <= 1.0,
                 f"continuity.noise must be in [0, 1], got {self.noise!r}")
