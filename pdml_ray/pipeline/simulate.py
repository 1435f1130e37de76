"""Discrete-event simulator of a pipeline (stages x replicas) running any Plan through the Dispatcher.

Cost of an action (seconds) on replica r of stage k at global step t:

    base[k][kind] * mb_factor[m] * noise[k, kind, m] / speed[k][r] * drift[k][r](t)

``mb_factor`` (per micro-batch cost variation, e.g. sequence length) and the lognormal ``noise`` are
drawn from ``(seed, step)`` and do not depend on the replica or the schedule, so every schedule of one
step sees the same work. Split backward costs what the full backward does: I = (1 - weight_fraction) B
and W = weight_fraction B, with B's noise; ``drift`` is a per-replica log-normal random walk over steps. A forward's or
backward's output reaches another rank ``transfer_s`` after it completes.

Lower bound on a step's makespan (``lower_bound_s``), valid for any plan:
* stage bound: stage k cannot start before the fastest forward chain reaches it (head_k: min over
  micro-batches of the sum of the fastest replicas' F costs of stages < k, plus k transfers), and after
  its last backward the fastest backward chain below it remains (tail_k, likewise). In between its
  replicas together do at most sum_r speed_kr units of work per second, so the window is at least
  W_k / sum_r speed_kr, with W_k the stage's total work at speed 1 (drift included in the speeds);
  and since a micro-batch's F and B at a stage run whole on one replica, at least the best split of
  whole micro-batches over the replicas (``_integer_window``, counting each replica's smallest jobs):
  bound_k = head_k + max(W_k / sum_r speed_kr, integer window_k) + tail_k.
* chain bound: the longest micro-batch's F and B chain through all stages on the fastest replicas,
  plus 2 (S - 1) transfers.
* split backward (F + I + W): the stage's work is the same (I + W = B), but its last action may be a
  W that nothing waits for, so tail_k = 0; the chain is F and I through all stages, then W at stage 0.
* virtual stages: the bound is per rank: the earliest head and the smallest tail of its stages, around
  its stages' summed work over the fastest capacity any of them has (and each stage's integer window).
  Transfers are counted only between ranks (chunks of one rank hand over at once).
lower_bound_s = max(max_k bound_k, chain bound).

Chunked plans: a plan of ``c`` x ``stages`` virtual stages (``Plan.stage_rank`` mapping them onto the
profile's stages as ranks, as torch's interleaved and V schedules do) runs on a profile of ``stages``
stages: each chunk costs 1 / c of its rank's stage (the model cut into c equal pieces per rank), at
that rank's replica speeds, and one chunk's activation is 1 / c of the stage's (memory is counted in
units of a whole stage's activation of one mean-length micro-batch).

Non-stationary conditions (``pdml_ray.pipeline.scenarios`` names them): ``slow_windows`` (a replica
slows by a factor for a window of steps, then recovers), ``seq_len_sigma`` (long-tailed sequence
lengths: uneven costs, attention quadratic, and activations linear in length), ``transfer_delay_p``
and ``transfer_delay_s`` (late transfers between ranks), with ``memory_limit`` as the cap.

Layer re-balancing: given the model's layers (``LayerCosts``), ``simulate_schedule`` carries out the
layer moves its ``moves`` source decides (``pdml_ray.pipeline.rebalance``) at the step boundary they name:
from then on each stage costs its new layers' sum. The move itself is free here (the runtime's moves
of parameters and optimizer state take real time, between steps).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from pdml_ray.config import PipelineConfig
from pdml_ray.errors import ConfigError, PlanError
from pdml_ray.pipeline.dispatch import Dispatcher
from pdml_ray.pipeline.partition import stage_bounds
from pdml_ray.pipeline.plan import FREES_ACTIVATION, KIND_INDEX, Action, Kind, Measurement, Plan, PlanSource, validate

if TYPE_CHECKING:
    from pdml_ray.pipeline.rebalance import LayerMove


@dataclass(frozen=True, slots=True)
class SlowWindow:
    """One replica running slower for a window of global steps, then recovering (thermal throttling,
    a noisy neighbour): its speed is multiplied by ``factor`` for steps ``start_step <= t <
    start_step + steps``."""

    stage: int
    replica: int
    factor: float
    """Speed multiplier in the window (0.5 = twice as slow)."""
    start_step: int
    steps: int

    def active(self, step: int) -> bool:
        return self.start_step <= step < self.start_step + self.steps


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """What the simulator emulates: stage costs, replica speeds, variation, noise, drift, links, memory."""

    stages: int
    replicas: tuple[int, ...]
    forward_s: tuple[float, ...]
    """Forward time per micro-batch at speed 1, per stage (seconds)."""
    backward_s: tuple[float, ...]
    """Backward time per micro-batch at speed 1, per stage (seconds)."""
    speeds: tuple[tuple[float, ...], ...]
    """Relative speed per stage per replica (1.0 nominal; 0.5 = twice as slow)."""
    microbatch_cv: float = 0.0
    """Relative std of per-micro-batch cost factors (drawn anew each step, shared by all stages)."""
    noise_sigma: float = 0.0
    """Sigma of the lognormal noise on every action's cost (mean-one)."""
    drift_sigma: float = 0.0
    """Per-step sigma of each replica's log-speed random walk."""
    transfer_s: float = 0.0
    """Seconds between an output completing and it being usable on the next (previous) stage."""
    memory_limit: int | None = None
    """Activation budget per replica (rank), in units of one mean-length micro-batch's activation at a
    whole stage; peaks above it count as memory violations."""
    weight_fraction: float = 0.5
    """Share of a full backward that is the weight gradient W when the backward is split; the input
    gradient I is the rest (B = I + W)."""
    slow_windows: tuple[SlowWindow, ...] = ()
    """Replicas that slow down for a window of steps and recover (the drift scenario)."""
    seq_len_sigma: float = 0.0
    """Uneven micro-batches: sigma of each micro-batch's lognormal (long-tailed, mean-one) sequence length
    L, drawn each step (``sequence_lengths``; known before the step is planned). Its costs scale as
    (1 - attention_share) L + attention_share L^2 (attention is quadratic), its activations as L."""
    attention_share: float = 0.5
    """Share of a micro-batch's cost at mean length that is attention (quadratic in its length)."""
    max_seq_len: float | None = None
    """Longest sequence length (relative to the distribution's mean) a micro-batch may have, as a data
    loader's maximum length truncates them; None: no limit."""
    transfer_delay_p: float = 0.0
    """Probability that one transfer between ranks is late (a communication straggler), drawn per step,
    stage, direction and micro-batch."""
    transfer_delay_s: float = 0.0
    """Extra seconds a late transfer takes."""

    def __post_init__(self) -> None:
        S = self.stages
        lengths = {name: len(getattr(self, name)) for name in ("replicas", "forward_s", "backward_s", "speeds")}
        if any(n != S for n in lengths.values()):
            raise ConfigError(f"profile: replicas, forward_s, backward_s and speeds need one entry per stage ({S}), "
                              f"got lengths {lengths}; give one value per stage")
        for k in range(S):
            if len(self.speeds[k]) != self.replicas[k] or min(self.speeds[k], default=0.0) <= 0:
                raise ConfigError(f"profile: speeds[{k}] needs {self.replicas[k]} positive entries (one per replica of "
                                  f"stage {k}; 1.0 = nominal), got {self.speeds[k]}")
        if not 0.0 <= self.weight_fraction <= 1.0:
            raise ConfigError(f"profile: weight_fraction must be in [0, 1] (W's share of the backward), got "
                              f"{self.weight_fraction}")
        for w in self.slow_windows:
            if not (0 <= w.stage < S and 0 <= w.replica < self.replicas[w.stage] and w.factor > 0
                    and w.start_step >= 0 and w.steps >= 1):
                raise ConfigError(f"profile: slow window {w} needs a replica of the cluster, a factor > 0, a start "
                                  "step >= 0 and at least one step")
        if not (self.seq_len_sigma >= 0 and (self.max_seq_len is None or self.max_seq_len > 0)
                and 0 <= self.attention_share <= 1 and 0 <= self.transfer_delay_p <= 1
                and self.transfer_delay_s >= 0):
            raise ConfigError(f"profile: seq_len_sigma >= 0, max_seq_len > 0 or None, attention_share and "
                              f"transfer_delay_p in [0, 1], transfer_delay_s >= 0 seconds; got {self.seq_len_sigma}, "
                              f"{self.max_seq_len}, {self.attention_share}, {self.transfer_delay_p}, {self.transfer_delay_s}")

    @classmethod
    def build(cls, stages: int, replicas: int | Sequence[int], *, profile: str = "homogeneous",
              forward_s: float = 1.0, backward_s: float = 2.0, seed: int = 0, **overrides: Any) -> "ClusterProfile":
        """Named profiles: 'homogeneous'; 'heterogeneous' (speeds uniform in [0.8, 1.2], and replica 0 of
        the middle stage at half of that); 'noisy' (homogeneous + lognormal noise sigma 0.2, per-micro-batch
        variation 0.1, drift 0.05 per step). ``overrides`` replace any field."""
        reps = (replicas,) * stages if isinstance(replicas, int) else tuple(int(r) for r in replicas)
        rng = np.random.default_rng([seed, 7])
        speeds = [[1.0] * reps[k] for k in range(stages)]
        extra: dict[str, Any] = {}
        if profile == "heterogeneous":
            speeds = [rng.uniform(0.8, 1.2, size=reps[k]).tolist() for k in range(stages)]
            speeds[stages // 2][0] *= 0.5
        elif profile == "noisy":
            extra = {"noise_sigma": 0.2, "microbatch_cv": 0.1, "drift_sigma": 0.05}
        elif profile != "homogeneous":
            raise ConfigError(f"unknown profile {profile!r}; use one of {list(PROFILES)} and refine it with overrides")
        kwargs = dict(stages=stages, replicas=reps, forward_s=(forward_s,) * stages,
                      backward_s=(backward_s,) * stages, speeds=tuple(tuple(s) for s in speeds), **extra)
        kwargs.update(overrides)
        return cls(**kwargs)


PROFILES = ("homogeneous", "heterogeneous", "noisy")


@dataclass(frozen=True, slots=True)
class LayerCosts:
    """A model's layers for re-balancing in the simulator: each layer's forward and backward seconds per
    micro-batch at speed 1; a stage costs the sum of its layers'."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]

    def stage_costs(self, cuts: Sequence[int]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(forward_s, backward_s) per stage of the model cut at ``cuts``."""
        bounds = stage_bounds(len(self.forward_s), list(cuts))
        return (tuple(sum(self.forward_s[a:b]) for a, b in bounds), tuple(sum(self.backward_s[a:b]) for a, b in bounds))


def split_backward_work(fb: np.ndarray, weight_fraction: float) -> np.ndarray:
    """(stages, 2, micro-batches) F and B seconds -> (stages, kinds, micro-batches) by ``KIND_INDEX``: F, B,
    then I = (1 - weight_fraction) B and W = weight_fraction B."""
    split = fb[:, 1:2, :] * np.array([1.0 - weight_fraction, weight_fraction])[None, :, None]
    return np.concatenate([fb, split], axis=1)


def _integer_window(job_s: np.ndarray, speeds: Sequence[float]) -> float:
    """Least time for replicas of ``speeds`` to finish all micro-batches of one stage, whole micro-batches each.

    A replica given n micro-batches needs at least the n smallest (F+B) works / its speed (seconds), a
    convex increasing function of n, so adding micro-batches one at a time where that is smallest
    minimises the largest replica time exactly. O(M x replicas).
    """
    prefix = np.concatenate([[0.0], np.cumsum(np.sort(job_s))])
    counts = [0] * len(speeds)
    for _ in range(len(job_s)):
        r = min(range(len(speeds)), key=lambda r: prefix[counts[r] + 1] / speeds[r])
        counts[r] += 1
    return float(max(prefix[n] / s for n, s in zip(counts, speeds)))


@dataclass
class StepResult:
    makespan_s: float
    lower_bound_s: float
    bubble_fraction: list[float]
    """Per stage (per rank with virtual stages): 1 - busy time / (makespan x replicas)."""
    peak_memory: dict[tuple[int, int], int]
    """Most activations (micro-batches' F started, B or W not finished) each orders key held at once."""
    peak_activation: dict[tuple[int, int], float]
    """Most activation memory each orders key held at once, in units of one mean-length micro-batch's
    activation at a whole stage (a micro-batch of relative length L holds L; a chunk of c holds 1 / c)."""
    memory_violations: int
    """Replicas whose ``peak_activation`` exceeded the profile's ``memory_limit``."""
    measurements: list[Measurement] = field(repr=False)

    @property
    def total_bubble(self) -> float:
        return float(np.mean(self.bubble_fraction))


class PipelineSimulator:
    def __init__(self, profile: ClusterProfile, seed: int = 0) -> None:
        self.profile, self.seed = profile, seed
        self._drift: list[np.ndarray] = [np.zeros(sum(profile.replicas))]  # log-speed offset per step

    def _speeds(self, step: int) -> list[list[float]]:
        p = self.profile
        while len(self._drift) <= step:  # random walk, extended lazily so any step is reproducible
            rng = np.random.default_rng([self.seed, 11, len(self._drift)])
            self._drift.append(self._drift[-1] + rng.normal(0.0, p.drift_sigma, size=self._drift[0].shape))
        flat, out, i = self._drift[step], [], 0
        for k in range(p.stages):
            out.append([p.speeds[k][r] * math.exp(flat[i + r]) for r in range(p.replicas[k])])
            i += p.replicas[k]
        for w in p.slow_windows:
            if w.active(step):
                out[w.stage][w.replica] *= w.factor
        return out

    def recut(self, layers: LayerCosts, cuts: Sequence[int]) -> None:
        """Cut the model's ``layers`` at ``cuts`` from now on (a layer move): stage costs change, nothing else."""
        forward_s, backward_s = layers.stage_costs(cuts)
        self.profile = dataclasses.replace(self.profile, forward_s=forward_s, backward_s=backward_s)

    def sequence_lengths(self, step: int, microbatches: int) -> np.ndarray:
        """Each micro-batch's sequence length relative to the mean (1.0 when ``seq_len_sigma`` is 0):
        what a data loader knows before the step, so a planner may read it."""
        sigma = self.profile.seq_len_sigma
        if not sigma:
            return np.ones(microbatches)
        rng = np.random.default_rng([self.seed, 19, step])
        lengths = rng.lognormal(-sigma**2 / 2, sigma, size=microbatches)
        return lengths if self.profile.max_seq_len is None else np.minimum(lengths, self.profile.max_seq_len)

    def transfer_delays(self, step: int, stages: int, microbatches: int) -> np.ndarray:
        """(stages, 2, microbatches) extra seconds of the transfer out of each stage: [.., 0, m] its
        forward output, [.., 1, m] its backward's (B or I) input gradient."""
        p = self.profile
        if not (p.transfer_delay_p and p.transfer_delay_s):
            return np.zeros((stages, 2, microbatches))
        rng = np.random.default_rng([self.seed, 23, step])
        return (rng.random((stages, 2, microbatches)) < p.transfer_delay_p) * p.transfer_delay_s

    def work(self, step: int, microbatches: int) -> np.ndarray:
        """(stages, kinds, microbatches) seconds of work at speed 1, kinds indexed by ``KIND_INDEX``
        (F 0, B 1, I 2, W 3; I + W = B)."""
        p = self.profile
        rng = np.random.default_rng([self.seed, 13, step])
        mb = np.maximum(rng.normal(1.0, p.microbatch_cv, size=microbatches), 0.2) if p.microbatch_cv else \
            np.ones(microbatches)
        # Mean-one lognormal: exp(N(-sigma^2/2, sigma)).
        noise = rng.lognormal(-p.noise_sigma**2 / 2, p.noise_sigma, size=(p.stages, 2, microbatches)) \
            if p.noise_sigma else np.ones((p.stages, 2, microbatches))
        lengths = self.sequence_lengths(step, microbatches)
        mb = mb * ((1.0 - p.attention_share) * lengths + p.attention_share * lengths**2)
        base = np.stack([np.asarray(p.forward_s), np.asarray(p.backward_s)], axis=1)[:, :, None]
        fb = base * mb[None, None, :] * noise  # (S, 2, M): F, B
        return split_backward_work(fb, p.weight_fraction)

    def layout(self, num_stages: int, stage_rank: Sequence[int] | None) -> tuple[list[int], int]:
        """The profile stage of each of a plan's ``num_stages`` stages, and the chunks per profile stage:
        (identity, 1) for a plan of the profile's stages; (``stage_rank``, c) for a chunked plan of
        c x stages virtual stages on the profile's stages as ranks. PlanError for any other shape."""
        S = self.profile.stages
        if num_stages == S:
            return list(range(S)), 1
        if stage_rank is not None and num_stages % S == 0 and sorted(set(stage_rank)) == list(range(S)):
            return list(stage_rank), num_stages // S
        raise PlanError(f"plan has {num_stages} stages, the profile {S}; build the plan for the simulated cluster's "
                        f"stages, or as chunks of them (a multiple of {S} stages with stage_rank over {S} ranks)")

    def _work_and_speeds(self, step: int, microbatches: int, owner: Sequence[int], chunks: int
                         ) -> tuple[np.ndarray, list[list[float]]]:
        """Work (plan stages, kinds, micro-batches; seconds at speed 1) and replica speeds per plan stage."""
        w, speeds = self.work(step, microbatches), self._speeds(step)
        return w[list(owner)] / chunks, [speeds[k] for k in owner]

    def lower_bound(self, step: int, microbatches: int, *, split_backward: bool = False,
                    stage_rank: Sequence[int] | None = None) -> float:
        """Least makespan (s) of any plan of the action set in use (F + B, or ``split_backward`` F + I + W)
        with stages on ranks ``stage_rank`` (None: stage k on rank k; longer than the profile's stages:
        a chunked plan); see the module docstring."""
        p = self.profile
        owner, chunks = self.layout(len(stage_rank) if stage_rank is not None else p.stages, stage_rank)
        S = len(owner)
        w, speeds = self._work_and_speeds(step, microbatches, owner, chunks)
        ranks = list(stage_rank) if stage_rank is not None else list(range(S))
        # Rank changes before stage k: the transfers a micro-batch's chain makes to reach it.
        hops = np.concatenate([[0], np.cumsum([ranks[k] != ranks[k + 1] for k in range(S - 1)])]).astype(int)
        fastest = np.array([max(s) for s in speeds])[:, None]  # (S, 1)
        back = KIND_INDEX[Kind.INPUT] if split_backward else KIND_INDEX[Kind.BACKWARD]
        f_fast, b_fast = w[:, 0, :] / fastest, w[:, back, :] / fastest  # (S, M) seconds on the fastest replica
        f_prefix = np.vstack([np.zeros(microbatches), np.cumsum(f_fast, axis=0)])  # (S+1, M)
        b_prefix = np.vstack([np.zeros(microbatches), np.cumsum(b_fast, axis=0)])
        last = w[0, KIND_INDEX[Kind.WEIGHT], :] / fastest[0] if split_backward else 0.0  # W at stage 0 ends the chain
        chain = float((f_prefix[S] + b_prefix[S] + last).max() + 2 * hops[S - 1] * p.transfer_s)
        head = [float(f_prefix[k].min()) + hops[k] * p.transfer_s for k in range(S)]
        tail = [0.0 if split_backward else float(b_prefix[k].min()) + hops[k] * p.transfer_s for k in range(S)]
        job = w[:, :2, :].sum(axis=1)  # (S, M): F + B = F + I + W seconds per micro-batch at speed 1
        bound = chain
        for rank in set(ranks):
            ks = [k for k in range(S) if ranks[k] == rank]
            capacity = max(sum(speeds[k]) for k in ks)  # units of work per second, at best
            window = max([sum(float(job[k].sum()) for k in ks) / capacity]
                         + [_integer_window(job[k], speeds[k]) for k in ks])
            bound = max(bound, min(head[k] for k in ks) + window + min(tail[k] for k in ks))
        return bound

    def run_step(self, plan: Plan, step: int = 0) -> StepResult:
        """Run one global step of ``plan``; every idle replica asks the Dispatcher what to start."""
        p = self.profile
        owner, chunks = self.layout(plan.num_stages, plan.stage_rank)
        if tuple(plan.replicas) != tuple(p.replicas[k] for k in owner):
            raise PlanError(f"plan is for {plan.num_stages} stages x {plan.replicas}, the profile for "
                            f"{p.stages} x {p.replicas}; build the plan for the simulated cluster's shape")
        d = Dispatcher(plan, transfer_s=p.transfer_s)
        work, speeds = self._work_and_speeds(step, plan.num_microbatches, owner, chunks)
        w, transfer = work.tolist(), p.transfer_s
        late = self.transfer_delays(step, plan.num_stages, plan.num_microbatches).tolist()
        # Activation memory in units of one mean-length micro-batch at a whole stage: a chunk holds 1 / c.
        size = (self.sequence_lengths(step, plan.num_microbatches) / chunks).tolist()
        held = {key: 0.0 for key in plan.orders}
        peak_held = dict(held)
        rank = plan.stage_rank if plan.stage_rank is not None else tuple(range(plan.num_stages))
        busy_until: dict[tuple[int, int], float] = {key: -1.0 for key in plan.orders}
        busy_total = {key: 0.0 for key in plan.orders}
        measurements: list[Measurement] = []
        # (t s, seq, the action completing or None for a wake-up, (stage, replica) it concerns)
        events: list[tuple[float, int, Action | None, tuple[int, int]]] = []
        seq, now = 0, 0.0
        wake = sorted(plan.orders)
        while True:
            for key in wake:
                if busy_until[key] > now:
                    continue
                a = d.next_action(key[0], key[1], now)
                if a is None:
                    continue
                d.start(a)
                if a.kind is Kind.FORWARD:
                    held[key] += size[a.microbatch]
                    peak_held[key] = max(peak_held[key], held[key])
                cost = w[a.stage][KIND_INDEX[a.kind]][a.microbatch] / speeds[a.stage][a.replica]
                busy_until[key] = now + cost
                busy_total[key] += cost
                measurements.append(Measurement(a.stage, a.replica, a.kind, a.microbatch, cost))
                heapq.heappush(events, (now + cost, seq, a, key))
                seq += 1
            if not events:
                break
            now = events[0][0]
            wake = []
            while events and events[0][0] <= now:
                _, _, a, key = heapq.heappop(events)
                wake.append(key)
                if a is None:
                    continue
                if a.kind in FREES_ACTIVATION:
                    held[key] -= size[a.microbatch]
                delay = transfer + late[a.stage][0 if a.kind is Kind.FORWARD else 1][a.microbatch]
                d.complete(a, at=now, transfer_s=delay)
                for dep in d.dependants(a):
                    dkey = plan.slot(dep.stage, dep.replica)
                    if rank[dep.stage] == rank[a.stage] or delay == 0.0:
                        wake.append(dkey)
                    else:
                        heapq.heappush(events, (now + delay, seq, None, dkey))
                        seq += 1
        if not d.done():
            raise PlanError(f"simulation stalled at t={now:.4g}s with work left (plan {plan.schedule!r}); "
                            "check the plan with pdml_ray.pipeline.plan.validate, which names the defect")
        makespan = max(busy_until.values())
        # Per stage, or per rank with virtual stages: the first element of the orders key.
        bubble = [1.0 - sum(v for key, v in busy_total.items() if key[0] == g)
                  / (makespan * sum(1 for key in busy_total if key[0] == g))
                  for g in sorted({key[0] for key in busy_total})]
        budget = p.memory_limit if p.memory_limit is not None else math.inf
        lower = self.lower_bound(step, plan.num_microbatches, split_backward=plan.split_backward,
                                 stage_rank=plan.stage_rank)
        return StepResult(makespan_s=makespan, lower_bound_s=lower,
                          bubble_fraction=bubble, peak_memory=dict(d.peak_in_flight), peak_activation=peak_held,
                          memory_violations=sum(1 for v in peak_held.values() if v > budget + 1e-9),
                          measurements=measurements)


def simulate_schedule(scheduler: PlanSource, simulator: PipelineSimulator, steps: int,
                      *, check: bool = False, moves: Callable[[int], "LayerMove | None"] | None = None,
                      layers: LayerCosts | None = None) -> list[StepResult]:
    """Plan, run and feed back ``steps`` global steps; ``check`` validates every plan first.

    ``moves(step)``, asked after each step's plan (``ScheduledPlans.layer_move``), gives the layer move
    effective at that step, if any; the simulator re-cuts ``layers`` there before running the step.

    Where the profile's sequence lengths vary (``seq_len_sigma``), the schedule is told each step's
    micro-batch sizes, and the next step's, before it plans the step (``tell_sizes``): a data loader
    one step ahead, which a schedule that plans a step ahead (``ScheduledPlans``) needs.
    """
    results = []
    for step in range(steps):
        if simulator.profile.seq_len_sigma:
            for t in (step, step + 1) if step == 0 else (step + 1,):
                scheduler.tell_sizes(t, simulator.sequence_lengths(t, scheduler.microbatches).tolist())
        plan = scheduler.plan(step)
        if check:
            validate(plan)
        move = moves(step) if moves is not None else None
        if move is not None:
            if layers is None:
                raise ConfigError("layer moves need the model's layers: pass simulate_schedule(layers=LayerCosts(...))")
            simulator.recut(layers, move.cuts_after)
        result = simulator.run_step(plan, step)
        scheduler.observe(result.measurements)
        results.append(result)
    return results


def compare_in_simulation(profile: ClusterProfile, microbatches: int, schedules: Sequence[str], *, steps: int,
                          config: PipelineConfig | None = None, seed: int = 0, check: bool = True
                          ) -> dict[str, dict[str, Any]]:
    """Run every schedule for ``steps`` global steps on the same simulated cluster (same noise per step).

    Per schedule: per-step makespans (s), mean bubble fractions, lower bounds (s), peak activations per
    replica, memory violations, the scheduler's last decision as a dict (``last_decision.to_dict()``:
    auto's choice and reason, osprey's weights and bottlenecks; {} for a static schedule) and its plan
    for step ``steps``.
    """
    from pdml_ray.pipeline.registry import make_schedule

    out: dict[str, dict[str, Any]] = {}
    for name in schedules:
        scheduler = make_schedule(name, stages=profile.stages, replicas=profile.replicas,
                                   microbatches=microbatches, config=config)
        results = simulate_schedule(scheduler, PipelineSimulator(profile, seed), steps, check=check)
        peak = {f"s{k}r{r}": max(res.peak_memory[(k, r)] for res in results) for (k, r) in results[0].peak_memory}
        out[name] = {"makespan_s": [r.makespan_s for r in results],
                     "bubble_fraction": [r.total_bubble for r in results],
                     "bubble_per_stage": results[-1].bubble_fraction,
                     "lower_bound_s": [r.lower_bound_s for r in results],
                     "peak_memory": peak, "memory_violations": sum(r.memory_violations for r in results),
                     "decision": scheduler.last_decision.to_dict() if scheduler.last_decision is not None else {},
                     "last_plan": scheduler.plan(steps)}
    return out


def steady_state(results: dict[str, dict], from_step: int) -> dict[str, Any]:
    """Medians over steps ``from_step..`` of ``compare_in_simulation`` results: per-schedule makespan
    (s), bubble fraction and lower bound of that schedule's action set and chunks
    (``schedule_lower_bound_s``), and ``lower_bound_s``, the least of those: a bound no schedule compared beats."""
    bounds = {n: float(np.median(r["lower_bound_s"][from_step:])) for n, r in results.items()}
    return {"makespan_s": {n: float(np.median(r["makespan_s"][from_step:])) for n, r in results.items()},
            "bubble_fraction": {n: float(np.median(r["bubble_fraction"][from_step:])) for n, r in results.items()},
            "schedule_lower_bound_s": bounds, "lower_bound_s": min(bounds.values())}
