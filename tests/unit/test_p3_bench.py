"""``pdml-ray bench p3`` without Ray: registered, its EMULATED compute split, and its simulated
reference (the same model and link under P3 and FIFO) orders the policies as P3 predicts."""

import pytest

from pdml_ray.bench import BENCHMARKS
from pdml_ray.bench.p3 import VGG_LIKE_MACS, _simulated, emulated_layer_compute, vgg_like
from pdml_ray.p3.ps import model_layers


def test_registered():
    assert BENCHMARKS["p3"] == "pdml_ray.bench.p3"


def test_emulated_compute_is_split_by_flops_with_backward_twice_forward():
    split = emulated_layer_compute(0.15)
    assert len(split) == len(model_layers(vgg_like())) == len(VGG_LIKE_MACS)
    assert sum(f + b for f, b in split) == pytest.approx(0.15)
    for (f, b), macs in zip(split, VGG_LIKE_MACS):
        assert b == pytest.approx(2 * f)
        assert f == pytest.approx(0.05 * macs / sum(VGG_LIKE_MACS))


def test_simulated_reference_p3_beats_fifo_at_comm_equal_compute():
    model = vgg_like()
    total_bytes = 4 * sum(p.numel() for p in model.parameters())
    at_one = _simulated(model, 0.15, total_bytes / 0.15, 524_288, total_bytes // 4)
    assert at_one["p3"] < 0.95 * at_one["fifo"]  # 0.90 with 2 MB slices
    assert at_one["p3"] >= 0.15  # never below compute
    fast = _simulated(model, 0.15, 10 * total_bytes / 0.15, 524_288, total_bytes // 4)
    assert fast["p3"] == pytest.approx(fast["fifo"], rel=0.02)  # a fast link hides every order
