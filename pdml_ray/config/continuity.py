"""The continuity check's config: when a priority distribution counts as collapsed, how to recover."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdml_ray.config.checks import MAX_ITEMS, MAX_STEPS, check_range

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
        check_range(self.check_interval, "continuity.check_interval", 1, MAX_STEPS, whole=True, hint="steps")
        check_range(self.running_sums_from, "continuity.running_sums_from", 0, MAX_ITEMS, whole=True,
                    hint="a number of items; 0 = always")
        check_range(self.max_normalized_ess, "continuity.max_normalized_ess", 0.0, 1.0, open_low=True)
        check_range(self.min_normalized_ess, "continuity.min_normalized_ess", 0.0, self.max_normalized_ess,
                    open_high=True, hint="below max_normalized_ess")
        if not (isinstance(self.min_effective_items, float) and self.min_effective_items == math.inf):  # inf: by ESS alone
            check_range(self.min_effective_items, "continuity.min_effective_items", 0.0, float(MAX_ITEMS),
                        hint="a number of items, or inf")
        check_range(self.max_tie_fraction, "continuity.max_tie_fraction", 0.5, 1.0, open_low=True,
                    hint="ties are counted around the median")
        check_range(self.tie_tolerance, "continuity.tie_tolerance", 0.0, 1.0, open_high=True, hint="relative, e.g. 1e-3")
        check_range(self.max_check_items, "continuity.max_check_items", 16, MAX_ITEMS, whole=True)
        check_range(self.reset_fraction, "continuity.reset_fraction", 0.0, 1.0, hint="0 = keep priorities")
        check_range(self.recalibration_steps, "continuity.recalibration_steps", 1, MAX_STEPS, whole=True, hint="steps")
        check_range(self.recalibration_mix, "continuity.recalibration_mix", 0.0, 1.0, open_low=True)
        check_range(self.noise, "continuity.noise", 0.0, 1.0)
