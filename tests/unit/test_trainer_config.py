"""What PDMLTrainer refuses before anything starts (no Ray cluster needed): a run without the node
section it needs, and an axis nothing in Ray Train would act on; and a loop written in ``__main__``
that Ray must pickle by value."""

from __future__ import annotations

import types

import pytest
import ray.cloudpickle
import torch
from ray.train import ScalingConfig

from pdml_ray.config import GradientPriorityConfig, NodePriorityConfig, PDMLConfig
from pdml_ray.errors import ConfigError
from pdml_ray.train import PDMLTrainer
from pdml_ray.train.trainer import pickle_modules_by_name


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


_MAIN_LOOP = """
def loop(config):
    import torch.distributed as dist
    return torch.ones(1), dist, config.config  # an attribute named config, as ctx.config is
"""


def test_a_loop_written_in_main_that_reaches_a_torch_config_module_pickles():
    """A loop of a user's script is pickled by value, with each loaded submodule whose name parts its
    code holds: ``distributed`` and ``config`` bring in ``torch.distributed.config``, a ModuleType
    subclass cloudpickle cannot pickle (the GPU check's loop failed so before training). fit()
    registers torch's module types with Ray; the loop then travels and runs where it is loaded."""
    import torch.distributed.config  # noqa: F401  (loaded, as DDP and FSDP load it in a real run)

    namespace = {"__name__": "__main__", "torch": torch}
    exec(_MAIN_LOOP, namespace)
    pickle_modules_by_name()
    loop = ray.cloudpickle.loads(ray.cloudpickle.dumps(namespace["loop"]))
    ones, dist, value = loop(types.SimpleNamespace(config=3))
    assert ones.item() == 1.0 and dist is torch.distributed and value == 3
