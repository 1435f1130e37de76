"""The bucketed, overlapped weighted all-reduce on a real one-rank gloo group (no Ray)."""

import socket

import pytest
import torch
import torch.distributed as dist

from pdml_ray.errors import UsageError
from pdml_ray.train.grad_sync import WeightedGradSync


@pytest.fixture(scope="module")
def gloo():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


@pytest.mark.parametrize("overlap, bucket_bytes", [(True, 64), (True, 1 << 20), (False, 64)])
def test_weighted_gradient_matches_and_buckets_launch_during_backward(gloo, overlap, bucket_bytes):
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    ref = _model()
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    model = _model()
    sync = WeightedGradSync(list(model.parameters()), bucket_bytes=bucket_bytes, overlap=overlap)
    assert len(sync.buckets) == (3 if bucket_bytes == 64 else 1)  # the 12-byte bias shares a bucket
    sync.begin(0.25)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert len(sync._works) == (len(sync.buckets) if overlap else 0)  # in flight before finish()
    sync.finish()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, 0.25 * q.grad)


def test_a_second_backward_in_one_step_is_an_error(gloo):
    model = _model()
    sync = WeightedGradSync(list(model.parameters()), bucket_bytes=64)
    x = torch.randn(4, 8)
    sync.begin(1.0)
    model(x).sum().backward()
    with pytest.raises(UsageError, match="second gradient"):
        model(x).sum().backward()
    sync.abort()


def test_gradients_accumulate_in_place_into_the_bucket_buffers(gloo):
    model = _model()
    sync = WeightedGradSync(list(model.parameters()), bucket_bytes=64)
    for _ in range(2):  # a second step reuses the same buffers, whatever zero_grad did
        sync.begin(1.0)
        model(torch.randn(4, 8)).sum().backward()
        sync.finish()
        storages = {b.untyped_storage().data_ptr() for b in sync.buffers}
        for p in model.parameters():  # every .grad lives inside one of the flat bucket buffers
            assert p.grad.untyped_storage().data_ptr() in storages
        model.zero_grad(set_to_none=True)


def test_finish_without_begin_is_an_error(gloo):
    sync = WeightedGradSync(list(_model().parameters()))
    with pytest.raises(UsageError, match="without begin"):
        sync.finish()


def test_unused_parameters_still_get_a_combined_gradient(gloo):
    model = _model()
    extra = torch.nn.Parameter(torch.ones(5))
    sync = WeightedGradSync(list(model.parameters()) + [extra], bucket_bytes=64)
    sync.begin(0.5)
    model(torch.randn(4, 8)).sum().backward()
    sync.finish()
    assert torch.equal(extra.grad, torch.zeros(5))
