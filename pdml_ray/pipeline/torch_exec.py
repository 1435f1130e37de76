"""Project plans run by torch.distributed.pipelining's own runtime, over real ``PipelineStage``s.

A ``Plan`` with one replica per stage (the project's static orders, osprey's per-step plans, torch's
orders read by ``torch_orders``) becomes torch's per-rank compute-only order (``torch_orders.torch_actions``,
the one conversion both ways), which torch's ``_PipelineScheduleRuntime`` lowers (it adds the sends,
receives and REDUCE_GRAD actions) and executes: forward, full backward, or split backward (input
gradient I, then weight gradient W) per action, point-to-point over the stages' process group (gloo on
the CPU, NCCL on GPUs). The gradient of one step is torch's: accumulated over micro-batches and, with
``scale_grads``, divided by their number, as every torch schedule class does.

A rank holds the stages its plan places on it (``Plan.stage_rank``; one stage per rank without it), so
virtual stages (two chunks per rank, looped or V-shaped) run as torch runs its interleaved schedules.
Each rank runs its order strictly in order: a plan with ``reorder=True`` (osprey's) runs as listed,
which ``validate`` has shown finishes (in-order execution cannot deadlock on a valid plan).

``_PipelineScheduleRuntime`` and ``_Action`` are private torch API, pinned with the rest of the
project's use of it in ``torch_orders.SUPPORTED_TORCH``. Nothing here imports Ray.
"""

from __future__ import annotations

import datetime
import functools
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable, Sequence

import torch
from torch import nn

from pdml_ray.errors import PlanError, UsageError
from pdml_ray.pipeline.partition import split_sequential
from pdml_ray.pipeline.plan import Plan, validate
from pdml_ray.pipeline.torch_orders import torch_actions, torch_schedules


def plan_ranks(plan: Plan) -> int:
    """Ranks a plan runs on: one per stage, or ``max(stage_rank) + 1`` with virtual stages."""
    return plan.num_stages if plan.stage_rank is None else max(plan.stage_rank) + 1


def rank_stages(plan: Plan, rank: int) -> list[int]:
    """The stage indices ``plan`` places on ``rank``, in stage order."""
    if plan.stage_rank is None:
        return [rank] if 0 <= rank < plan.num_stages else []
    return [k for k, r in enumerate(plan.stage_rank) if r == rank]


def pipeline_stages(model: nn.Sequential, plan: Plan, rank: int, device: torch.device,
                    group: Any = None) -> list[Any]:
    """``model`` cut into ``plan.num_stages`` consecutive parts balanced by parameter count
    (``partition.split_sequential``), and the parts ``plan`` places on ``rank`` as torch ``PipelineStage``s
    (shapes inferred from the first micro-batch). The stages hold ``model``'s own layers, so its
    parameters' ``.grad`` are the step's gradients (on this rank's layers)."""
    from torch.distributed.pipelining import PipelineStage

    parts = split_sequential(model, plan.num_stages)
    return [PipelineStage(parts[k].to(device), k, plan.num_stages, device, group=group)
            for k in rank_stages(plan, rank)]


