"""The P3 parameter-server runtime (p3_ps) on Ray actors: 2 workers with unequal shares of each global
batch, 3 shards (slices round-robin), an EMULATED slow link. P3, FIFO and bucketed orders give
the parameters of single-process SGD on the same global batches (1e-5), and with P3 the next
forward's first layer starts before the last updated slice of the previous step has arrived. Each run is a
client of its own scheduler actor, whose p3 axis shows the slicing the run ran (``pdml-ray status --json``'s
record); with ``auto`` the axis re-slices the run at a decision boundary from the links the workers
measured, and the parameters are still single-process SGD's (momentum carried over)."""

import json

import pytest
import torch
import torch.nn.functional as F

from pdml_ray.cli.status import render
from pdml_ray.config import P3Config, PDMLConfig
from pdml_ray.p3.shard import SGDSettings
from pdml_ray.runtime.p3_ps import P3ParameterServer

STEPS, SIZES = 6, (20, 12)
SGD = SGDSettings(lr=0.05, momentum=0.9, weight_decay=1e-4)


def uneven_mlp() -> torch.nn.Module:
    """Layers of 0.5k, 4k, 66k and 1k parameters: the third dominates the communication."""
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 2))


def data():
    g = torch.Generator().manual_seed(2)
    n = STEPS * sum(SIZES)
    return torch.randn(n, 16, generator=g), torch.randint(0, 2, (n,), generator=g)


def reference() -> torch.Tensor:
    x, y = data()
    model = uneven_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=SGD.lr, momentum=SGD.momentum, weight_decay=SGD.weight_decay)
    for k in range(STEPS):
        rows = slice(k * sum(SIZES), (k + 1) * sum(SIZES))
        opt.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.fixture(scope="module")
def results(ray_local):
    x, y = data()
    out = {}
    with P3ParameterServer(num_workers=2, num_shards=3) as ps:
        for policy in ("p3", "fifo", "bucketed"):
            # 71k parameters = 285 KB at 0.02 Gb/s: ~115 ms per direction per step (EMULATED)
            config = P3Config(policy=policy, slice_elements=8_000, bucket_bytes=100_000, emulated_bandwidth_gbps=0.02)
            # the baselines' schedulers in this process: an actor costs seconds to start, and p3's shows the path
            out[policy] = ps.run(uneven_mlp(), F.cross_entropy, x, y, batch_sizes=SIZES, steps=STEPS, sgd=SGD,
                                 config=config, in_process_scheduler=policy != "p3")
        # auto: the rule's slicing from the EMULATED link the first segment measured, from the boundary at step 4
        auto = PDMLConfig(p3=P3Config(auto=True, slice_elements=8_000, emulated_bandwidth_gbps=0.02),
                          decision_interval=2)
        out["auto"] = ps.run(uneven_mlp(), F.cross_entropy, x, y, batch_sizes=SIZES, steps=STEPS, sgd=SGD, config=auto)
    return out


@pytest.mark.parametrize("policy", ["p3", "fifo", "bucketed", "auto"])
def test_every_order_trains_the_single_process_parameters(results, policy):
    want = reference()
    result = results[policy]
    assert (result.parameters - want).abs().max().item() < 1e-5
    for replica in result.worker_parameters:
        assert (replica - want).abs().max().item() < 1e-5


def test_p3_and_fifo_agree(results):
    assert (results["p3"].parameters - results["fifo"].parameters).abs().max().item() < 1e-5


def test_p3_forward_of_layer_0_starts_before_the_last_slice_arrives(results):
    overlapped = 0
    for run in results["p3"].runs:
        for step in range(1, STEPS):
            forward0 = min(t for kind, s, i, t in run.timeline if kind == "forward" and s == step and i == 0)
            last = max(t for kind, s, i, t in run.timeline if kind == "arrived" and s == step - 1)
            overlapped += forward0 < last
    assert overlapped >= 2 * (STEPS - 1) - 2  # nearly every step of both workers


def _status_p3(result) -> dict:
    """The run's p3 axis as ``pdml-ray status --json`` renders its scheduler's stats record."""
    name = result.scheduler_name
    return json.loads(render({name: result.scheduler_stats}, as_json=True))["schedulers"][name]["derivers"]["p3"]


def test_each_run_shows_its_p3_axis_with_the_slicing_it_ran(results):
    result = results["p3"]
    assert result.scheduler_name.startswith("pdml-p3ps-")
    [ran] = result.decisions  # auto off: the config's slicing, published unchanged, the whole run
    assert (ran.version, ran.effective_step, ran.method, ran.slice_elements, ran.credit_bytes) == (0, 0, "config", 8_000,
                                                                                                  4 * 8_000 * 4)
    axis = _status_p3(result)
    assert (axis["slice_elements"], axis["credit_bytes"], axis["method"], axis["policy"]) == (8_000, 128_000, "config",
                                                                                             "p3")
    # the run's one segment: both workers' EMULATED links (0.02 Gb/s) observed once at its end
    assert axis["observations"] == 1 and axis["bandwidth_Bps"] == pytest.approx(0.02e9 / 8)


def test_auto_re_slices_the_run_at_a_boundary_with_the_rule_s_choice(results):
    result = results["auto"]
    first, tuned = result.decisions
    assert (first.method, first.slice_elements, first.effective_step) == ("config", 8_000, 0)
    # measured over steps 0-1, requested at the boundary at 2, applied at 4: fetched a segment ahead
    assert (tuned.method, tuned.version, tuned.effective_step) == ("rule", 1, 4)
    # no latency or per-message overhead: the smallest slice, and a window of two
    assert (tuned.slice_elements, tuned.credit_bytes) == (4_096, 2 * 4_096 * 4)
    assert tuned.bandwidth_Bps == pytest.approx(0.02e9 / 8)
    axis = _status_p3(result)
    assert (axis["slice_elements"], axis["method"], axis["decisions"], axis["auto"]) == (4_096, "rule", 1, True)
    assert axis["observations"] == 3  # one per segment of two steps
