"""Typed configuration: one module per component's config, gathered in ``PDMLConfig``.

Every config is a ``@dataclass(kw_only=True, slots=True)`` that validates itself in
``__post_init__``; a bad value raises ``ConfigError`` (a ``ValueError``) whose message names the
field and says how to fix it. ``PDMLConfig.from_dict`` and ``PDMLConfig.from_yaml`` load the same
dataclasses from plain data (``loading.load_dataclass``); unknown keys are errors.

    node.py        NodePriorityConfig, DEFAULT_ACCELERATOR_PRIOR
    sample.py      SamplePriorityConfig
    continuity.py  ContinuityConfig
    pipeline.py    PipelineConfig, OspreyConfig, RebalanceConfig
    gradient.py    GradientPriorityConfig
    stragglers.py  StragglerConfig
    p3.py          P3Config
    training.py    what a Ray Train run requires of a config (``PDMLTrainer`` and ``validate-config`` alike)
    checks.py      the checks every ``__post_init__`` uses (ranges, whole numbers, messages that say the fix)
    pdml.py        PDMLConfig (one field per component)
"""

from pdml_ray.config.continuity import ContinuityConfig
from pdml_ray.config.gradient import GradientPriorityConfig
from pdml_ray.config.loading import load_dataclass
from pdml_ray.config.node import DEFAULT_ACCELERATOR_PRIOR, NodePriorityConfig
from pdml_ray.config.p3 import P3Config
from pdml_ray.config.pdml import PDMLConfig
from pdml_ray.config.pipeline import OspreyConfig, PipelineConfig, RebalanceConfig
from pdml_ray.config.sample import SamplePriorityConfig
from pdml_ray.config.stragglers import StragglerConfig

__all__ = ["DEFAULT_ACCELERATOR_PRIOR", "ContinuityConfig", "GradientPriorityConfig", "NodePriorityConfig", "OspreyConfig",
           "P3Config", "PDMLConfig", "PipelineConfig", "RebalanceConfig", "SamplePriorityConfig", "StragglerConfig",
           "load_dataclass"]