class TorchPlanRuntime:
    """Runs project plans on torch's ``_PipelineScheduleRuntime`` for this rank's ``stages``.

    ``load(plan)`` converts and lowers a plan (every step, if the plan changes every step); ``step``
    runs one global step of ``microbatches`` micro-batches as torch's schedules do (inputs split along
    dimension 0, the loss on the last stage). ``loss_fn(output, target)`` and ``scale_grads`` are torch's.

    ``action_ranges=False`` (the default) runs the lowered order with ``_OrderLoop`` (below): torch's own
    stage calls and point-to-point operations, without torch's per-action profiler range and dispatch.
    Those made a step 0-8% (median 2%) slower than this loop's, paired against ``Schedule1F1B`` running
    the same order on two gloo ranks over ten runs (``bench pipeline``'s torch-runtime section measures
    both loops); ``True`` runs torch's loop, whose profiler trace names every action.

    ``defer_recv`` posts each receive just before the action that needs it (torch's ``defer_pp_recv``)
    instead of as soon as its sender is scheduled; None: deferred for CPU stages. On gloo, receives
    posted ahead made steps 10-17% slower than ``Schedule1F1B``'s (two ranks on 2 shared cores, paired
    medians over 50 interleaved rounds); deferred they were within its noise (1.00-1.04). On GPUs (NCCL)
    posting ahead overlaps transfers with compute: torch's default. Point-to-point messages between two
    ranks match in posting order (one tag), and torch 2.13's deferral can reorder a rank's receives
    against its peer's sends (two chunks per rank: an osprey plan got gradients 0.6 off, silently), so a
    deferred order is used only when every pair of ranks still posts in the same order
    (``posted_in_send_order``); otherwise the plan is lowered again without deferral.

    ``wait_sends`` completes a rank's posted sends before its next compute action, as ``Schedule1F1B``
    waits for each send before its next chunk; None: on for CPU stages (with ``action_ranges=False``).
    On gloo a send left in flight competes with the next compute for the rank's core: waiting took
    torch-1f1b over ``Schedule1F1B`` from 1.041 and 1.030 to 1.021 and 0.995 (full size) and from 1.023
    and 0.999 to 0.952 and 0.940 (``--quick`` size), each pair measured in one session, medians of three
    two-rank runs. On GPUs NCCL sends run on their own stream: torch's default leaves them in flight.
    A plan whose order would stop with sends waited (``finishes_with_sends_waited``) runs without.
    """

    def __init__(self, stages: Sequence[Any], microbatches: int, *, loss_fn: Callable[..., torch.Tensor],
                 scale_grads: bool = True, defer_recv: bool | None = None, wait_sends: bool | None = None,
                 action_ranges: bool = False) -> None:
        if not stages:
            raise PlanError("TorchPlanRuntime needs this rank's PipelineStages (at least one); build them with "
                            "pdml_ray.pipeline.torch_exec.pipeline_stages(model, plan, rank, device)")
        schedules = torch_schedules()
        self.stages = list(stages)
        self.microbatches = microbatches
        runtime_class = schedules._PipelineScheduleRuntime if action_ranges else _order_loop_class()
        self.runtime = runtime_class(self.stages, microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
        on_cpu = all(torch.device(s.device).type == "cpu" for s in self.stages)
        self.wait_sends = (on_cpu if wait_sends is None else wait_sends) and not action_ranges
        self.defer_recv = on_cpu if defer_recv is None else defer_recv
        self.rank: int = self.runtime.rank
        self.plan: Plan | None = None

    def load(self, plan: Plan) -> bool:
        """Validate ``plan``, check that it places exactly this runtime's stages on this rank, and hand its
        order to torch's runtime (torch lowers it: sends, receives, gradient reduction). A plan equal to
        the loaded one (a static schedule's, or an unchanged decision) keeps the lowered order: returns
        whether it was lowered."""
        if plan == self.plan:
            return False
        validate(plan)
        held = sorted(s.stage_index for s in self.stages)
        wanted = rank_stages(plan, self.rank)
        if plan.num_microbatches != self.microbatches or held != wanted or any(
                s.num_stages != plan.num_stages for s in self.stages):
            raise PlanError(f"{plan.schedule or 'the plan'} ({plan.num_stages} stages, {plan.num_microbatches} "
                            f"micro-batches) places stages {wanted} on rank {self.rank}, but this runtime holds stages "
                            f"{held} of {self.stages[0].num_stages} for {self.microbatches} micro-batches; build the "
                            "stages for this plan's layout (pipeline_stages) or keep the plan's shape fixed "
                            "(osprey.plans='full-backward' keeps one stage per rank)")
        if plan_ranks(plan) != self.runtime.pp_group_size:
            raise PlanError(f"{plan.schedule or 'the plan'} runs on {plan_ranks(plan)} ranks but the stages' process "
                            f"group has {self.runtime.pp_group_size}; plan for as many ranks as the group has")
        actions = torch_actions(plan)
        self.runtime.pipeline_order = actions
        self.runtime._defer_pp_recv = self.defer_recv
        try:
            self.runtime._prepare_schedule_with_comms({r: list(a) for r, a in actions.items()})
            if self.defer_recv and not posted_in_send_order(self.runtime.pipeline_order_with_comms,
                                                            self.runtime.stage_index_to_group_rank):
                self.runtime._defer_pp_recv = False
                self.runtime._prepare_schedule_with_comms({r: list(a) for r, a in actions.items()})
        except (AssertionError, ValueError) as err:  # torch's own checks of an order, which validate passed
            raise PlanError(f"torch's runtime refused {plan.schedule or 'the plan'}'s order: {err}") from err
        self.runtime.sends_done_before_compute = self.wait_sends and finishes_with_sends_waited(
            self.runtime.pipeline_order_with_comms)
        self.plan = plan
        return True

    @property
    def sends_waited(self) -> bool:
        """Whether the loaded plan's sends complete before each next compute (``wait_sends`` and the order
        allowed it)."""
        return bool(self.runtime.sends_done_before_compute)

    @property
    def receives_deferred(self) -> bool:
        """Whether the loaded plan's receives were deferred (``defer_recv`` and the order allowed it)."""
        return bool(self.runtime._defer_pp_recv)

    def step(self, *args: Any, target: Any = None, losses: list[Any] | None = None, **kwargs: Any) -> Any:
        """One global step of the loaded plan on whole-batch inputs (as torch's ``schedule.step``):
        the last stage's merged outputs there, None elsewhere."""
        if self.plan is None:
            raise PlanError("TorchPlanRuntime.step before any plan was loaded; call load(plan) first")
        return self.runtime.step(*args, target=target, losses=losses, **kwargs)


@functools.cache
def _order_loop_class() -> Any:
    """``_OrderLoop``: torch's ``_PipelineScheduleRuntime`` (its lowering, ``step``, micro-batch split and
    merge, losses) whose ``_step_microbatches`` runs the lowered order in one plain loop.

    Each action does what torch's loop does for it, through the same stage methods (``forward_one_chunk``,
    ``backward_one_chunk``, ``backward_weight_one_chunk``, ``perform_reduce_grad``, the stages' send and
    receive ops, posted one action at a time with torch's ``_batch_p2p``): gradients are torch's to the bit.
    What it leaves out is per action: torch opens a profiler range (``record_function``) and builds a
    closure call for every send, receive and compute, which cost steps up to 8% (median 2%) on two gloo
    ranks at ``bench pipeline``'s sizes. With ``sends_done_before_compute`` a rank's posted sends complete before
    its next compute, as ``Schedule1F1B``'s loop waits for each send before the next chunk. FSDP stages,
    custom action functions and ``OVERLAP_F_B`` actions (which project plans never contain) run torch's
    own loop."""
    schedules = torch_schedules()
    from torch.distributed.fsdp import FSDPModule

    class _OrderLoop(schedules._PipelineScheduleRuntime):  # type: ignore[name-defined]
        sends_done_before_compute = False  # TorchPlanRuntime's wait_sends
        runs_own_loop = False  # whether the lowered order is one this loop runs (decided once per lowering)

        def _prepare_schedule_with_comms(self, actions: Any, format: Any = "compute_only") -> None:
            super()._prepare_schedule_with_comms(actions, format)
            self.runs_own_loop = not any(isinstance(s.submod, FSDPModule) for s in self._stages) and all(
                a.computation_type.value in _LOOP_ACTIONS for a in self.pipeline_order_with_comms[self.rank])

        def _step_microbatches(self, arg_mbs: Any = None, kwarg_mbs: Any = None, target_mbs: Any = None,
                               losses: Any = None, return_outputs: bool = True, loss_kwargs: Any = None) -> None:
            if self._comp_type_to_function_map or not self.runs_own_loop:  # custom functions: registered any time
                return super()._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs)
            order = self.pipeline_order_with_comms[self.rank]
            arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
            self._initialize_stages(arg_mbs[0], kwarg_mbs[0], target_mbs[0] if target_mbs is not None else None,
                                    loss_kwargs)
            stages = {s.stage_index: s for s in self._stages}
            received: dict[tuple[str, int, int], list[Any]] = {}  # ("F" or "B", stage, micro-batch) -> its receives
            sends: list[list[Any]] = []  # waited before the next compute (sends_done_before_compute) or at the end
            backwards = dict.fromkeys(stages, 0)  # full or weight backwards per stage: the last one reduces
            n = self._n_microbatches

            def wait_input(direction: str, k: int, m: int, needed: bool) -> None:
                works = received.pop((direction, k, m), None)
                if works is None and needed:
                    raise PlanError(f"stage {k} computes micro-batch {m} ({direction}) before receiving its input")
                schedules._wait_batch_p2p(works or [])

            for a in order:
                kind, k, m = a.computation_type.value, a.stage_index, a.microbatch_index
                stage = stages[k]
                if self.sends_done_before_compute and sends and kind in ("F", "B", "I", "W"):
                    for works in sends:
                        schedules._wait_batch_p2p(works)
                    sends.clear()
                if kind == "SEND_F":
                    sends.append(schedules._batch_p2p(stage.get_fwd_send_ops(m)))
                elif kind == "SEND_B":
                    sends.append(schedules._batch_p2p(stage.get_bwd_send_ops(m)))
                elif kind == "RECV_F":
                    received[("F", k, m)] = schedules._batch_p2p(stage.get_fwd_recv_ops(m))
                elif kind == "RECV_B":
                    received[("B", k, m)] = schedules._batch_p2p(stage.get_bwd_recv_ops(m))
                elif kind == "F":
                    wait_input("F", k, m, not stage.is_first and k - 1 not in stages)
                    output = stage.forward_one_chunk(m, arg_mbs[m], kwarg_mbs[m], save_forward_output=return_outputs)
                    self._maybe_compute_loss(stage, output, target_mbs, m, loss_kwargs)
                    if k + 1 in stages:  # the next stage on this rank takes the output without a transfer
                        stages[k + 1].set_local_fwd_input(output, m)
                elif kind in ("B", "I"):
                    wait_input("B", k, m, not stage.is_last and k + 1 not in stages)
                    full = kind == "B"
                    backwards[k] += full
                    stage.backward_one_chunk(m, loss=self._maybe_get_loss(stage, m), full_backward=full,
                                             last_backward=full and backwards[k] == n)
                    if k - 1 in stages:
                        stages[k - 1].set_local_bwd_input(stage.get_local_bwd_output(m), m)
                elif kind == "W":
                    backwards[k] += 1
                    stage.backward_weight_one_chunk(m, last_backward=backwards[k] == n)
                elif kind == "REDUCE_GRAD":
                    stage.perform_reduce_grad(n if self.scale_grads else 1)
                # UNSHARD and RESHARD act on FSDP stages only, which torch's loop runs
            for works in sends:
                schedules._wait_batch_p2p(works)
            self._update_losses(self._stages, losses)

    return _OrderLoop


