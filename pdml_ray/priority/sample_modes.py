"""The sample-priority modes (``SamplePriorityConfig.mode``): one registry of what each does to the
one score table and the one sampler.

A mode decides three things, nothing else:

- ``prioritised``: whether the draws follow the scores (else they are uniform, every weight 1);
- ``reducible``: whether a sample's score is its loss minus its irreducible loss (RHO-LOSS), or the loss;
- ``beta``: the importance-weight exponent at a step (the bias correction), from the config's
  ``is_exponent_start``, ``is_exponent_end`` (None: the mode's ``exponents``) and ``is_anneal_steps``.

| mode | draws | score | beta | bias |
| --- | --- | --- | --- | --- |
| importance | by score | loss | linear start -> end | none once beta = 1 |
| annealed | by score | loss | start + (end - start) * f^3 (f: anneal fraction) | towards high loss, until late |
| selective-backprop | uniform | loss | 1 (weights all 1) | the worker backpropagates its high-loss share |
| rho-loss | by score | max(loss - irreducible, 0) | 0 (the paper's: unweighted), or linear start -> end where set | towards learnable, high-loss samples |

rho-loss's irreducible losses are checked by one function here (``irreducible_problem``), wherever
they enter. Selective-backprop's selection itself runs on the worker (``pdml_ray.priority.selective_backprop``),
where the losses are; the table still scores every drawn sample (for the switch and ``pdml-ray status``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pdml_ray.config import SamplePriorityConfig
from pdml_ray.config.sample import SAMPLE_MODES
from pdml_ray.errors import ConfigError


def _fraction(config: SamplePriorityConfig, step: int) -> float:
    """How far the anneal is at ``step`` (0 to 1; 1 at once when is_anneal_steps is 0)."""
    if config.is_anneal_steps == 0:
        return 1.0
    return min(1.0, max(step, 0) / config.is_anneal_steps)


def exponents(config: SamplePriorityConfig) -> tuple[float, float]:
    """(beta at step 0, beta after the anneal): the config's, or its mode's where it leaves them None."""
    start, end = MODES[config.mode].exponents
    return (start if config.is_exponent_start is None else config.is_exponent_start,
            end if config.is_exponent_end is None else config.is_exponent_end)


def linear_beta(config: SamplePriorityConfig, step: int) -> float:
    """beta rising linearly from is_exponent_start to is_exponent_end over is_anneal_steps."""
    start, end = exponents(config)
    f = _fraction(config, step)
    return end if f >= 1.0 else start + (end - start) * f


def late_beta(config: SamplePriorityConfig, step: int) -> float:
    """beta rising as the cube of the anneal fraction: at half the anneal it has covered 1/8 of the way,
    so the sampler keeps most of its bias towards high-loss samples until late, then corrects it."""
    start, end = exponents(config)
    f = _fraction(config, step)
    return end if f >= 1.0 else start + (end - start) * f ** 3


def no_correction(config: SamplePriorityConfig, step: int) -> float:
    """Uniform draws need no correction: every weight is 1 (beta is reported as 0)."""
    return 0.0


@dataclass(frozen=True, slots=True)
class ModeRule:
    """What one mode does to the table and the sampler."""

    prioritised: bool
    """Draws follow the scores (False: uniform draws, every importance weight 1)."""
    reducible: bool
    """Scores are the loss minus the sample's irreducible loss (floored at 0)."""
    beta: Callable[[SamplePriorityConfig, int], float]
    """The importance-weight exponent at a step."""
    bias: str
    """What the mode leaves biased (the guide and the stats say it)."""
    exponents: tuple[float, float] = (0.4, 1.0)
    """The mode's (is_exponent_start, is_exponent_end), where the config leaves them None."""


MODES: dict[str, ModeRule] = {
    "importance": ModeRule(True, False, linear_beta, "none once beta reaches 1 (is_exponent_end 1.0)"),
    "annealed": ModeRule(True, False, late_beta, "towards high-loss samples until late in the anneal"),
    "selective-backprop": ModeRule(False, False, no_correction,
                                   "only the high-loss share of each batch is backpropagated"),
    # the RHO-LOSS paper trains its selection unweighted; measured faster to the target than the corrected
    # form (0.4 -> 1) in 5 of 6 noisy settings of bench sampling (BENCHMARKS.md)
    "rho-loss": ModeRule(True, True, linear_beta, "towards high reducible loss (learnable, not yet learnt), "
                         "unweighted unless is_exponent_start/end are set", exponents=(0.0, 0.0)),
}
assert tuple(MODES) == SAMPLE_MODES  # the config's check and this registry name the same modes


def irreducible_problem(losses: Any, num_samples: int | None = None) -> str | None:
    """Why ``losses`` cannot be a table's irreducible losses, or None: a 1-D array of finite numbers >= 0
    (per-sample losses of the irreducible-loss model), one per sample where ``num_samples`` is given.
    The one check of the table, the scheduler's sample axis and ``PDMLContext.set_irreducible_losses``
    (rho-loss's one input besides the losses)."""
    try:
        il = np.asarray(losses, dtype=np.float64)
    except (TypeError, ValueError):
        return f"irreducible losses must be numbers, got {type(losses).__name__}"
    if il.ndim != 1:
        return f"irreducible losses must be one loss per sample, a 1-D array; got shape {il.shape}"
    if num_samples is not None and il.size != num_samples:
        return f"one irreducible loss per sample of the data set: {num_samples} expected, got {il.size}"
    if not (np.all(np.isfinite(il)) and (il.size == 0 or il.min() >= 0.0)):
        return "irreducible losses must be finite and >= 0 (per-sample losses of the irreducible-loss model)"
    return None


def mode_rule(name: str) -> ModeRule:
    """The rule of mode ``name``; an unknown name raises ConfigError listing the valid ones."""
    try:
        return MODES[name]
    except KeyError:
        raise ConfigError(f"unknown sample_priority.mode {name!r}; valid: {', '.join(MODES)}") from None
