"""The one registry of priority derivers: name -> class and the ``PDMLConfig`` field that enables it.

A deriver is enabled when its config field is not None, so a run builds only the axes it configures
(a Ray Train run sets ``node_priority``; with ``enabled=False`` it keeps uniform shares but still
measures; the pipeline runtime sets ``pipeline`` and may leave the node axis off; both P3 runtimes set
``p3``). Order matters: derivers decide in
this order at a boundary, and each sees what the ones before it decided (sample plans are sized by
the node decision). A new axis is one entry here, one config field and one module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from pdml_ray.config import PDMLConfig
from pdml_ray.errors import ConfigError
from pdml_ray.priority.base import Deriver


@dataclass(frozen=True, slots=True)
class DeriverEntry:
    target: str
    """"module:Class" of the deriver, imported on first use."""
    config_field: str
    """The ``PDMLConfig`` field whose value (not None) enables it."""


DERIVERS: dict[str, DeriverEntry] = {
    "node": DeriverEntry("pdml_ray.priority.node:NodePriorityDeriver", "node_priority"),
    "sample": DeriverEntry("pdml_ray.priority.sample_deriver:SamplePriorityDeriver", "sample_priority"),
    "gradient": DeriverEntry("pdml_ray.priority.gradient:GradientPriorityDeriver", "gradient_priority"),
    "pipeline": DeriverEntry("pdml_ray.priority.pipeline:PipelineDeriver", "pipeline"),
    "p3": DeriverEntry("pdml_ray.priority.p3:P3Deriver", "p3"),
}


def deriver_class(name: str) -> type[Deriver]:
    if name not in DERIVERS:
        raise ConfigError(f"unknown deriver {name!r}; valid names: {list(DERIVERS)}")
    module_name, cls_name = DERIVERS[name].target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def enabled_derivers(config: PDMLConfig) -> list[str]:
    """Names of the derivers ``config`` enables, in decision order."""
    return [name for name, entry in DERIVERS.items() if getattr(config, entry.config_field) is not None]


def make_derivers(config: PDMLConfig, num_workers: int) -> dict[str, Deriver]:
    """One instance of every enabled deriver, in decision order."""
    return {name: deriver_class(name)(config, num_workers) for name in enabled_derivers(config)}