_LOOP_ACTIONS = frozenset({"F", "B", "I", "W", "SEND_F", "SEND_B", "RECV_F", "RECV_B", "REDUCE_GRAD", "UNSHARD",
                           "RESHARD"})
"""Action kinds ``_OrderLoop`` runs itself (torch's ``_ComputationType`` values)."""


Message = tuple[str, int, int]
"""A point-to-point message of one step: (direction 'F' or 'B', receiving stage, micro-batch)."""


def _message(action: Any) -> tuple[Message, int] | None:
    """A lowered send or receive action's message and the stage at the other end; None for other actions."""
    kind, s, m = action.computation_type.value, action.stage_index, action.microbatch_index
    return {"SEND_F": (("F", s + 1, m), s + 1), "SEND_B": (("B", s - 1, m), s - 1),
            "RECV_F": (("F", s, m), s - 1), "RECV_B": (("B", s, m), s + 1)}.get(kind)


def posted_in_send_order(order: dict[int, list[Any]], stage_rank: dict[int, int]) -> bool:
    """Whether, in torch's lowered per-rank order (sends and receives included), every rank posts its
    receives from each peer in the order that peer posts the matching sends: point-to-point messages of
    one pair of ranks match in posting order, so any other order hands a micro-batch another's tensors."""
    sent: dict[tuple[int, int], list[Message]] = {}
    received: dict[tuple[int, int], list[Message]] = {}
    for rank, actions in order.items():
        for a in actions:
            found = _message(a)
            if found is None:
                continue
            msg, peer = found
            if a.computation_type.value.startswith("SEND"):
                sent.setdefault((rank, stage_rank[peer]), []).append(msg)
            else:
                received.setdefault((stage_rank[peer], rank), []).append(msg)
    return sent == received


