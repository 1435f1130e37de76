"""Runtime 1, P3 over parameter-server shards on Ray actors: 2 workers with unequal shares of each
global batch, 3 shards (slices round-robin), an EMULATED slow link. P3, FIFO and bucketed orders give
the parameters of single-process SGD on the same global batches (1e-5), and with P3 the next
forward's first layer starts before the last updated slice of the previous step has arrived."""

import pytest
import torch
import torch.nn.functional as F

from pdml_ray.config import P3Config
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
            out[policy] = ps.run(uneven_mlp(), F.cross_entropy, x, y, batch_sizes=SIZES, steps=STEPS, sgd=SGD,
                                 config=config)
    return out


@pytest.mark.parametrize("policy", ["p3", "fifo", "bucketed"])
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
