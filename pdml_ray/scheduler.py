"""The scheduler: ingests worker reports, derives priorities, publishes versioned decisions.

A plain class (no Ray): ``actors/scheduler.py`` wraps it in a named actor. Workers never wait on
it during a step: reports arrive fire-and-forget in batches, and rank 0 picks up the newest decision
asynchronously at step boundaries.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from pdml_ray.config import PDMLConfig
from pdml_ray.priority.node import NodePriorityDeriver
from pdml_ray.telemetry import NodeDecision, SamplePlan, WorkerReport

log = logging.getLogger(__name__)

# Report log rows kept for summaries: (worker, step, samples, compute_s, wait_s, step_s, overhead_s, loss)
_LOG_COLUMNS = ("worker_id", "step", "samples", "compute_s", "wait_s", "step_s", "overhead_s", "loss")


@dataclass(frozen=True, slots=True)
class StepBundle:
    """What rank 0 fetches at a decision boundary: the newest node decision (None: keep the current
    one) and, with sample priorities on, the sample plans for the steps up to the next boundary."""

    decision: NodeDecision | None
    sample_plans: tuple[SamplePlan, ...] = field(default=())


class Scheduler:
    """Central state of one training run: estimators, derivers, decisions, telemetry log."""

    def __init__(self, config: PDMLConfig, num_workers: int, max_log_rows: int = 200_000):
        self.config = config
        self.num_workers = num_workers
        self.node = NodePriorityDeriver(config.node_priority, num_workers)
        self.decisions: list[NodeDecision] = [self.node.decision]
        self.sample_priorities = None  # SamplePrioritizer, created by set_dataset_size when enabled
        self.num_samples: int | None = None
        self.reports_received = 0
        self.last_step = -1  # newest step any accepted report came from
        self.ingest_s = 0.0  # time spent inside report() (seconds): the scheduler's own cost
        self._log: deque[tuple] = deque(maxlen=max_log_rows)
        self.measurements: dict[str, float] = {}  # named one-off measurements from workers (e.g. comm_s)

    # -- inputs ------------------------------------------------------------------------------------
    def register(self, worker_id: int, accelerator_type: str) -> NodeDecision:
        """A worker announces its accelerator type; the prior decision is re-derived from it."""
        decision = self.node.set_accelerator(worker_id, accelerator_type)
        if decision is not None:
            self.decisions.append(decision)
        return self.node.decision

    def record_measurement(self, name: str, value: float) -> None:
        """Keep a named one-off measurement (a benchmark's comm_s, say) with the run's telemetry."""
        self.measurements[name] = float(value)

    def set_dataset_size(self, num_samples: int) -> None:
        """Called once by rank 0; creates the sample-priority table when sample priorities are on."""
        if self.num_samples == num_samples:
            return
        self.num_samples = num_samples
        if self.config.sample_priority is not None:
            from pdml_ray.priority.sample import SamplePrioritizer

            self.sample_priorities = SamplePrioritizer(num_samples, self.config.sample_priority,
                                                       self.config.continuity, seed=self.config.seed)

    def report(self, reports: list[WorkerReport]) -> None:
        """Ingest a batch of reports (fire-and-forget from workers) into the estimates."""
        t0 = time.perf_counter()
        last_step = -1
        indices, losses = [], []  # per-sample feedback of the whole batch, folded in with one update
        for r in reports:
            if self.node.ingest(r) is not None:
                continue
            if r.accelerator_type != self.node.accelerator_types[r.worker_id]:  # e.g. after a restart
                self.register(r.worker_id, r.accelerator_type)
            self.reports_received += 1
            last_step = max(last_step, r.step)
            self._log.append((r.worker_id, r.step, r.samples, r.compute_s, r.wait_s, r.step_s, r.overhead_s, r.loss))
            if r.sample_indices is not None:
                indices.append(r.sample_indices)
                losses.append(r.sample_losses)
        if self.sample_priorities is not None and indices:
            self.sample_priorities.update(np.concatenate(indices), np.concatenate(losses), last_step)
        self.last_step = max(self.last_step, last_step)
        self.ingest_s += time.perf_counter() - t0

    # -- outputs -----------------------------------------------------------------------------------
    def decision(self) -> NodeDecision:
        return self.node.decision

    def bundle(self, since_version: int, first_step: int, num_steps: int, batch_sizes: tuple[int, ...]) -> StepBundle:
        """A new decision (effective from ``first_step``) if the estimates call for one, else the newest
        one if newer than ``since_version``; plus sample plans for ``num_steps`` steps from
        ``first_step``, sized by the decision the caller will run with."""
        if since_version > self.node.decision.version:
            # this scheduler restarted and lost its state: continue the workers' version numbering so
            # its next decision is newer than the one they run on (the current one is not re-sent)
            self.node.decision = dataclasses.replace(self.node.decision, version=since_version)
        # Decide here, once per interval, on everything reported so far: deciding on every report
        # batch published a version per worker flush, each on partly updated estimates.
        decision = self.node.decide(first_step)
        if decision is not None:
            self.decisions.append(decision)
            log.info("%s", decision)
        newest = self.node.decision if self.node.decision.version > since_version else None
        plans: tuple[SamplePlan, ...] = ()
        if self.sample_priorities is not None:
            sizes = newest.batch_sizes if newest is not None else batch_sizes
            plans = tuple(self.sample_priorities.plans(first_step, num_steps, sizes))
        return StepBundle(newest, plans)

    def decision_history(self) -> list[dict]:
        return [d.to_dict() for d in self.decisions]

    def telemetry(self) -> dict[str, np.ndarray]:
        """The report log as columns (numpy arrays), for summaries and benchmarks."""
        rows = np.array(self._log, dtype=np.float64) if self._log else np.zeros((0, len(_LOG_COLUMNS)))
        return {name: rows[:, i] for i, name in enumerate(_LOG_COLUMNS)}

    def stats(self) -> dict:
        rates, source = self.node.rates()
        out = {"version": self.node.decision.version, "batch_sizes": list(self.node.decision.batch_sizes),
               "grad_weights": list(self.node.decision.grad_weights), "shares": list(self.node.decision.shares),
               "rates": rates.tolist(), "rate_source": source, "accelerator_types": list(self.node.accelerator_types),
               "reports_received": self.reports_received, "last_step": self.last_step, "reports_rejected": len(self.node.rejected),
               "ingest_s": self.ingest_s, "measurements": dict(self.measurements)}
        if self.sample_priorities is not None:
            out["sample_priority"] = self.sample_priorities.stats()
        return out

    # -- checkpoint --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"node": self.node.state_dict(), "decisions": [d.to_dict() for d in self.decisions],
                 "num_samples": self.num_samples}
        if self.sample_priorities is not None:
            state["sample_priority"] = self.sample_priorities.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.node.load_state_dict(state["node"])
        self.decisions = [NodeDecision.from_dict(d) for d in state["decisions"]]
        if state.get("num_samples") is not None:
            self.set_dataset_size(state["num_samples"])
            if self.sample_priorities is not None and "sample_priority" in state:
                self.sample_priorities.load_state_dict(state["sample_priority"])