def finishes_with_sends_waited(order: dict[int, list[Any]]) -> bool:
    """Whether torch's lowered per-rank ``order`` (sends and receives included) still finishes when every
    rank completes its posted sends before its next compute action (``TorchPlanRuntime``'s ``wait_sends``).

    A send completes once its peer has posted the receive, and a compute waits for its input's send: each
    rank is stepped through its order until all finish or none can move. A plan that interleaves two
    ranks' transfers against each other (rank 0 sends, computes, then receives what rank 1 sent before a
    compute that waits for rank 0's next send) would stop forever with sends waited, and runs without."""
    sent: set[Message] = set()
    received: set[Message] = set()
    pos = dict.fromkeys(order, 0)
    in_flight: dict[int, list[Message]] = {r: [] for r in order}
    awaited: dict[int, set[Message]] = {r: set() for r in order}  # receives posted, not yet used
    moved = True
    while moved:
        moved = False
        for r, actions in order.items():
            while pos[r] < len(actions):
                a = actions[pos[r]]
                kind, k, m = a.computation_type.value, a.stage_index, a.microbatch_index
                found = _message(a)
                if found is not None and kind.startswith("SEND"):
                    sent.add(found[0])
                    in_flight[r].append(found[0])
                elif found is not None:
                    received.add(found[0])
                    awaited[r].add(found[0])
                elif kind in ("F", "B", "I", "W"):
                    needs = ("F", k, m) if kind == "F" else ("B", k, m)
                    if any(msg not in received for msg in in_flight[r]) or (
                            kind != "W" and needs in awaited[r] and needs not in sent):
                        break
                    in_flight[r].clear()
                    awaited[r].discard(needs)
                pos[r] += 1
                moved = True
    return all(pos[r] == len(actions) for r, actions in order.items())


