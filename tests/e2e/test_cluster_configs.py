"""Every config in cluster_configs/ passes Ray's own cluster-config schema, as `ray up` checks it, and
keeps the security settings the README promises. No cluster is started here (that is test_local_cluster.py)."""

from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "cluster_configs").glob("*.yaml"))


def _start_commands(config: dict) -> list[str]:
    return config.get("head_start_ray_commands", []) + config.get("worker_start_ray_commands", [])


def test_the_shipped_configs_are_all_here():
    assert {p.name for p in CONFIGS} >= {"aws-mixed-h100-a100.yaml", "on-prem.yaml", "local.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_passes_rays_schema_as_ray_up_validates_it(path):
    config = yaml.safe_load(path.read_text())
    validate_config(prepare_config(config))  # what `ray up` / the autoscaler run: defaults merged, then the schema


def test_a_config_breaking_rays_schema_is_caught():
    config = yaml.safe_load((CONFIGS[0].parent / "local.yaml").read_text())
    del config["available_node_types"]["a100"]["resources"]  # required by the schema
    with pytest.raises(Exception, match="resources"):
        validate_config(prepare_config(config))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_keeps_the_dashboard_on_localhost_and_token_auth_on(path):
    config = yaml.safe_load(path.read_text())
    commands = " ".join(_start_commands(config))
    assert "0.0.0.0" not in path.read_text()
    for command in _start_commands(config):
        if "ray start" in command:
            assert "RAY_AUTH_MODE=token" in command, command  # token authentication stays on
            assert "RAY_AUTH_MODE=disabled" not in command
        if "ray start --head" in command:
            assert "--dashboard-host=127.0.0.1" in command, command
    if config["provider"]["type"] != "external":  # the real clusters copy the client's token to every node
        assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
        assert "ray start" in commands


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "local.yaml"], ids=lambda p: p.name)
def test_remote_config_pins_ray_and_keeps_local_builds_out_of_the_sync(path):
    config = yaml.safe_load(path.read_text())
    setup = " ".join(config["setup_commands"])
    import ray

    assert f'"ray[default,train]=={ray.__version__}"' in setup  # the Ray the project is tested with
    assert ".venv" in config["rsync_exclude"] and "*.egg-info" in config["rsync_exclude"]


def test_aws_config_runs_h100_and_a100_with_efa_on_a_current_image():
    config = yaml.safe_load((CONFIGS[0].parent / "aws-mixed-h100-a100.yaml").read_text())
    types = config["available_node_types"]
    for name, instance, cards in (("h100", "p5.48xlarge", 32), ("a100", "p4d.24xlarge", 4)):
        node = types[name]["node_config"]
        assert node["InstanceType"] == instance
        assert "latest_dlami" not in node["ImageId"] and "ubuntu-24.04" in node["ImageId"]  # Python 3.12
        interfaces = node["NetworkInterfaces"]
        assert [i["NetworkCardIndex"] for i in interfaces] == list(range(cards))
        assert all(i["InterfaceType"] == "efa" for i in interfaces)
        assert f"accelerator_type:{name.upper()}" in types[name]["resources"]


def test_local_config_has_an_a100_and_an_h100_node_type():
    config = yaml.safe_load((CONFIGS[0].parent / "local.yaml").read_text())
    resources = [t["resources"] for t in config["available_node_types"].values()]
    assert {"CPU": 1, "accelerator_type:A100": 1} in resources
    assert {"CPU": 1, "accelerator_type:H100": 1} in resources
    assert config["provider"]["module"].endswith("FakeMultiNodeProvider")
