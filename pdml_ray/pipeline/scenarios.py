"""Non-stationary scenarios for the pipeline simulator: the conditions adaptive scheduling is for.

Each scenario is a ``ClusterProfile`` of one shape and seed (nominal costs F = 1 s, B = 2 s per
micro-batch at a stage, as the named profiles):

* ``homogeneous``: every replica at nominal speed, nothing varies (the control).
* ``drift``: one replica (drawn from the seed) slows by ``drift_factor`` for a window of the steps
  (from a quarter of the way in, for ``drift_window`` of them), then recovers.
* ``uneven``: micro-batches of long-tailed sequence lengths (lognormal, ``seq_len_sigma``), costs
  (1 - a) L + a L^2 with attention share a; the lengths of a step are known before it is planned.
* ``comm-delay``: every transfer between ranks takes ``transfer_s``, and each is late by
  ``transfer_delay_s`` with probability ``transfer_delay_p``.
* ``memory-cap``: activation memory per micro-batch follows its sequence length (``uneven``'s
  lengths), and each replica may hold ``memory_cap`` x stages mean activations: less than what 1F1B's
  warm-up holds at the first stages, so orders that ignore the cap exceed it. Lengths are truncated at
  that budget (a data loader's maximum length), so a micro-batch fits alone and some order always
  stays within the cap: untruncated, a micro-batch longer than the budget would exceed it whatever the
  order.
* ``slow-stage``: every replica of one stage (drawn from the seed) slows by ``drift_factor`` from a
  quarter of the way in and stays slow (a persistent drift, no recovery): what layer re-balancing is
  for. Each stage starts with ``layers_per_stage`` equal layers (``scenario_layers``), so layers can move.

Every other field is nominal; the memory limit is ``stages`` mean activations per replica (1F1B's peak)
outside ``uneven`` (none: it is about costs) and ``memory-cap``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pdml_ray.errors import ConfigError
from pdml_ray.pipeline.simulate import ClusterProfile, LayerCosts, SlowWindow

SCENARIOS: tuple[str, ...] = ("homogeneous", "drift", "uneven", "comm-delay", "memory-cap", "slow-stage")


@dataclass(kw_only=True, slots=True)
class ScenarioConfig:
    """The knobs of the non-stationary scenarios (defaults: the benchmark's)."""

    drift_factor: float = 0.5
    """Speed multiplier of the drifting replica inside its window (0.5: twice as slow)."""
    drift_window: float = 0.5
    """Share of the steps the slowdown lasts (it starts a quarter of the way in)."""
    seq_len_sigma: float = 0.8
    """Sigma of the lognormal sequence length (mean one) of ``uneven`` and ``memory-cap``."""
    attention_share: float = 0.5
    """Share of a mean-length micro-batch's cost that is attention (quadratic in length)."""
    transfer_s: float = 0.1
    """Seconds every transfer between ranks takes in ``comm-delay`` (a forward takes 1 s)."""
    transfer_delay_p: float = 0.1
    """Probability that one transfer is late in ``comm-delay``."""
    transfer_delay_s: float = 2.0
    """Extra seconds a late transfer takes (two forwards' worth)."""
    memory_cap: float = 0.5
    """``memory-cap``'s budget per replica as a share of ``stages`` mean-length activations (rounded
    up, at least 2)."""
    layers_per_stage: int = 4
    """``slow-stage``: equal layers each stage starts with (a stage's F and B split evenly over them)."""

    def __post_init__(self) -> None:
        checks = {"drift_factor": 0 < self.drift_factor, "drift_window": 0 < self.drift_window <= 1,
                  "seq_len_sigma": 0 <= self.seq_len_sigma <= 3, "attention_share": 0 <= self.attention_share <= 1,
                  "transfer_s": self.transfer_s >= 0, "transfer_delay_p": 0 <= self.transfer_delay_p <= 1,
                  "transfer_delay_s": self.transfer_delay_s >= 0, "memory_cap": 0 < self.memory_cap <= 1,
                  "layers_per_stage": isinstance(self.layers_per_stage, int) and 1 <= self.layers_per_stage <= 1024}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"scenario config: {bad} out of range; drift_factor > 0, drift_window and memory_cap in "
                              "(0, 1], seq_len_sigma in [0, 3], attention_share and transfer_delay_p in [0, 1], "
                              "seconds >= 0, layers_per_stage an integer in [1, 1024]")


def memory_cap(stages: int, config: ScenarioConfig) -> int:
    """``memory-cap``'s activation budget per replica (mean-length activations of a whole stage)."""
    return max(2, math.ceil(config.memory_cap * stages))


def scenario_profile(name: str, stages: int, replicas: int | Sequence[int], *, seed: int, steps: int,
                     config: ScenarioConfig | None = None) -> ClusterProfile:
    """Scenario ``name``'s profile for ``stages`` x ``replicas`` over ``steps`` global steps, drawn from ``seed``."""
    cfg = config if config is not None else ScenarioConfig()
    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; valid names: {list(SCENARIOS)}")
    reps = (replicas,) * stages if isinstance(replicas, int) else tuple(int(r) for r in replicas)
    fields: dict[str, Any] = {"memory_limit": stages}
    if name == "drift":
        rng = np.random.default_rng([seed, 29])
        stage = int(rng.integers(stages))
        replica = int(rng.integers(reps[stage]))
        fields["slow_windows"] = (SlowWindow(stage, replica, cfg.drift_factor, steps // 4,
                                             max(1, round(cfg.drift_window * steps))),)
    elif name == "uneven":
        # No memory limit: this scenario is about costs (memory-cap is about memory). Counted in lengths, every
        # static order exceeds 1F1B's peak here, and a schedule that kept to it would be compared with orders
        # that do not.
        fields.update(seq_len_sigma=cfg.seq_len_sigma, attention_share=cfg.attention_share, memory_limit=None)
    elif name == "comm-delay":
        fields.update(transfer_s=cfg.transfer_s, transfer_delay_p=cfg.transfer_delay_p,
                      transfer_delay_s=cfg.transfer_delay_s)
    elif name == "slow-stage":
        stage = int(np.random.default_rng([seed, 31]).integers(stages))
        start = steps // 4
        fields["slow_windows"] = tuple(SlowWindow(stage, r, cfg.drift_factor, start, max(1, steps - start))
                                       for r in range(reps[stage]))
    elif name == "memory-cap":
        fields.update(seq_len_sigma=cfg.seq_len_sigma, attention_share=cfg.attention_share,
                      memory_limit=memory_cap(stages, cfg), max_seq_len=float(memory_cap(stages, cfg)))
    return ClusterProfile.build(stages, reps, seed=seed, **fields)


def scenario_layers(stages: int, config: ScenarioConfig | None = None, *, forward_s: float = 1.0,
                    backward_s: float = 2.0) -> tuple[LayerCosts, tuple[int, ...]]:
    """``slow-stage``'s model: ``layers_per_stage`` equal layers per stage (the nominal stage costs split
    evenly), and the cuts that give each stage its share."""
    per = (config if config is not None else ScenarioConfig()).layers_per_stage
    layers = LayerCosts(forward_s=(forward_s / per,) * (stages * per), backward_s=(backward_s / per,) * (stages * per))
    return layers, tuple(per * k for k in range(1, stages))
