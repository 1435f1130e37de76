"""Sample priorities' config: which samples a step trains on (and backpropagates), from per-sample losses.

The modes (``mode``; ``pdml_ray.priority.sample_modes`` holds one entry per mode) share one score
table and one sampler; see docs/guides/sample_priorities.md for which of them are biased."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdml_ray.config.checks import MAX_STEPS, check_range, require
from pdml_ray.errors import shown

SampleMode = Literal["importance", "annealed", "selective-backprop", "rho-loss"]
SAMPLE_MODES: tuple[str, ...] = ("importance", "annealed", "selective-backprop", "rho-loss")

@dataclass(kw_only=True, slots=True)
class SamplePriorityConfig:
    """Sample priorities: loss-based importance sampling over the whole data set."""

    mode: SampleMode = "importance"
    """'importance': draw by score, importance weights with beta annealed linearly (unbiased at the end);
    'annealed': the same draws, beta held near its start for most of the anneal and rising late (a
    documented bias towards high-loss samples for longer); 'selective-backprop': uniform draws, every
    drawn sample forwarded, only the ``backprop_share`` with the highest loss percentile backpropagated
    (biased); 'rho-loss': draw by reducible loss, the loss minus an irreducible-loss model's loss on
    the sample (``PDMLContext.set_irreducible_losses``), trained unweighted as the RHO-LOSS paper trains
    (biased towards learnable samples; the importance exponents apply where set)."""
    score: Literal["loss", "loss_ema"] = "loss"
    """Per-sample score: the last loss, or an EMA of the losses seen for that sample."""
    score_ema: float = 0.5
    """Weight of the newest loss when score == 'loss_ema'."""
    exponent: float = 1.0
    """Temperature alpha: sampling weight ~ score**alpha (0 = uniform, 1 = proportional)."""
    uniform_mix: float = 0.1
    """Probability mass spread uniformly over all samples, so every sample keeps a chance."""
    staleness_decay: float = 0.0
    """Per-step multiplicative pull of scores not refreshed for a while towards the mean (0 = off)."""
    stale_after: int = 100
    """Steps after which a score counts as stale and starts to decay."""
    is_exponent_start: float | None = None
    """Importance-weight exponent beta at step 0 (annealed to ``is_exponent_end``). None: the mode's,
    0.4 (rho-loss: 0, ``pdml_ray.priority.sample_modes``)."""
    is_anneal_steps: int = 1000
    """Steps over which beta goes from is_exponent_start to is_exponent_end (0 = is_exponent_end at once)."""
    is_exponent_end: float | None = None
    """Importance-weight exponent beta after annealing. None: the mode's, 1.0 for importance and
    annealed (the weighted loss an unbiased estimate of the uniform mean loss), 0 for rho-loss (its
    draws trained unweighted, as the RHO-LOSS paper trains its selection: measured faster to the target
    than the corrected form in 5 of 6 noisy settings, BENCHMARKS.md). Below 1 the sampler keeps part of
    its bias towards high scores for good (0 with is_exponent_start 0: no correction at all)."""
    replacement: bool = True
    """Draw a step's indices with replacement (exactly unbiased); False draws distinct indices."""
    unseen_score: Literal["max", "mean"] = "max"
    """Score of samples that have no loss yet: the largest score seen so far (optimistic: the first
    epoch visits every sample before exploiting), or the mean seen score (exploits high-loss samples
    as soon as they are found; the uniform mix and the mean weight still visit the rest)."""

    backprop_share: float = 1.0 / 3.0
    """selective-backprop: share backpropagated, the samples whose loss is at or above the (1 - share)
    percentile of the last ``percentile_window`` losses: the cluster's where the scheduler's table hands
    it out with the plans (``SamplePlan.backprop_threshold``), else the worker's own."""
    percentile_window: int = 4096
    """selective-backprop: recent per-sample losses the percentile is placed among (the scheduler's
    table keeps the cluster's last ones, each worker its own)."""
    pay_threshold: float | None = None
    """Priority draws only while they are measured to pay: the table starts with uniform draws and now
    and then draws 2 intervals the other way (a probe); while priority's loss drop per second, over
    uniform's, is below this the draws are uniform with weight 1, and they turn on above
    ``pay_threshold * 1.1`` (``pdml_ray.priority.sample_switch``). Each switch is counted. None
    (default): priority draws always, no probes."""

    gain_proxy: Literal["loss", "logit-gradient"] = "loss"
    """The per-sample gradient-norm proxy of the pay switch's probe gate (a priority probe runs only where
    the predicted variance reduction over the cost reaches ``pay_threshold``): the score (the loss),
    or 1 - exp(-loss), the norm of a cross-entropy loss's gradient with respect to the true class's
    logit (exactly |sigmoid(z) - y| for a binary cross-entropy; Katharopoulos & Fleuret's bound)."""

    def __post_init__(self) -> None:
        require(isinstance(self.gain_proxy, str) and self.gain_proxy in ("loss", "logit-gradient"),
                f"sample_priority.gain_proxy must be 'loss' or 'logit-gradient', got {shown(self.gain_proxy)}")
        require(isinstance(self.mode, str) and self.mode in SAMPLE_MODES,
                f"sample_priority.mode must be one of {', '.join(map(repr, SAMPLE_MODES))}, got {shown(self.mode)}")
        check_range(self.backprop_share, "sample_priority.backprop_share", 0.0, 1.0, open_low=True,
                    hint="share of a batch backpropagated, e.g. 0.33")
        check_range(self.percentile_window, "sample_priority.percentile_window", 1, 1 << 26, whole=True,
                    hint="recent losses per worker")
        check_range(self.pay_threshold, "sample_priority.pay_threshold", 0.0, 1e6, open_low=True, none_ok=True,
                    hint="measured gain below which draws go uniform, e.g. 1.0; None = never switch")
        require(isinstance(self.replacement, bool),
                f"sample_priority.replacement must be true or false, got {shown(self.replacement)}")
        require(isinstance(self.unseen_score, str) and self.unseen_score in ("max", "mean"),
                f"sample_priority.unseen_score must be 'max' or 'mean', got {shown(self.unseen_score)}")
        require(isinstance(self.score, str) and self.score in ("loss", "loss_ema"),
                f"sample_priority.score must be 'loss' or 'loss_ema', got {shown(self.score)}")
        check_range(self.score_ema, "sample_priority.score_ema", 0.0, 1.0, open_low=True)
        check_range(self.exponent, "sample_priority.exponent", 0.0, 10.0, hint="1.0 = proportional to loss")
        check_range(self.uniform_mix, "sample_priority.uniform_mix", 0.0, 1.0, hint="e.g. 0.1")
        check_range(self.staleness_decay, "sample_priority.staleness_decay", 0.0, 1.0, open_high=True,
                    hint="per step; 0 = off")
        check_range(self.stale_after, "sample_priority.stale_after", 1, MAX_STEPS, whole=True, hint="steps")
        if self.is_exponent_start is not None:
            check_range(self.is_exponent_start, "sample_priority.is_exponent_start", 0.0, 1.0, hint="None = the mode's")
        if self.is_exponent_end is not None:
            check_range(self.is_exponent_end, "sample_priority.is_exponent_end", 0.0, 1.0, hint="1.0 = unbiased")
        check_range(self.is_anneal_steps, "sample_priority.is_anneal_steps", 0, MAX_STEPS, whole=True, hint="steps")