# ---- running ranks on one machine (tests, benchmarks) ---------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world_size: int, port: int, timeout_s: float, backend: str, results: Any,
               fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the machine's cores
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)  # rank r on GPU r
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # reported to the parent, which raises it there with the rank's traceback
        results.put((rank, False, traceback.format_exc()))


def run_local_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                    timeout_s: float = 120.0, start_method: str = "forkserver") -> list[Any]:
    """``fn(rank, world_size, *args)`` in ``world_size`` processes joined by a process group on this
    machine (gloo: each with its share of the cores; nccl: rank r on GPU r); their return values in rank
    order. ``fn`` and its results must pickle. A rank that fails raises PlanError with its traceback;
    ranks still running after ``timeout_s`` seconds are stopped (the process group's timeout is the same).

    ``start_method`` 'forkserver' (the default: ranks fork from a fresh, single-threaded server process
    that imported torch once, so they start in well under a second and are safe after Ray, threads or
    CUDA in the caller) or 'spawn' (fresh interpreters, each importing torch again). Not 'fork': forking a
    process that runs other threads (torch's thread pool, gloo's, a test runner's) can copy a heap lock
    mid-update and corrupt the child's heap ("malloc(): unaligned fastbin chunk detected", seen in CI)."""
    import multiprocessing

    if world_size < 1 or start_method not in ("forkserver", "spawn") or backend not in ("gloo", "nccl"):
        raise UsageError(f"run_local_ranks needs world_size >= 1, start_method 'forkserver' or 'spawn' and backend "
                         f"'gloo' or 'nccl', got {world_size}, {start_method!r} and {backend!r}")
    ctx: Any = multiprocessing.get_context(start_method)  # results are plain data: no tensor sharing needed
    if start_method == "forkserver":  # takes effect when this process first starts its server
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.distributed.pipelining"])
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, world_size, port, timeout_s, backend, results, fn, args),
                         daemon=True) for rank in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world_size:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                if dead:  # died before reporting (e.g. could not start: see its stderr)
                    raise PlanError(f"{backend} rank(s) {dead} of {world_size} exited with status "
                                    f"{[procs[r].exitcode for r in dead]} before reporting; their stderr says why") from None
                if time.monotonic() > deadline:
                    raise PlanError(f"{backend} ranks {sorted(set(range(world_size)) - set(out))} gave no result within "
                                    f"{timeout_s:g} s; raise timeout_s if the machine is loaded") from None
                continue
            if not ok:
                raise PlanError(f"{backend} rank {rank} of {world_size} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return [out[r] for r in range(world_size)]
