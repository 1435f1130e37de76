"""The one registry of straggler policies: name -> "module:Class", imported on first use.

Policy names are written here and nowhere else; configs, the runtime and the benchmark read them
from ``POLICIES``. This module imports nothing at load time, so configs validate names against it
without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pdml_ray.errors import ConfigError

if TYPE_CHECKING:
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


def make_policy(name: str, *, workers: int, stragglers: int, seed: int = 0) -> StragglerPolicy:
    """Build policy ``name`` for n = ``workers`` and s = ``stragglers`` (b backup workers for ``backup``).

    Invalid codes (FR without (s + 1) | n, s >= n, s < 0) raise ConfigError.
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
    policy: StragglerPolicy = cls(workers, stragglers, seed)
    return policy
