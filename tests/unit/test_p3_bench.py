"""``pdml-ray bench p3`` without Ray: registered, its model, its EMULATED compute split, its simulated
reference (the same model and link under P3 and FIFO), and the rows of the all-reduce runtime, run
here on a one-rank gloo group (the bench runs the same function in Ray Train's workers)."""

import argparse

import pytest
import torch
import torch.distributed as dist

from pdml_ray.bench import BENCHMARKS
from pdml_ray.bench.p3 import (POLICIES, VGG_LIKE_MACS, _simulated, add_arguments, allreduce_rows,
                               emulated_layer_compute, targets_of, vgg_like)
from pdml_ray.p3.ps import model_layers

ROW_FIELDS = {"runtime", "comm_over_compute", "iteration_s", "p3_over_fifo", "p3_over_layer_fifo", "p3_over_bucketed",
              "bound_s", "emulated"}


def test_registered():
    assert BENCHMARKS["p3"] == "pdml_ray.bench.p3"


def test_the_model_is_vgg_shaped_compute_up_front_bytes_at_the_end():
    numels = [sum(p.numel() for p in ps) for _, _, ps in model_layers(vgg_like())]
    assert len(numels) == len(VGG_LIKE_MACS) == 8
    assert sum(numels[-2:]) / sum(numels) > 0.85  # the fully connected layers: most of the bytes
    assert sum(VGG_LIKE_MACS[:-2]) / sum(VGG_LIKE_MACS) > 0.9  # the convolutions: most of the compute
    macs = {}
    model = vgg_like()
    hooks = [m.register_forward_hook(lambda mod, i, o, name=name: macs.__setitem__(
        name, (mod.weight.numel() * o.shape[-1] * o.shape[-2]) if o.dim() == 4 else mod.weight.numel()))
        for name, m, _ in model_layers(model)]
    model(torch.zeros(1, 3, 32, 32))
    for h in hooks:
        h.remove()
    assert tuple(macs[name] for name, _, _ in model_layers(model)) == VGG_LIKE_MACS


def test_emulated_compute_is_split_by_flops_with_backward_twice_forward():
    split = emulated_layer_compute(0.15)
    assert len(split) == len(VGG_LIKE_MACS)
    assert sum(f + b for f, b in split) == pytest.approx(0.15)
    for (f, b), macs in zip(split, VGG_LIKE_MACS):
        assert b == pytest.approx(2 * f)
        assert f == pytest.approx(0.05 * macs / sum(VGG_LIKE_MACS))


def test_simulated_reference_p3_beats_fifo_at_comm_equal_compute():
    model = vgg_like()
    total_bytes = 4 * sum(p.numel() for p in model.parameters())
    at_one = _simulated(model, 0.15, total_bytes / 0.15, 65_536, total_bytes // 4, 2 * 65_536 * 4)
    assert at_one["p3"] < 0.8 * at_one["fifo"]  # 0.77: the convolutions' forward hides the fc's transfer
    assert at_one["p3"] >= 0.15  # never below compute
    fast = _simulated(model, 0.15, 10 * total_bytes / 0.15, 65_536, total_bytes // 4, 2 * 65_536 * 4)
    assert fast["p3"] == pytest.approx(fast["fifo"], rel=0.02)  # a fast link hides every order
    ar = _simulated(model, 0.15, total_bytes / 0.15, 65_536, total_bytes // 4, 2 * 65_536 * 4, allreduce=True)
    assert ar["p3"] <= ar["fifo"] and ar["p3"] >= 0.15


def test_defaults_parse():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert args.compute == "sleep" and args.runtimes == "parameter-server,all-reduce" and args.credit_slices >= 1
    # both emulated compute settings and both slicings, the targets read at the first of each
    assert args.compute_ms == (300.0, 150.0) and args.settings == ("bench", "library")
    assert args.ratios == (0.5, 1.0, 2.0) and "layer-fifo" in POLICIES
    for flag, bad in (("--compute-ms", "nan"), ("--compute-ms", "300,300"), ("--settings", "tuned"), ("--ratios", "0")):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, bad])


def _row(settings, compute_ms, p3_over_fifo, worst):
    return {"runtime": "parameter-server", "settings": settings, "compute_ms": compute_ms, "comm_over_compute": 1.0,
            "p3_over_fifo": p3_over_fifo, "p3_over_best_baseline": worst}


def test_targets_are_read_at_the_named_setting_only():
    runs = [_row("bench", 300.0, 0.785, 1.0), _row("bench", 150.0, 0.845, 1.0), _row("library", 300.0, 0.84, 1.05)]
    assert targets_of(runs, "bench", 300.0)["ps_p3_over_fifo_at_comm_eq_compute"]["met"]
    at_150 = targets_of(runs, "bench", 150.0)
    assert at_150["ps_p3_over_fifo_at_comm_eq_compute"]["value"] == 0.845
    assert not at_150["ps_p3_over_fifo_at_comm_eq_compute"]["met"]
    assert not targets_of(runs, "library", 300.0)["ps_p3_over_best_baseline_worst"]["met"]


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_all_reduce_rows_have_the_parameter_server_rows_fields(one_rank_group):
    rows = allreduce_rows({"batch": 1, "steps": 1, "repeats": 1, "seed": 0, "compute_ms": 15.0, "ratios": [0.5, 2.0],
                           "slice_elements": 65_536, "credit_bytes": 2 * 65_536 * 4, "bucket_bytes": 2_400_000})
    assert [r["comm_over_compute"] for r in rows] == [0.5, 2.0]
    for r in rows:
        assert ROW_FIELDS <= set(r) and r["runtime"] == "all-reduce"
        assert set(r["iteration_s"]) == set(POLICIES) and all(v > 0 for v in r["iteration_s"].values())
        assert r["p3_over_fifo"] == pytest.approx(r["iteration_s"]["p3"] / r["iteration_s"]["fifo"])
        assert r["p3_over_bucketed"] == pytest.approx(r["iteration_s"]["p3"] / r["iteration_s"]["bucketed"])
        assert r["bound_s"] == pytest.approx(max(r["compute_s"], r["comm_s"]))
        assert "EMULATED" in r["emulated"] and "compute EMULATED" in r["emulated"]
        assert r["iteration_s"]["fifo"] >= 0.9 * r["bound_s"]  # nothing beats the bound (10% for timer noise)
