"""The one registry of straggler policies: name -> "module:Class", imported on first use.

Policy names are written here and nowhere else; configs, the runtime and the benchmark read them
from ``POLICIES``. This module imports nothing at load time, so configs validate names against it
without an import cycle.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING

from pdml_ray.errors import ConfigError

if TYPE_CHECKING:
    from pdml_ray.config.gradient import GradientPriorityConfig
    from pdml_ray.stragglers.policy import StragglerPolicy

POLICIES: dict[str, str] = {
    "sync": "pdml_ray.stragglers.policies.sync:SyncPolicy",
    "ignore-stragglers": "pdml_ray.stragglers.policies.ignore_stragglers:IgnoreStragglersPolicy",
    "backup": "pdml_ray.stragglers.policies.backup:BackupPolicy",
    "gc-fr": "pdml_ray.stragglers.policies.gc:FRGradientCoding",
    "gc-cr": "pdml_ray.stragglers.policies.gc:CRGradientCoding",
    "pgc-fr": "pdml_ray.stragglers.policies.pgc:PipelinedFR",
    "pgc-cr": "pdml_ray.stragglers.policies.pgc:PipelinedCR",
    "topk": "pdml_ray.stragglers.policies.topk:TopKPolicy",
    "async": "pdml_ray.stragglers.policies.async_updates:AsyncPolicy",
}


def make_policy(name: str, *, workers: int, stragglers: int, seed: int = 0,
                gradient_priority: GradientPriorityConfig | None = None) -> StragglerPolicy:
    """Build policy ``name`` for n = ``workers`` and s = ``stragglers`` (b backup workers for ``backup``),
    with ``gradient_priority`` for the policies that take their rule from the gradient axis (``topk``,
    ``async``; None: its defaults).

    Invalid codes (FR without (s + 1) | n, s >= n, s < 0) raise ConfigError, and so does a
    ``gradient_priority`` given to a policy that uses none (it would be computed and dropped).
    """
    if name not in POLICIES:
        raise ConfigError(f"unknown straggler policy {name!r}; valid names: {sorted(POLICIES)}")
    if not (isinstance(workers, int) and workers >= 1):
        raise ConfigError(f"straggler policy {name}: workers must be an integer >= 1, got {workers!r}")
    if not (isinstance(stragglers, int) and 0 <= stragglers < workers):
        raise ConfigError(f"straggler policy {name}: stragglers must be an integer in [0, workers={workers}), "
                          f"got {stragglers!r}")
    module_name, cls_name = POLICIES[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    if gradient_priority is None:
        policy: StragglerPolicy = cls(workers, stragglers, seed)
        return policy
    if "gradient_priority" not in inspect.signature(cls).parameters:
        takes = sorted(n for n, target in POLICIES.items() if "gradient_priority" in inspect.signature(
            getattr(importlib.import_module(target.split(":")[0]), target.split(":")[1])).parameters)
        raise ConfigError(f"straggler policy {name} uses no gradient priorities; gradient_priority acts in {takes}: "
                          "pick one of those or leave gradient_priority unset")
    policy = cls(workers, stragglers, seed, gradient_priority=gradient_priority)
    return policy
