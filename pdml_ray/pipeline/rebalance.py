"""Layer re-balancing: when one stage stays slower than the others, move layers off it to its neighbours.

A policy of the pipeline axis (``pdml_ray.priority.pipeline``), fed the action latencies every step
already sends there. Its decision is data, a ``LayerMove`` (the cuts before and after, effective at a
step boundary), carried in that step's ``MicroBatchPlan`` like every other decision (history, replay,
snapshots); the simulator (``simulate_schedule``'s ``moves``) and the Ray-actor runtime
(``PipelineRuntime``, which moves the layers' parameters and optimizer state) carry it out.

Model. ``stage_seconds`` turns a step's latencies into each stage's seconds per micro-batch with its
replicas working together (1 / sum over replicas of 1 / each replica's mean F + B per micro-batch; a
plan of two chunks per rank counts on its ranks).
Each layer has a relative cost (parameter counts in the runtime, the scenario's in the simulator); a
stage of summed cost W_k measured at T_k s runs c_k = T_k / W_k seconds per unit of cost on its devices,
and after a move it is predicted to take c_k x its new W_k.

Rule (hysteresis three ways, so that layers do not move back and forth on noise):
* a step is imbalanced when its slowest stage takes more than ``threshold`` x the mean of the others;
* only after ``window`` consecutive measured steps are imbalanced is a move considered (one slow step
  moves nothing), on those steps' mean stage times, which must be imbalanced too;
* the new cuts minimise the predicted slowest stage, then the sum of squared stage times
  (``partition.balanced_cuts`` with each stage's seconds per unit of cost), each cut staying within
  the two stages beside it: a layer moves at most one stage, from the slow stage to its neighbours
  (and on from those only where that levels further). The move is made only if it cuts the
  pipeline's predicted slowest stage by at least ``min_gain``;
* steps measured on the old cuts are ignored after a move, so the next one rests on a full window
  measured on the new cuts (a stage that recovers gets its layers back the same way, once its
  neighbours in turn stay slower).

Pure: no Ray, no clocks; the same observations give the same moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdml_ray.config.pipeline import RebalanceConfig
from pdml_ray.errors import PlanError, StateError
from pdml_ray.pipeline.partition import balanced_cuts, stage_bounds

MIN_LAYER_COST = 1e-3
"""Floor on a layer's relative cost, as a fraction of the mean: a parameter-free layer (ReLU) still
takes time, and a stage of only such layers needs a cost per unit to be predicted at all."""


@dataclass(frozen=True, slots=True)
class LayerTransfer:
    """Layers ``[start, stop)`` of the model go from stage ``source`` to its neighbour ``target``."""

    start: int
    stop: int
    source: int
    target: int


@dataclass(frozen=True, slots=True)
class LayerMove:
    """Move layers between neighbouring stages: from step ``effective_step`` on, the stages are cut at
    ``cuts_after`` (first layer of stages 1..S-1, as ``partition.split_sequential``) instead of ``cuts_before``."""

    effective_step: int
    stage: int
    """The slow stage the layers move off."""
    cuts_before: tuple[int, ...]
    cuts_after: tuple[int, ...]
    num_layers: int
    stage_s_before: tuple[float, ...]
    """Measured seconds per micro-batch per stage (means over the window) that the move rests on."""
    stage_s_after: tuple[float, ...]
    """Predicted seconds per micro-batch per stage on the new cuts."""

    def __post_init__(self) -> None:
        stage_bounds(self.num_layers, self.cuts_before)
        stage_bounds(self.num_layers, self.cuts_after)
        S = len(self.cuts_before) + 1
        if len(self.cuts_after) != S - 1 or not 0 <= self.stage < S or self.effective_step < 0:
            raise PlanError(f"layer move: cuts {list(self.cuts_before)} -> {list(self.cuts_after)} of stage "
                            f"{self.stage} at step {self.effective_step} must keep the stage count and name one of its "
                            "stages at a step >= 0")
        edges = (0, *self.cuts_before, self.num_layers)
        for i, (a, b) in enumerate(zip(self.cuts_before, self.cuts_after)):
            # Each layer moves at most one stage: cut i may only shift within stages i and i + 1.
            if not edges[i] <= b <= edges[i + 2]:
                raise PlanError(f"layer move: cut {i} from {a} to {b} would move layers past a neighbouring stage; "
                                f"keep it within [{edges[i]}, {edges[i + 2]}]")

    def transfers(self) -> list[LayerTransfer]:
        """What moves where: for each cut that shifts, the layers between its old and new place."""
        out = []
        for i, (a, b) in enumerate(zip(self.cuts_before, self.cuts_after)):
            if b > a:  # the front of stage i + 1 joins the back of stage i
                out.append(LayerTransfer(a, b, i + 1, i))
            elif b < a:  # the back of stage i joins the front of stage i + 1
                out.append(LayerTransfer(b, a, i, i + 1))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"effective_step": self.effective_step, "stage": self.stage, "cuts_before": list(self.cuts_before),
                "cuts_after": list(self.cuts_after), "num_layers": self.num_layers,
                "stage_s_before": list(self.stage_s_before), "stage_s_after": list(self.stage_s_after)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LayerMove":
        """The move ``to_dict`` wrote, checked again (PlanError)."""
        keys = ("effective_step", "stage", "cuts_before", "cuts_after", "num_layers", "stage_s_before", "stage_s_after")
        if not isinstance(data, dict) or set(data) != set(keys):
            raise PlanError(f"a layer move must be a mapping of exactly {list(keys)}, as LayerMove.to_dict writes it")
        try:
            return cls(effective_step=int(data["effective_step"]), stage=int(data["stage"]),
                       cuts_before=tuple(int(c) for c in data["cuts_before"]),
                       cuts_after=tuple(int(c) for c in data["cuts_after"]), num_layers=int(data["num_layers"]),
                       stage_s_before=tuple(float(s) for s in data["stage_s_before"]),
                       stage_s_after=tuple(float(s) for s in data["stage_s_after"]))
        except (TypeError, ValueError) as e:
            raise PlanError(f"a layer move's fields must be integers and lists of numbers: {e}") from None


def stage_seconds(rows: Sequence[tuple[int, int, str, int, float]], stages: int,
                  stage_rank: Sequence[int] | None = None) -> tuple[float, ...] | None:
    """Seconds per micro-batch of each stage in one step, its replicas together, from the step's latency
    rows (stage, replica, kind, micro-batch, seconds): 1 / sum_r 1 / t_r, t_r being replica r's busy
    seconds (F, B, I and W) per micro-batch it ran forward. A plan of virtual stages (two chunks per rank)
    names its ranks in ``stage_rank``; its chunks' rows add up on their rank. None when a stage has no
    forward in the rows, or the rows name virtual stages and ``stage_rank`` does not map them."""
    chunks = len(stage_rank) // stages if stage_rank is not None else 1
    busy: dict[tuple[int, int], float] = {}
    forwards: dict[tuple[int, int], float] = {}
    for k, r, kind, _, seconds in rows:
        if stage_rank is not None and k < len(stage_rank):
            k = stage_rank[k]
        elif k >= stages:
            return None
        busy[(k, r)] = busy.get((k, r), 0.0) + seconds
        if kind == "F":  # a micro-batch runs one forward per chunk on its rank
            forwards[(k, r)] = forwards.get((k, r), 0.0) + 1.0 / chunks
    out = []
    for k in range(stages):
        rates = [forwards[key] / busy[key] for key in forwards if key[0] == k and busy[key] > 0]
        if not rates:
            return None
        out.append(1.0 / sum(rates))
    return tuple(out)


class Rebalancer:
    """The re-balancing policy over one pipeline's layers: ``observe`` each step, ``decide`` at a boundary."""

    def __init__(self, config: RebalanceConfig, *, layer_costs: Sequence[float], cuts: Sequence[int]) -> None:
        costs = [float(c) for c in layer_costs]
        if not costs or min(costs) < 0 or not all(c < float("inf") for c in costs):
            raise PlanError(f"layer costs must be finite numbers >= 0, one per layer, got {costs[:8]}")
        stage_bounds(len(costs), list(cuts))
        floor = MIN_LAYER_COST * (sum(costs) / len(costs) or 1.0)
        self.config = config
        self.layer_costs = tuple(max(c, floor) for c in costs)
        self.cuts = tuple(int(c) for c in cuts)
        self.stages = len(self.cuts) + 1
        self.since_step = 0
        """First step measured on the current cuts: earlier steps' latencies are ignored."""
        self.streak: list[tuple[float, ...]] = []
        """Stage seconds of the latest consecutive imbalanced steps (at most ``window``)."""
        self.moves = 0

    def observe(self, step: int, stage_s: Sequence[float] | None) -> None:
        """One step's seconds per micro-batch per stage (``stage_seconds``; None: nothing learnt)."""
        if stage_s is None or step < self.since_step:
            return
        if len(stage_s) != self.stages:
            raise PlanError(f"stage seconds for {len(stage_s)} stages, the pipeline has {self.stages}")
        times = tuple(float(t) for t in stage_s)
        self.streak = (self.streak + [times])[-self.config.window:] if self._imbalanced(times) else []

    def decide(self, step: int) -> LayerMove | None:
        """A move effective at step ``step``, or None (no persistent imbalance, or no move that pays)."""
        if len(self.streak) < self.config.window:
            return None
        mean = tuple(sum(s[k] for s in self.streak) / len(self.streak) for k in range(self.stages))
        if not self._imbalanced(mean):
            return None
        n, costs = len(self.layer_costs), self._stage_costs(self.cuts)
        edges = (0, *self.cuts, n)
        cuts = balanced_cuts(self.layer_costs, self.stages, rates=[max(t / w, 1e-12) for t, w in zip(mean, costs)],
                             cut_ranges=[(edges[i], edges[i + 2]) for i in range(self.stages - 1)])
        predicted = self.predict(mean, cuts)
        if cuts == self.cuts or max(predicted) > (1.0 - self.config.min_gain) * max(mean):
            return None
        move = LayerMove(effective_step=step, stage=_slowest(mean), cuts_before=self.cuts, cuts_after=cuts,
                         num_layers=len(self.layer_costs), stage_s_before=mean, stage_s_after=predicted)
        self.cuts, self.since_step, self.streak = cuts, step, []
        self.moves += 1
        return move

    def predict(self, stage_s: Sequence[float], cuts: Sequence[int]) -> tuple[float, ...]:
        """Seconds per micro-batch per stage on ``cuts``, from ``stage_s`` measured on the current cuts."""
        now, new = self._stage_costs(self.cuts), self._stage_costs(cuts)
        return tuple(t / w * n for t, w, n in zip(stage_s, now, new))

    def _imbalanced(self, times: Sequence[float]) -> bool:
        slow = _slowest(times)
        return self.stages > 1 and times[slow] > self.config.threshold * _mean_of_others(times, slow)

    def _stage_costs(self, cuts: Sequence[int]) -> list[float]:
        return [sum(self.layer_costs[a:b]) for a, b in stage_bounds(len(self.layer_costs), list(cuts))]

    def state_dict(self) -> dict[str, Any]:
        return {"cuts": list(self.cuts), "since_step": self.since_step, "streak": [list(s) for s in self.streak],
                "moves": self.moves}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or set(state) != {"cuts", "since_step", "streak", "moves"}:
            raise StateError("saved re-balancing state must hold cuts, since_step, streak and moves, as "
                             "Rebalancer.state_dict() writes it")
        try:
            cuts = tuple(int(c) for c in state["cuts"])
            stage_bounds(len(self.layer_costs), list(cuts))
            streak = [tuple(float(t) for t in s) for s in state["streak"]]
        except (TypeError, ValueError, PlanError) as e:
            raise StateError(f"saved re-balancing state does not fit this pipeline's layers: {e}") from None
        if len(cuts) != self.stages - 1 or any(len(s) != self.stages for s in streak):
            raise StateError(f"saved re-balancing state is for another stage count than {self.stages}")
        self.cuts, self.since_step = cuts, int(state["since_step"])
        self.streak, self.moves = streak, int(state["moves"])


def _slowest(times: Sequence[float]) -> int:
    return max(range(len(times)), key=lambda k: times[k])


def _mean_of_others(times: Sequence[float], k: int) -> float:
    return (sum(times) - times[k]) / (len(times) - 1)
