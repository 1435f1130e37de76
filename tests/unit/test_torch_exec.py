"""Project plans on torch.distributed.pipelining's own runtime: the conversion both ways, and one step's
gradients on two gloo ranks equal those of torch's own Schedule1F1B."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from pdml_ray.config import OspreyConfig, PipelineConfig
from pdml_ray.errors import PlanError
from pdml_ray.pipeline import torch_orders
from pdml_ray.pipeline.osprey import OspreySchedule
from pdml_ray.pipeline.plan import Plan
from pdml_ray.pipeline.registry import make_schedule
from pdml_ray.pipeline.simulate import ClusterProfile, PipelineSimulator
from pdml_ray.pipeline.torch_exec import (TorchPlanRuntime, finishes_with_sends_waited, pipeline_stages,
                                          posted_in_send_order, run_local_ranks)

MICROBATCHES = 4
TOLERANCE = 1e-5


def _listed(per_rank: dict[int, list[Any]]) -> dict[int, list[str]]:
    """torch's listing as strings, idle slots and REDUCE_GRAD left out (torch's lowering adds those)."""
    return {r: [str(a) for a in acts if a is not None and a.computation_type.value != "REDUCE_GRAD"]
            for r, acts in per_rank.items()}


def test_a_torch_order_read_into_a_plan_converts_back_to_torchs_listing() -> None:
    schedules = torch_orders.torch_schedules()
    gpipe = schedules.ScheduleGPipe.__new__(schedules.ScheduleGPipe)
    gpipe._num_stages, gpipe._n_microbatches = 3, 5
    assert _listed(torch_orders.torch_actions(torch_orders.torch_gpipe_plan(3, 5))) == _listed(gpipe._get_pipeline_order())
    # Two chunks per rank, looped: rank r holds stages r and r + 2.
    gen = schedules.ScheduleInterleaved1F1B.__new__(schedules.ScheduleInterleaved1F1B)
    for attr, value in {"_n_microbatches": 4, "num_stages": 4, "pp_group_size": 2, "n_local_stages": 2,
                        "number_of_rounds": 2, "microbatches_per_round": 2}.items():
        setattr(gen, attr, value)
    raw = {r: gen._calculate_single_rank_operations(r) for r in range(2)}
    plan = torch_orders.torch_interleaved_1f1b_plan(2, 4)
    assert _listed(torch_orders.torch_actions(plan)) == _listed(raw)
    assert [str(a) for a in torch_orders.torch_actions(plan)[1]][:2] == ["1F0", "1F1"]


def test_a_plan_of_several_replicas_is_refused_with_the_fix() -> None:
    plan = make_schedule("1f1b", stages=2, replicas=2, microbatches=4).plan(0)
    with pytest.raises(PlanError, match="one replica per stage.*run data-parallel replicas as separate pipelines"):
        torch_orders.torch_actions(plan)


def _lowered(plan: Plan, defer: bool) -> tuple[dict[int, list[Any]], dict[int, int]]:
    """torch's lowering of ``plan`` (sends, receives, REDUCE_GRAD), receives deferred or not, and its stage -> rank."""
    schedules = torch_orders.torch_schedules()
    stage_rank = dict(enumerate(plan.stage_rank or range(plan.num_stages)))
    order = schedules._add_send_recv({r: schedules._add_reduce_grad(a, plan.num_microbatches)
                                      for r, a in torch_orders.torch_actions(plan).items()},
                                     stage_to_rank=stage_rank.__getitem__, num_stages=plan.num_stages)
    return (schedules._defer_recv_ops(order, stage_rank.__getitem__) if defer else order), stage_rank


def test_receives_deferred_out_of_their_senders_order_are_caught() -> None:
    # One stage per rank: deferring keeps each pair's messages in order. Two chunks per rank (looped):
    # torch's deferral posts rank 1's receives from rank 0 in another order than rank 0 sends them.
    one_f_one_b = make_schedule("1f1b", stages=2, replicas=1, microbatches=MICROBATCHES).plan(0)
    interleaved = torch_orders.torch_interleaved_zb_plan(2, MICROBATCHES, 2)
    assert posted_in_send_order(*_lowered(one_f_one_b, defer=True))
    assert posted_in_send_order(*_lowered(interleaved, defer=False))
    assert not posted_in_send_order(*_lowered(interleaved, defer=True))


def _order(listing: dict[int, str]) -> dict[int, list[Any]]:
    """Per-rank lowered orders from torch's action notation ("0F1" = stage 0 forward of micro-batch 1)."""
    schedules = torch_orders.torch_schedules()
    return {r: [schedules._Action.from_str(a) for a in text.split()] for r, text in listing.items()}


