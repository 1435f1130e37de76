"""Pipeline scheduling: plans over stages x replicas, static schedules, osprey, simulator.

Pure python/numpy; nothing here imports ray. The Ray-actor runtime (``pdml_ray.runtime.pipeline``)
runs the same ``Plan`` objects through the same ``Dispatcher`` as the simulator.

The modules:

    plan.py          plans as data: actions, the one dependency rule, validation, a printable grid
    registry.py      schedule names -> classes (``make_schedule``)
    static.py        GPipe, 1F1B, critical-path, 1F1B weighted by replica speeds
    torch_orders.py  the orders torch.distributed.pipelining's schedules generate, as plans and static baselines (torch 2.13 pinned)
    torch_exec.py    single-replica plans run by torch.distributed.pipelining's own runtime over real ``PipelineStage``s
    osprey.py        osprey, adaptive scheduling from measured latencies
    osprey_decision.py  what osprey decided and why, as data (``OspreyDecision``)
    osprey_candidates.py  osprey's candidates: every static order; torch's orders and zero-bubble lanes on its lanes
    chunked.py       osprey's own zero-bubble lanes: list scheduling over virtual stages with F, I, W
    prediction.py    a plan's predicted busy time per executor; the re-plan after a step that ran far from it
    auto.py          ``auto``: a static schedule until osprey pays
    listsched.py     greedy list scheduling on predicted costs
    dispatch.py      the one dispatch rule of the simulator and the runtime
    simulate.py      the discrete-event simulator
    sizes.py         micro-batch sizes told before a step: a per-stage cost model, micro-batch orders, cost factors
    scenarios.py     non-stationary scenarios as profiles: drift, uneven micro-batches, late transfers, a memory cap, a slow stage
    faults.py        lost replicas as data: re-routing and plans on the survivors
    partition.py     a sequential model cut into stages balanced by parameter count (or measured stage speeds)
    rebalance.py     layer re-balancing: a ``LayerMove`` off a stage that stays slower than the others
    layer_moves.py   moving layers between stage replicas with their parameters and optimizer state
    stage.py         one stage replica's worker: forward, backward, accumulation, step
    stats.py         the pipeline runtime's stats record (``pdml_pipeline_*``)
"""

from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.plan import Action, Kind, Measurement, PipelineSchedule, Plan, format, producers, validate
from pdml_ray.pipeline.registry import ALL_SCHEDULES, PROJECT_SCHEDULES, TORCH_SCHEDULES, make_schedule
from pdml_ray.pipeline.simulate import (ClusterProfile, PipelineSimulator, compare_in_simulation, simulate_schedule,
                                       steady_state)
from pdml_ray.pipeline.torch_orders import torch_actions

__all__ = ["ALL_SCHEDULES", "Action", "ClusterProfile", "Dispatcher", "Kind", "Measurement", "PROJECT_SCHEDULES",
           "PipelineSchedule", "PipelineSimulator", "Plan", "TORCH_SCHEDULES", "compare_in_simulation", "format",
           "make_schedule", "producers", "simulate_schedule", "steady_state", "torch_actions", "validate"]
