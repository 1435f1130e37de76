"""Gradient weights through the standard wrappers on real Ray Train workers (gloo): a model the user
wrapped in DDP, or sharded with FSDP2's fully_shard, trains with unequal batch sizes and its combined
gradient equals the gradient of the same global batch computed in one process."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray.train

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import ConfigError
from pdml_ray.train import PDMLTrainer

from loops import buffers_loop, plain_loop, short_loop, wrapped_loop


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_combined_gradient_equals_the_global_batch_gradient(ray_local, tmp_path, sync):
    out = tmp_path / "out.json"
    config = PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(global_batch_size=256, emulated_speeds=[1.0, 0.4], warmup_steps=1, ema_alpha=1.0),
                        scheduler_name=f"wrappers-{sync}")
    PDMLTrainer(wrapped_loop, train_loop_config={"out": str(out), "steps": 14, "sync": sync},
                scaling_config=ray.train.ScalingConfig(num_workers=2),
                run_config=ray.train.RunConfig(name=f"wrappers-{sync}", storage_path=str(tmp_path)),
                pdml_config=config).fit()
    result = json.loads(out.read_text())
    # the first decision is adopted when its answer is there (never waited on): by step ~4 on a quiet
    # machine, by step 8 under a load of 10, so 14 steps leave several at unequal sizes either way
    unequal = [c for c in result["checks"] if c["sizes"][0] != c["sizes"][1]]
    assert len(unequal) >= 3, result["checks"]
    for check in result["checks"]:
        assert check["max_abs_diff"] < 1e-5, check
    assert result["has_module"]


def test_fit_returns_ray_trains_result_and_says_when_the_loop_never_used_pdml(ray_local, tmp_path):
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8), scheduler_name="wrappers-plain")
    with pytest.warns(UserWarning, match="never ran a step through pdml-ray"):
        result = PDMLTrainer(plain_loop, scaling_config=ray.train.ScalingConfig(num_workers=1),
                             run_config=ray.train.RunConfig(name="wrappers-plain", storage_path=str(tmp_path)),
                             pdml_config=config).fit()
    assert isinstance(result, ray.train.Result) and result.error is None
    assert result.pdml.stats.reports_received == 0 and result.pdml.warnings
    assert "PDMLRunInfo(" in repr(result.pdml) and len(repr(result.pdml)) < 200


def test_scaling_configs_pdml_ray_cannot_split_over_are_refused():
    with pytest.raises(ConfigError, match="fixed number of workers"):
        PDMLTrainer(plain_loop, scaling_config=ray.train.ScalingConfig(num_workers=0),
                    pdml_config=PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=8)))


def test_two_concurrent_runs_get_their_own_scheduler(ray_local, tmp_path):
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64))  # no scheduler name: per run

    def fit(name, steps):
        out = tmp_path / f"{name}.json"
        result = PDMLTrainer(short_loop, train_loop_config={"out": str(out), "steps": steps},
                             scaling_config=ray.train.ScalingConfig(num_workers=1),
                             run_config=ray.train.RunConfig(name=name, storage_path=str(tmp_path)),
                             pdml_config=config).fit()
        return result, json.loads(out.read_text())

    with ThreadPoolExecutor(2) as pool:
        (a, out_a), (b, out_b) = pool.map(fit, ["run-a", "run-b"], [12, 20])
    assert out_a["scheduler"] == "pdml-run-a" and out_b["scheduler"] == "pdml-run-b"
    # each scheduler saw its own run's reports only, and neither run lost its scheduler to the other
    assert a.pdml.stats.reports_received == 12 and b.pdml.stats.reports_received == 20
    assert out_a["steps"] == 12 and out_b["steps"] == 20
    with pytest.raises(ConfigError, match="already running"):  # a name in use is refused, not shared
        from pdml_ray.actors.scheduler import create_scheduler

        keep = create_scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64),
                                           scheduler_name="pdml-taken"), 1)
        ray.get(keep.ping.remote())
        create_scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=64),
                                    scheduler_name="pdml-taken"), 1)


def test_a_plain_module_gets_ddp_and_its_buffers_follow_rank_0(ray_local, tmp_path):
    out = tmp_path / "buffers.json"
    # min_batch: the model has BatchNorm, which cannot train on one sample (a noisy split once gave rank 1 one)
    config = PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(global_batch_size=128, emulated_speeds=[1.0, 0.5], warmup_steps=1, min_batch=8))
    PDMLTrainer(buffers_loop, train_loop_config={"out": str(out)}, scaling_config=ray.train.ScalingConfig(num_workers=2),
                run_config=ray.train.RunConfig(name="wrappers-buffers", storage_path=str(tmp_path)),
                pdml_config=config).fit()
    rank0, rank1 = json.loads(out.read_text())
    assert len(rank0) == len(rank1) == 12
    assert rank0 == rank1  # at every step's start both ranks hold rank 0's running statistics
    assert rank0[-1] != rank0[0]  # and they did move