def test_sends_are_waited_before_compute_only_where_the_order_still_finishes() -> None:
    # torch's lowering of 1F1B finishes with sends waited; of ZBV (a V of two chunks per rank) it does not:
    # rank 0 waits for its send of micro-batch 2 before 3F0, which rank 1 receives only after 2I0, which
    # waits for rank 1's send of 2F1, which rank 0 receives only after 3I0.
    def lowered(name: str) -> dict[int, list[Any]]:
        return _lowered(make_schedule(name, stages=2, replicas=1, microbatches=MICROBATCHES).plan(0), True)[0]

    assert finishes_with_sends_waited(lowered("1f1b"))
    assert not finishes_with_sends_waited(lowered("torch-zbv"))
    # Rank 0 sends micro-batch 1's activations and computes F2 before receiving B0; rank 1 sends B0 and
    # computes W0 before receiving micro-batch 1: with sends waited, F2 waits for rank 1's receive of
    # micro-batch 1 and W0 for rank 0's receive of B0, each posted after the other's wait.
    crossed = {0: "0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 0RECV_B0 0B0 0RECV_B1 0B1 0RECV_B2 0B2",
               1: "1RECV_F0 1F0 1I0 1SEND_B0 1W0 1RECV_F1 1F1 1I1 1SEND_B1 1W1 1RECV_F2 1F2 1I2 1SEND_B2 1W2"}
    assert not finishes_with_sends_waited(_order(crossed))
    # the same transfers with rank 1 posting each next receive before its W: it finishes
    crossed[1] = crossed[1].replace("1W0 1RECV_F1", "1RECV_F1 1W0").replace("1W1 1RECV_F2", "1RECV_F2 1W1")
    assert finishes_with_sends_waited(_order(crossed))


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    # 9 layers: enough for osprey's plans of up to four chunks per rank on two ranks (8 stages)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def _grads_after_one_step(rank: int, world_size: int, plans: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """On this rank: one step of torch's Schedule1F1B, then of each plan on TorchPlanRuntime, each from the
    same initial model; the gradients of this rank's layers per run, by parameter name."""
    from torch.distributed.pipelining import Schedule1F1B

    base, cpu = _model(), torch.device("cpu")
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)
    out: dict[str, Any] = {}
    for name, data in {"torch Schedule1F1B": plans["1f1b"], **plans}.items():
        model, plan = copy.deepcopy(base), Plan.from_dict(data)
        stages = pipeline_stages(model, plan, rank, cpu)
        if name == "torch Schedule1F1B":
            Schedule1F1B(stages[0], MICROBATCHES, loss_fn=torch.nn.functional.mse_loss).step(x, target=y)
        else:  # "... on torch's loop": torch's own _PipelineScheduleRuntime loop, not the project's
            runtime = TorchPlanRuntime(stages, MICROBATCHES, loss_fn=torch.nn.functional.mse_loss,
                                       action_ranges=name.endswith("on torch's loop"))
            runtime.load(plan)
            runtime.step(x, target=y)
            out[f"{name} receives deferred"] = runtime.receives_deferred
            out[f"{name} loop"] = type(runtime.runtime).__name__
            out[f"{name} sends waited"] = runtime.sends_waited
        out[name] = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    try:  # the last runtime holds osprey's stages (several per rank): a one-stage-per-rank plan is refused
        runtime.load(Plan.from_dict(plans["1f1b"]))
    except PlanError as err:
        out["refused"] = str(err)
    return out


def _osprey_plan() -> Plan:
    """Osprey's plan for step 1 of 2 stages x 1 replica x 4 micro-batches after one measured step with the
    second stage twice as slow, choosing among every plan (split backward, several chunks per rank)."""
    config = PipelineConfig(osprey=OspreyConfig(plans="any"))
    osprey = OspreySchedule(stages=2, replicas=(1, 1), microbatches=MICROBATCHES, config=config)
    sim = PipelineSimulator(ClusterProfile.build(2, 1, speeds=((1.0,), (0.5,))))
    osprey.observe(sim.run_step(osprey.plan(0), 0).measurements)
    return osprey.plan(1)


def test_plans_on_torchs_runtime_give_schedule1f1bs_gradients_on_two_gloo_ranks() -> None:
    osprey = _osprey_plan()
    one_f_one_b = make_schedule("1f1b", stages=2, replicas=1, microbatches=MICROBATCHES).plan(0)
    # torch's ZBV: a V of two chunks per rank (rank 1 hands stage 1's output to stage 2 without a transfer)
    # with split backward (I, then W): every path of the project's order loop.
    zbv = make_schedule("torch-zbv", stages=2, replicas=1, microbatches=MICROBATCHES).plan(0)
    assert osprey.split_backward or osprey.stage_rank is not None, osprey  # not 1F1B's order again
    assert zbv.split_backward and zbv.stage_rank == (0, 1, 1, 0), zbv
    plans = {"1f1b": one_f_one_b, "1f1b on torch's loop": one_f_one_b, "zbv": zbv, "zbv on torch's loop": zbv,
             "osprey": osprey}
    ranks = run_local_ranks(_grads_after_one_step, 2, {name: plan.to_dict() for name, plan in plans.items()})
    # The 1f1b plan runs with deferred receives (gloo); osprey's two-chunk plan falls back to torch's
    # own posting order, which its deferral would break (test above).
    assert [r.pop("1f1b receives deferred") for r in ranks] == [True, True]
    assert [r.pop("osprey receives deferred") for r in ranks] == [False, False]
    for r in ranks:
        for name in plans:
            r.pop(f"{name} receives deferred", None)
            waited = r.pop(f"{name} sends waited")  # on CPU stages, where the order allows it (test above)
            assert waited if name == "1f1b" else not waited if name.endswith("on torch's loop") else True, name
            assert r.pop(f"{name} loop") == ("_PipelineScheduleRuntime" if name.endswith("on torch's loop") else
                                             "_OrderLoop"), name
    assert all("places stages [" in r["refused"] and "build the stages for this plan's layout" in r.pop("refused")
               for r in ranks)
    runs = {name: {k: v for r in ranks for k, v in r[name].items()} for name in ranks[0]}
    reference = runs.pop("torch Schedule1F1B")
    assert len(reference) == 10 and all(np.abs(g).max() > 1e-4 for g in reference.values())  # every layer learned
    for name, grads in runs.items():
        assert grads.keys() == reference.keys(), name
        diff = max(float(np.abs(grads[k] - reference[k]).max()) for k in reference)
        print(f"{name} plan on torch's runtime: max abs gradient difference from Schedule1F1B {diff:.2e}")
        assert diff <= TOLERANCE, (name, diff)
