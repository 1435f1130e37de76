"""What PDMLTrainer refuses before anything starts (no Ray cluster needed): a run without the node
section it needs, and an axis nothing in Ray Train would act on."""

from __future__ import annotations

import pytest
from ray.train import ScalingConfig

from pdml_ray.config import GradientPriorityConfig, NodePriorityConfig, PDMLConfig
from pdml_ray.errors import ConfigError
from pdml_ray.train import PDMLTrainer


def _loop(config):  # never runs: the trainer refuses its config first
    raise AssertionError("the loop must not run")


def test_a_ray_train_run_needs_the_node_section():
    with pytest.raises(ConfigError, match=r"needs node priorities: set PDMLConfig\(node_priority="):
        PDMLTrainer(_loop, scaling_config=ScalingConfig(num_workers=2), pdml_config=PDMLConfig())


def test_gradient_priorities_are_refused_where_nothing_acts_on_them():
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64),
                        gradient_priority=GradientPriorityConfig())
    with pytest.raises(ConfigError, match=r"acts in the straggler-tolerant runtime.*topk and async"):
        PDMLTrainer(_loop, scaling_config=ScalingConfig(num_workers=2), pdml_config=config)
    ok = PDMLTrainer(_loop, scaling_config=ScalingConfig(num_workers=2),
                     pdml_config=PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64)))
    assert ok.num_workers == 2
