"""PDMLTrainer.fit() leaks no scheduler on any error, and refuses Ray's deprecated resume_from_checkpoint
with the supported path (no Ray cluster: the scheduler and TorchTrainer are doubles)."""

import pytest
import ray.train

import pdml_ray.train.trainer as trainer_module
from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import ConfigError
from pdml_ray.train import PDMLTrainer

CONFIG = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8))


def _trainer(**kwargs) -> PDMLTrainer:
    return PDMLTrainer(lambda: None, run_config=ray.train.RunConfig(name="leak"), pdml_config=CONFIG, **kwargs)


def test_resume_from_checkpoint_is_refused_naming_the_run_storage_path():
    with pytest.raises(ConfigError, match=r"RunConfig\(name=\.\.\., storage_path=\.\.\.\)"):
        _trainer(resume_from_checkpoint=object())


@pytest.mark.parametrize("failure", ["constructor", "fit"])
def test_fit_leaves_no_scheduler_behind_whatever_fails(monkeypatch, failure):
    started, ended = [], []

    class Scheduler:
        class ping:  # noqa: N801 - Ray's method handles
            remote = staticmethod(lambda: True)

        class close:  # noqa: N801
            remote = staticmethod(lambda: True)

    class TorchTrainer:
        def __init__(self, *args, **kwargs):
            if failure == "constructor":
                raise TypeError("TorchTrainer() got an unexpected keyword argument")

        def fit(self):
            raise RuntimeError("the worker group failed")

    import ray.train.torch

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", TorchTrainer)
    monkeypatch.setattr(trainer_module, "create_scheduler", lambda *a, **k: started.append(Scheduler()) or started[-1])
    monkeypatch.setattr(trainer_module.ray, "get", lambda ref, timeout=None: ref)
    monkeypatch.setattr(trainer_module.ray, "kill", ended.append)
    with pytest.raises((TypeError, RuntimeError)):
        _trainer().fit()
    assert ended == started and (started == [] if failure == "constructor" else len(started) == 1)
