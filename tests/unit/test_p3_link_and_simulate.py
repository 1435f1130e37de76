"""The link model, the iteration simulator (P3 vs FIFO vs DDP-bucketed), real layer lists, auto tuning."""

from __future__ import annotations

import time

import pytest

from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.p3.auto import MIN_SLICE_ELEMENTS, rule, tune
from pdml_ray.p3.link import EMULATION_NOTE, EmulatedLink, Link, LinkModel
from pdml_ray.p3.models import LayerProfile, ModelProfile, from_flops, gpt, model_profile, resnet50, vgg19, vgg19_layers
from pdml_ray.p3.simulate import bandwidth_for_ratio, send_order, simulate_iteration
from pdml_ray.p3.sweep import format_sweep, sweep
from pdml_ray.p3.slicing import plan_slices


def test_link_serialises_bytes_pipelines_latency_and_charges_overhead_per_message():
    model = LinkModel(bandwidth_Bps=100.0, latency_s=0.5, overhead_s=0.1)
    assert model.transfer_s(100) == pytest.approx(1.6) and model.bandwidth_delay_bytes == 50.0
    link = Link(model)
    assert link.send(100, 0.0) == pytest.approx((0.0, 1.6))
    assert link.send(50, 0.2) == pytest.approx((1.1, 2.2))  # waits for the wire, not for the first arrival
    assert link.send(10, 5.0) == pytest.approx((5.0, 5.7))  # an idle link starts at once
    assert link.bytes_sent == 160 and link.messages == 3
    assert LinkModel.gbps(10).bandwidth_Bps == 1.25e9
    assert "EMULATED" in model.describe() and "EMULATED" in EMULATION_NOTE
    for bad in [dict(bandwidth_Bps=0.0), dict(bandwidth_Bps=1.0, latency_s=-1.0), dict(bandwidth_Bps=float("inf"))]:
        with pytest.raises(ConfigError):
            LinkModel(**bad)


def test_emulated_link_delivers_no_earlier_than_the_model_says():
    link = EmulatedLink(LinkModel(bandwidth_Bps=1e6, latency_s=0.005))
    t0 = time.perf_counter()
    a1 = link.send(10_000)  # 10 ms on the wire + 5 ms latency
    a2 = link.send(10_000)  # behind the first: 25 ms
    assert a2 - a1 == pytest.approx(0.010, abs=1e-3)
    link.wait_until(a2)
    assert time.perf_counter() - t0 >= 0.025 - 1e-4
    assert link.wait_until(a1) == 0.0  # already arrived


def test_a_two_layer_iteration_by_hand():
    # 2 layers of 40 bytes, 1 s forward and backward each, 40 B/s both ways: B's gradient ready at 1, pushed
    # 1..2, pulled 2..3; A ready at 2, pushed 2..3, pulled 3..4; forward A 4..5 (waited 2 s), B 5..6
    profile = ModelProfile("tiny", (LayerProfile("A", 10, 1.0, 1.0), LayerProfile("B", 10, 1.0, 1.0)))
    # (one 25 MB bucket holds both layers: sent at 2 as 80 bytes, 2..4, pulled 4..6, forward 6..8)
    for policy, expect in (("p3", 6.0), ("fifo", 6.0), ("bucketed", 8.0)):
        r = simulate_iteration(profile, policy, LinkModel(40.0), slice_elements=10, credit_bytes=40)
        assert r.iteration_s == pytest.approx(expect), policy
        assert r.compute_s == 4.0 and r.comm_s == 2.0 and r.bound_s == 4.0
        assert r.forward_wait_s == pytest.approx(expect - 4.0)
    # all-reduce: no pull; B reduced 1..2, A 2..3, forward A 3..4, B 4..5
    r = simulate_iteration(profile, "p3", LinkModel(40.0), slice_elements=10, credit_bytes=40, allreduce=True)
    assert r.iteration_s == pytest.approx(5.0)


def vgg_like() -> ModelProfile:
    """Small convolutions first, a large fully connected layer last (VGG's shape)."""
    layers = [LayerProfile(f"conv{i}", 20_000, 1e-3, 2e-3) for i in range(8)]
    layers.append(LayerProfile("fc", 400_000, 1e-3, 2e-3))
    return ModelProfile("vgg-like", tuple(layers))


@pytest.mark.parametrize("ratio", [0.8, 1.0, 1.25])
def test_p3_beats_fifo_on_a_vgg_like_model_when_communication_matches_compute(ratio):
    profile = vgg_like()
    link = LinkModel(bandwidth_for_ratio(profile, ratio))
    p3 = simulate_iteration(profile, "p3", link, slice_elements=10_000, credit_bytes=80_000)
    fifo = simulate_iteration(profile, "fifo", link, slice_elements=10_000)
    bucketed = simulate_iteration(profile, "bucketed", link, slice_elements=10_000, bucket_bytes=400_000)
    assert p3.iteration_s <= 0.9 * fifo.iteration_s, (p3, fifo)
    assert p3.iteration_s <= bucketed.iteration_s
    assert p3.forward_wait_s < fifo.forward_wait_s
    assert p3.max_in_flight_bytes <= 80_000


