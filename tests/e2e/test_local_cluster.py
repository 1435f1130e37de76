"""cluster_configs/local.yaml end to end: an autoscaled fake A100 + H100 cluster, a job through `ray job submit`.

The cluster is private to the test: its own temp dir, free ports, its own auth token. It is stopped by
killing the processes it started (never `ray stop`, which would end every other Ray on the machine).
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")

# One worker per fake node (each has 1 CPU, the head none). Prints every node decision and the
# accelerator type of each worker, as JSON, for the test to read.
JOB = """
import json, ray, ray.train
from pdml_ray import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer
from pdml_ray.train.workloads import classification_loop

ray.init()
result = PDMLTrainer(
    classification_loop,
    train_loop_config={"num_samples": 6 * 256, "dim": 16, "hidden": 32, "depth": 1, "num_classes": 4,
                       "epochs": 1, "lr": 0.05, "seed": 0},
    scaling_config=ray.train.ScalingConfig(num_workers=2),
    pdml_config=PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(global_batch_size=256)),
).fit()
node = result.pdml.stats.derivers["node"]
print("PDML_ACCELERATORS " + json.dumps(list(node.accelerator_types)))
for d in result.pdml.decisions:
    print("PDML_DECISION " + json.dumps({k: d[k] for k in ("version", "effective_step", "batch_sizes", "reason")}))
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process, from /proc (Linux)."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            procs[int(entry.name)] = (ppid, cmdline)
    return procs


def _cluster_processes(temp_dir: str) -> set[int]:
    """Every process of this cluster: those naming its temp dir, and their descendants (fake nodes, workers)."""
    procs = _processes()
    found = {pid for pid, (_, cmd) in procs.items() if temp_dir in cmd}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in procs.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return found - {os.getpid()}


def _stop_cluster(temp_dir: str) -> None:
    for _ in range(5):  # processes started while we kill (a node launch in flight) are caught next round
        pids = _cluster_processes(temp_dir)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)


def _alive_accelerator_nodes(env: dict, gcs: str) -> set[str]:
    script = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
              "print('NODES', json.dumps([r for n in ray.nodes() if n['Alive'] for r in n['Resources'] "
              "if r.startswith('accelerator_type:')]))" % gcs)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.startswith("NODES ")]
    return set(json.loads(lines[-1].split(" ", 1)[1])) if out.returncode == 0 and lines else set()


def test_local_yaml_autoscales_a100_and_h100_and_runs_a_submitted_job(tmp_path):
    try:
        gcs_port, dash_port, agent_port, agent_grpc, client_port, metrics_port = _free_ports(6)
    except OSError as e:
        pytest.skip(f"no free local ports for a private Ray cluster: {e}")
    from ray._private.services import get_node_ip_address

    ip = get_node_ip_address()  # the address the fake nodes register with: one address for the whole cluster
    # short (Ray's socket paths must fit 107 bytes) and unique: also the marker that finds the processes
    temp_dir = tempfile.mkdtemp(prefix="pdml-lc-")
    config = yaml.safe_load((ROOT / "cluster_configs" / "local.yaml").read_text())
    config["provider"]["gcs_address"] = f"{ip}:{gcs_port}"  # the provider's default is port 6379
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.py").write_text(JOB)
    start = time.monotonic()
    try:
        started = subprocess.run(
            [RAY, "start", "--head", f"--port={gcs_port}", "--num-cpus=0", f"--temp-dir={temp_dir}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}", f"--dashboard-agent-listen-port={agent_port}",
             f"--dashboard-agent-grpc-port={agent_grpc}", f"--ray-client-server-port={client_port}",
             f"--metrics-export-port={metrics_port}", f"--autoscaling-config={tmp_path / 'local.yaml'}"],
            env=env, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        # the autoscaler launches one node of each type (min_workers: 1)
        want = {"accelerator_type:A100", "accelerator_type:H100"}
        deadline = time.monotonic() + 240
        while (nodes := _alive_accelerator_nodes(env, f"{ip}:{gcs_port}")) != want:
            assert time.monotonic() < deadline, f"autoscaler brought up only {nodes} of {want}"
            time.sleep(3)
        print(f"cluster up (A100 + H100 nodes) in {time.monotonic() - start:.0f} s")

        # token authentication is on: the job API refuses a request without the token
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{dash_port}/api/jobs/", timeout=30)
        assert refused.value.code in (401, 403)

        out = subprocess.run([RAY, "job", "submit", f"--address=http://127.0.0.1:{dash_port}", f"--working-dir={job_dir}",
                              "--", sys.executable, "job.py"],
                             env=env, capture_output=True, text=True, timeout=420)
        log = out.stdout + out.stderr
        assert out.returncode == 0 and "succeeded" in log, log[-4000:]
        print(f"job done at {time.monotonic() - start:.0f} s")
        print("\n".join(line for line in log.splitlines() if line.startswith("PDML_")))
    finally:
        _stop_cluster(temp_dir)
        left = _cluster_processes(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, f"cluster processes left running: {left}"

    accels = json.loads(next(line for line in log.splitlines() if line.startswith("PDML_ACCELERATORS "))
                        .split(" ", 1)[1])
    assert sorted(accels) == ["A100", "H100"]  # one worker on each fake node, its type read from the resource
    decisions = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("PDML_DECISION ")]
    # the accelerator prior (H100 1.0, A100 0.32) seeds the shares before any measurement: 194 / 62 of 256;
    # it is the decision the workers ran from step 0 (the newest decision effective at step 0)
    at_start = max((d for d in decisions if d["effective_step"] == 0), key=lambda d: d["version"])
    assert at_start["reason"] == "prior", decisions
    assert dict(zip(accels, at_start["batch_sizes"])) == {"H100": 194, "A100": 62}, decisions
