"""The all-reduce P3 runtime as a client of the scheduler's p3 axis on the Ray Train path, driven without
Ray: a PDMLContext over an in-process scheduler, P3 through ``p3_sync.prepare``. The warm-up's link
reaches the axis through the context, the rule's slicing comes back in a boundary's bundle and is run
from its effective step on, and the parameters stay single-process SGD's."""

import pytest
import torch
import torch.nn.functional as F

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import NodePriorityConfig, P3Config, PDMLConfig
from pdml_ray.errors import UsageError
from pdml_ray.scheduler import Scheduler
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.p3_sync import WARMUP_STEPS, prepare


def _model() -> torch.nn.Module:
    torch.manual_seed(3)  # layers of 0.3k, 8.4k and 0.3k parameters
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 512), torch.nn.Tanh(),
                               torch.nn.Linear(512, 1), torch.nn.Flatten(0))


def _context(p3: P3Config | None) -> tuple[PDMLContext, Scheduler]:
    config = PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(global_batch_size=16), p3=p3)
    scheduler = Scheduler(config, 1)
    return PDMLContext(config, 0, 1, torch.device("cpu"), "CPU", SchedulerClient(LocalSchedulerTransport(scheduler))), scheduler


def test_the_rule_s_slicing_arrives_through_the_context_and_runs_from_its_effective_step():
    # an EMULATED 100 Gb/s link with 1 ms latency: the rule wants 4,096-element slices and a deep window
    ctx, scheduler = _context(P3Config(auto=True, slice_elements=2_000, emulated_bandwidth_gbps=100.0,
                                       emulated_latency_us=1000.0))
    base = _model()
    model, p3 = prepare(ctx, base, torch.optim.SGD(base.parameters(), lr=0.1))
    reference = _model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(160, 16, generator=g), torch.randn(160, generator=g)
    slicings = []
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.mse_loss(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        slicings.append(p3.plan.slice_elements)
        optimizer.zero_grad()
        F.mse_loss(reference(x[batch.indices]), y[batch.indices]).backward()
        optimizer.step()
    p3.finish()
    # measured at step 3 (after the warm-up), asked for at the boundary at 4, run from the boundary at 6
    assert WARMUP_STEPS == 3 and slicings == [2_000] * 6 + [4_096] * 4
    ran = p3.decision
    assert (ran.method, ran.version, ran.effective_step) == ("rule", 1, 6)
    assert p3.credit_bytes == ran.credit_bytes == 764 * 4_096 * 4  # 12.5 MB in flight: ceil((BDP + slice) / slice)
    assert [(d.version, d.effective_step, d.method) for d in scheduler.history["p3"]] == [(0, 0, "config"),
                                                                                        (1, 6, "rule")]
    assert scheduler.history["p3"][-1] == ran and ctx.axis_decision("p3", 9) is ran
    axis = scheduler.stats().derivers["p3"]
    assert axis.observations == 1 and axis.bandwidth_Bps == 100e9 / 8 and axis.latency_s == pytest.approx(1e-3)
    for p, q in zip(model.parameters(), reference.parameters()):  # re-sliced mid-run: timing changes, not values
        assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()


def test_p3_ordering_needs_the_config_s_p3_section():
    ctx, _ = _context(None)
    with pytest.raises(UsageError, match="PDMLConfig"):
        prepare(ctx, _model(), torch.optim.SGD(_model().parameters(), lr=0.1))


def test_a_resumed_run_runs_the_slicing_its_restored_scheduler_has(tmp_path):
    ctx, scheduler = _context(P3Config(auto=True, slice_elements=2_000, emulated_bandwidth_gbps=100.0,
                                       emulated_latency_us=1000.0))
    base = _model()
    model, p3 = prepare(ctx, base, torch.optim.SGD(base.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(160, 16, generator=g), torch.randn(160, generator=g)
    for batch in ctx.epoch(0, len(x)):
        with ctx.step(batch) as step:
            step.loss(F.mse_loss(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
    p3.finish()
    assert p3.plan.slice_elements == 4_096 and ctx.save_scheduler_state(str(tmp_path))
    resumed, restored = _context(P3Config(auto=True, slice_elements=2_000, emulated_bandwidth_gbps=100.0,
                                          emulated_latency_us=1000.0))
    assert resumed.load_scheduler_state(str(tmp_path)) and "p3" not in resumed.versions
    base = _model()
    model, p3 = prepare(resumed, base, torch.optim.SGD(base.parameters(), lr=0.1))
    slicings = []
    for batch in resumed.epoch(resumed.start_epoch, len(x)):
        with resumed.step(batch) as step:
            step.loss(F.mse_loss(model(x[batch.indices]), y[batch.indices], reduction="none")).backward()
        slicings.append(p3.plan.slice_elements)
        if len(slicings) == 4:
            break
    # the config's slicing until the restored rule's comes again, re-issued for the first boundary it can
    # reach (asked for at step 10, the resumed run's first; the context keeps no p3 decision in its file)
    assert slicings == [2_000, 2_000, 4_096, 4_096]
    assert (p3.decision.method, p3.decision.effective_step, p3.decision.version) == ("rule", 12, 2)
    assert restored.decision("p3") == p3.decision  # the same choice, re-stamped for the resumed run