@pytest.mark.parametrize("ratio", [0.1, 0.5, 1.0, 2.0, 5.0])
def test_no_policy_beats_the_bound_and_compute_bound_runs_reach_it(ratio):
    profile = vgg_like()
    link = LinkModel(bandwidth_for_ratio(profile, ratio), latency_s=1e-5, overhead_s=1e-6)
    results = [simulate_iteration(profile, p, link, slice_elements=10_000, credit_bytes=80_000)
               for p in ("p3", "fifo", "bucketed")]
    for r in results:
        assert r.iteration_s >= r.bound_s * (1 - 1e-9), r
        assert r.bound_s == pytest.approx(max(profile.compute_s, profile.total_bytes / link.bandwidth_Bps))
    if ratio <= 0.1:  # communication hides under compute: P3 is within 2% of the bound
        assert results[0].iteration_s <= 1.02 * results[0].bound_s


def test_real_layer_lists_have_the_published_parameter_counts():
    assert vgg19().total_numel == 143_667_240 and len(vgg19_layers()) == 19
    assert resnet50().total_numel == 25_557_032
    assert gpt().total_numel == 124_439_808  # GPT-2 small, head tied to the embedding
    assert model_profile("vgg19").layers[-3].name == "fc6"
    with pytest.raises(ConfigError, match="resnet50"):
        model_profile("alexnet")
    scaled = from_flops("x", [("a", 10, 1e9)], batch=2, flops_per_s=1e9)
    assert scaled.layers[0].forward_s == 2.0 and scaled.layers[0].backward_s == 4.0


def test_the_sweep_shows_p3_gaining_at_comm_equal_compute_on_real_models():
    for profile in (vgg19(), resnet50()):
        rows = sweep(profile, ratios=(0.25, 1.0), auto=False)
        low, even = rows
        assert low.p3_vs_best_baseline <= 1.03  # plenty of bandwidth: never more than 3% slower
        assert even.p3_vs_fifo <= 0.8, even  # the target for the parameter server at comm ~ compute
    assert "EMULATED" in format_sweep(rows)
    even_allreduce = sweep(vgg19(), ratios=(1.0,), auto=False, allreduce=True)[0]
    assert even_allreduce.p3_vs_fifo <= 0.8  # the best a fixed P3 order can do for all-reduce (p3_sync)


def test_send_order_preempts_with_the_credit_and_keeps_backward_order_for_fifo():
    plan = plan_slices([10, 10, 10, 40], 10)  # layer 3: slices 3..6
    link = LinkModel(10.0)  # 4 s per slice
    ready = [3.0, 2.0, 1.0, 0.0]  # backward: layer 3 first
    assert send_order(plan, "fifo", ready, link) == (3, 4, 5, 6, 2, 1, 0)
    assert send_order(plan, "p3", ready, link, credit_bytes=40) == (3, 0, 1, 2, 4, 5, 6)
    assert send_order(plan, "p3", ready, link, credit_bytes=None) == (3, 4, 5, 6, 2, 1, 0)  # no window: no preemption
    with pytest.raises(PlanError):
        send_order(plan, "p3", ready[:3], link)


def test_auto_rule_sizes_slices_by_overhead_and_credit_by_the_bandwidth_delay_product():
    elements, credit, why = rule(LinkModel.gbps(10, latency_s=50e-6, overhead_s=5e-6))
    # 5 us x 1.25e9 B/s / 2% / 4 B = 78,125 elements -> 78,848 (a multiple of 1,024); BDP 62.5 KB < a slice
    assert elements == 78_848 and credit == 2 * elements * 4 and "bandwidth-delay" in why
    elements, credit, _ = rule(LinkModel.gbps(10, latency_s=1e-3, overhead_s=5e-6))
    assert credit == 5 * elements * 4  # ceil((1.25 MB + 315 KB) / 315 KB) = 5 slices
    assert rule(LinkModel.gbps(10))[0] == MIN_SLICE_ELEMENTS  # no per-message cost: the smallest slice
    faster, _, _ = rule(LinkModel.gbps(100, overhead_s=5e-6))
    assert faster > 9 * 78_848  # ten times the bandwidth: about ten times the slice
    with pytest.raises(ConfigError):
        rule(LinkModel(1.0), max_overhead_fraction=1.5)


def test_auto_search_predicts_no_worse_than_the_rule_and_reports_its_choice():
    profile = vgg_like()
    link = LinkModel(bandwidth_for_ratio(profile, 1.0), latency_s=20e-6, overhead_s=2e-6)
    chosen = tune(link, profile)
    plain = tune(link)
    rule_time = simulate_iteration(profile, "p3", link, slice_elements=plain.slice_elements,
                                   credit_bytes=plain.credit_bytes).iteration_s
    assert chosen.method == "search" and plain.method == "rule" and plain.predicted_iteration_s is None
    assert chosen.predicted_iteration_s is not None and chosen.predicted_iteration_s <= rule_time
    again = simulate_iteration(profile, "p3", link, slice_elements=chosen.slice_elements,
                               credit_bytes=chosen.credit_bytes).iteration_s
    assert again == pytest.approx(chosen.predicted_iteration_s)
    text = chosen.describe()
    assert f"{chosen.slice_elements:,d} elements" in text and "predicted" in text
