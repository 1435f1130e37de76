"""Config validation and loading: wrong values say how to fix them."""

import pytest

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import ConfigError


@pytest.mark.parametrize("kwargs, message", [
    (dict(global_batch_size=0), r"global_batch_size must be an integer in \[1, 1073741824\]"),
    (dict(ema_alpha=0.0), "ema_alpha must be a number in"),
    (dict(ema_alpha=float("nan")), "ema_alpha must be a number in"),
    (dict(min_batch=-1), "min_batch"),
    (dict(min_batch=8, max_batch=4), r"max_batch must be an integer in \[8, "),
    (dict(hysteresis=1.5), "hysteresis"),
    (dict(prior={"H100": -1}), "prior\\['H100'\\]"),
    (dict(emulated_speeds=[1.0, 0.0]), "emulated_speeds\\[1\\]"),
    (dict(emulated_speeds=[2.0]), "fastest worker is 1.0"),
    (dict(emulated_per_sample_s=0.0), r"emulated_per_sample_s must be a number in \(0, 1\] \(seconds per sample"),
    (dict(emulated_per_sample_s=float("inf")), r"emulated_per_sample_s must be a number in \(0, 1\] \(seconds per sample"),
    (dict(max_consecutive_nonfinite=0), r"max_consecutive_nonfinite must be an integer in \[1, "),
    (dict(max_consecutive_nonfinite=2.5), r"max_consecutive_nonfinite must be an integer in \[1, "),
    (dict(max_consecutive_nonfinite=True), r"max_consecutive_nonfinite must be an integer in \[1, "),
    (dict(check_nonfinite="yes"), "check_nonfinite must be true or false"),
])
def test_node_priority_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        NodePriorityConfig(**kwargs)


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        NodePriorityConfig(global_batch_size=-3)


def test_check_workers_says_what_to_change():
    cfg = NodePriorityConfig(global_batch_size=10, min_batch=4, emulated_speeds=[1.0, 0.5])
    with pytest.raises(ConfigError, match="lower min_batch or raise global_batch_size"):
        cfg.check_workers(3)
    with pytest.raises(ConfigError, match="one speed per worker"):
        NodePriorityConfig(global_batch_size=10, emulated_speeds=[1.0, 0.5]).check_workers(3)
    with pytest.raises(ConfigError, match="raise max_batch"):
        NodePriorityConfig(global_batch_size=100, max_batch=10).check_workers(3)


def test_from_dict_and_yaml(tmp_path):
    data = {"seed": 3, "node_priority": {"global_batch_size": 64, "prior": {"A100": 0.5}},
            "sample_priority": {"exponent": 0.7}}
    cfg = PDMLConfig.from_dict(data)
    assert cfg.node_priority.global_batch_size == 64 and cfg.sample_priority.exponent == 0.7 and cfg.seed == 3
    assert cfg.node_priority.accelerator_prior()["A100"] == 0.5
    assert PDMLConfig.from_dict(cfg.to_dict()) == cfg
    path = tmp_path / "pdml.yaml"
    path.write_text("decision_interval: 3\nnode_priority:\n  global_batch_size: 32\n")
    assert PDMLConfig.from_yaml(path).decision_interval == 3


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "5", None])
def test_decision_interval_is_a_top_level_whole_number_of_steps(value):
    with pytest.raises(ConfigError, match=r"decision_interval must be an integer in \[1, "):
        PDMLConfig(decision_interval=value)


def test_decision_interval_in_the_node_section_is_refused_naming_the_valid_keys():
    # it moved out of the node section: every axis that decides at boundaries reads it
    with pytest.raises(ConfigError, match="unknown key.*decision_interval"):
        PDMLConfig.from_dict({"node_priority": {"global_batch_size": 32, "decision_interval": 3}})


def test_unknown_keys_list_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown key.*global_batch.*valid keys"):
        PDMLConfig.from_dict({"node_priority": {"global_batch": 64}})
    with pytest.raises(ConfigError, match="expected a mapping"):
        PDMLConfig.from_dict({"node_priority": 5})


def test_sample_priority_is_off_by_default():
    assert PDMLConfig().sample_priority is None


def test_a_missing_global_batch_size_is_refused_with_the_fix():
    from pdml_ray.scheduler import Scheduler

    with pytest.raises(ConfigError, match="global_batch_size is not set"):
        Scheduler(PDMLConfig(node_priority=NodePriorityConfig()), 2)
    with pytest.raises(ConfigError, match="enables no priority axis.*node_priority=NodePriorityConfig"):
        Scheduler(PDMLConfig(), 2)
    assert NodePriorityConfig(global_batch_size=64).batch == 64


def test_the_config_says_what_it_emulates():
    assert NodePriorityConfig(global_batch_size=8).emulation is None
    assert NodePriorityConfig(emulated_speeds=[1.0, 0.4]).emulation == \
        "EMULATED speeds 1,0.4 (measured compute scaled by 1/speed)"
    text = NodePriorityConfig(emulated_speeds=[1.0, 0.4], emulated_per_sample_s=2.5e-4).emulation
    assert text == "EMULATED compute: sleep 0.25 ms/sample / speed, speeds 1,0.4"


def test_the_nonfinite_guard_is_on_by_default_and_loads_from_yaml(tmp_path):
    cfg = NodePriorityConfig(global_batch_size=8)
    assert cfg.check_nonfinite is True and cfg.max_consecutive_nonfinite == 3
    path = tmp_path / "pdml.yaml"
    path.write_text("node_priority: {global_batch_size: 8, check_nonfinite: false, max_consecutive_nonfinite: 5}\n")
    loaded = PDMLConfig.from_yaml(path).node_priority
    assert loaded.check_nonfinite is False and loaded.max_consecutive_nonfinite == 5
