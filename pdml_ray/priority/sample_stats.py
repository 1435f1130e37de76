"""What the sample table reports: ``SampleStats``, the record behind ``pdml-ray status``'s sample
line, the run's metrics and the scheduler's stats (``SamplePrioritizer.stats``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdml_ray.priority.base import GaugeValue


@dataclass(frozen=True, slots=True)
class SampleStats:
    """What the sample table knows: the continuity measures and the sampler's state."""

    normalized_ess: float
    """(sum p)^2 / (N sum p^2) of the score distribution at the last continuity check (nan before one)."""
    normalized_entropy: float
    tie_fraction: float
    recalibrations: int
    collapsed_flat: int
    collapsed_peaked: int
    continuity_checks: int
    uniform_mix: float
    """The uniform mix of the last plans (raised while a recalibration holds)."""
    beta: float
    """Importance-weight exponent of the last plan."""
    seen_fraction: float
    epoch: float
    """Samples drawn / N: under priority sampling an epoch is N draws."""
    uniform_fallbacks: int
    continuity_seconds: float
    """Wall time of continuity checks and of keeping their running sum up to date (s)."""
    recalibration_seconds: float
    continuity_update_seconds: float = 0.0
    """The part of continuity_seconds spent keeping the running sum of squares up to date (s)."""
    distinct_shortfalls: int = 0
    """Steps of ``replacement=False`` plans that took more samples than the data set has (drawn with repeats)."""
    clipped_losses: int = 0
    """Per-sample losses clipped to the robust cap where they entered (``CLIP_FACTOR`` x the table's scale)."""
    mode: str = "importance"
    """``SamplePriorityConfig.mode``."""
    priority_on: bool = True
    """Whether priority draws are on (False: uniform, switched off or selective-backprop; the pay switch's
    probes draw the other way for two intervals now and then)."""
    switches_off: int = 0
    """Times the pay switch turned priority draws off (``pdml_ray.priority.sample_switch``)."""
    switches_on: int = 0
    """Times it turned them back on."""
    predicted_gain: float = float("nan")
    """Predicted variance reduction of priority draws over uniform ones at the last probe gate (nan before one)."""
    cost_factor: float = float("nan")
    """Cost factor at the last probe gate: 1 + selection seconds per step / step seconds."""
    measured_gain: float = float("nan")
    """The pay switch's last verdict: priority's measured loss drop per second over uniform's (nan before one)."""
    probes: int = 0
    """A/B probes the pay switch has run (intervals drawn the other way to measure the gain)."""
    selection_seconds: float = 0.0
    """Wall time the table spent in plans and updates (draws, weights, scoring) (s)."""
    skipped_losses: int = 0
    """Losses the table did not ask for while the pay switch had priority draws off (outside the
    intervals a probe measures): its plans' samples without ``SamplePlan.feedback`` (any reported
    anyway are skipped). What keeps its cost low while off."""
    irreducible_mean: float = float("nan")
    """rho-loss: the mean of the irreducible losses the table holds (0 while none were given: it then ranks
    by the plain loss); nan in the other modes."""

    def summary_lines(self) -> list[str]:
        rho = ""
        if not math.isnan(self.irreducible_mean):
            rho = f", irreducible losses mean {self.irreducible_mean:.3g}"
            rho += " (none given: ranks by the plain loss)" if self.irreducible_mean == 0 else ""
        return [f"sample priorities ({self.mode}): draws {'by priority' if self.priority_on else 'uniform'}, "
                f"pay switch off {self.switches_off}x / on {self.switches_on}x (measured gain {self.measured_gain:.3g} "
                f"over {self.probes} probes), selection {self.selection_seconds:.3g} s, "
                f"losses skipped while off {self.skipped_losses}{rho}",
                f"sample priorities: normalized ESS {self.normalized_ess:.4g}, seen {self.seen_fraction:.1%}, "
                f"epoch {self.epoch:.2f}, uniform mix {self.uniform_mix:.3g}, beta {self.beta:.3g}, "
                f"recalibrations {self.recalibrations} (flat {self.collapsed_flat}, peaked {self.collapsed_peaked}, "
                f"of {self.continuity_checks} checks), clipped losses {self.clipped_losses}"]

    def gauges(self) -> list[GaugeValue]:
        out = [GaugeValue("pdml_sample_recalibrations_total", "continuity recalibrations of the sample priorities",
                          self.recalibrations),
               GaugeValue("pdml_sample_continuity_checks_total", "continuity checks of the sample priorities",
                          self.continuity_checks),
               GaugeValue("pdml_sample_continuity_seconds_total", "seconds spent on continuity checks and their "
                          "running sums", self.continuity_seconds),
               GaugeValue("pdml_sample_clipped_losses_total", "per-sample losses clipped to the sample table's "
                          "robust cap where they entered", self.clipped_losses),
               GaugeValue("pdml_sample_uniform_fallbacks_total", "sample plans that fell back to uniform draws",
                          self.uniform_fallbacks),
               GaugeValue("pdml_sample_switches_off_total", "times the pay switch turned priority draws off "
                          "(measured gain below its threshold)", self.switches_off),
               GaugeValue("pdml_sample_switches_on_total", "times the pay switch turned priority draws back on",
                          self.switches_on),
               GaugeValue("pdml_sample_priority_on_ratio", "1 while sample plans are drawn by priority, 0 while "
                          "uniform", float(self.priority_on)),
               GaugeValue("pdml_sample_selection_seconds_total", "seconds the sample table spent drawing, "
                          "weighting and scoring", self.selection_seconds),
               GaugeValue("pdml_sample_seen_ratio", "fraction of the data set scored at least once (0-1)",
                          self.seen_fraction),
               GaugeValue("pdml_sample_epochs", "epochs drawn so far (samples drawn / data set size)", self.epoch)]
        if not math.isnan(self.predicted_gain):
            out.append(GaugeValue("pdml_sample_predicted_gain_ratio", "predicted variance reduction of priority "
                                  "draws over uniform ones (the pay switch's probe gate)", self.predicted_gain))
        if math.isfinite(self.measured_gain):
            out.append(GaugeValue("pdml_sample_measured_gain_ratio", "priority draws' measured loss drop per second "
                                  "over uniform draws' (the pay switch's last verdict)", self.measured_gain))
        if not math.isnan(self.irreducible_mean):
            out.append(GaugeValue("pdml_sample_irreducible_loss_mean", "rho-loss: mean irreducible loss the sample "
                                  "table holds (0: none given)", self.irreducible_mean))
        if not math.isnan(self.normalized_ess):
            out.append(GaugeValue("pdml_sample_normalized_ess_ratio", "normalised effective sample size of the "
                                  "sample priorities (0-1)", self.normalized_ess))
        return out
