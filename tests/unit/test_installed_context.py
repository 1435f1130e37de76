"""A loop fetches the context PDMLTrainer's worker wrapper installed, of its own kind only; outside a
loop, or with the other kind installed, it gets a UsageError naming the call to use (no Ray)."""

import pytest
import torch

from pdml_ray.config import NodePriorityConfig, PDMLConfig, PipelineConfig
from pdml_ray.errors import UsageError
from pdml_ray.train import get_context, get_pipeline_context
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.installed_context import set_context
from pdml_ray.train.pipeline import PipelineContext


def test_each_loop_gets_the_context_of_its_kind_and_none_outside_a_loop() -> None:
    data_parallel = PDMLContext(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8)), 0, 1,
                                torch.device("cpu"), "CPU", None)
    pipeline = PipelineContext(PDMLConfig(pipeline=PipelineConfig(schedule="1f1b", stages=2)), 1, 2,
                               torch.device("cpu"), None)  # not rank 0: no scheduler client
    with pytest.raises(UsageError, match="only available inside a training loop"):
        get_context()
    try:
        set_context(data_parallel)
        assert get_context() is data_parallel
        with pytest.raises(UsageError, match=r"get_pipeline_context\(\) is only available.*PipelineConfig"):
            get_pipeline_context()
        set_context(pipeline)
        assert get_pipeline_context() is pipeline
        with pytest.raises(UsageError, match=r"a pipeline run's loop takes pdml_ray.train.get_pipeline_context"):
            get_context()
    finally:
        set_context(None)
    with pytest.raises(UsageError):
        get_pipeline_context()
