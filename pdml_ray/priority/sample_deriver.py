"""Sample priorities as the scheduler's "sample" deriver, around one ``SamplePrioritizer`` table.

Wiring: ``SamplePriorityDeriver`` is the scheduler's "sample" deriver around one table. At each
decision boundary it hands out ``plans(first_step, k, batch_sizes)`` sized by the node decision:
worker i gets ``indices[i]`` and ``weights[i]`` (loss_i = mean(weights[i] * per_sample_loss), or the
self-normalised sum(w l) / sum(w)); workers report ``WorkerReport.sample_indices/sample_losses``,
which go to ``update(indices, losses, step)``; ``state_dict()`` goes into the checkpoint.

Under ``mode='rho-loss'`` the axis observes one thing besides reports: every sample's irreducible loss,
``Scheduler.observe("sample", step, [("irreducible", losses)])`` (``PDMLContext.set_irreducible_losses``
sends it; an input like any other, so a replay log holds it). They may come before rank 0 says the data
set size; the table takes them when it is made, and its checkpoint keeps them.

The table itself (scores, draws, continuity, checkpoints) is in ``pdml_ray.priority.sample``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import Boundary, Decision, NodeDecision, Rejection, SampleDecision, WorkerReport
from pdml_ray.priority.base import Deriver
from pdml_ray.priority.sample import SamplePrioritizer
from pdml_ray.priority.sample_modes import irreducible_problem, mode_rule
from pdml_ray.priority.sample_stats import SampleStats

log = logging.getLogger(__name__)
_IRREDUCIBLE = "irreducible"  # the one observation this axis takes


class SamplePriorityDeriver(Deriver):
    """The scheduler's "sample" deriver: one ``SamplePrioritizer`` table, created when rank 0 says the
    data set size; plans for each decision interval sized by the node decision in force."""

    name = "sample"
    keep_history = False  # each decision holds a whole interval's plans: too large to keep them all

    def __init__(self, config: PDMLConfig, num_workers: int) -> None:
        super().__init__(config, num_workers)
        self.table: SamplePrioritizer | None = None
        self._pending: np.ndarray | None = None  # rho-loss: irreducible losses observed before the table exists
        self._warned_plain = False

    def on_dataset(self, num_samples: int) -> None:
        if self.table is None or self.table.num_samples != num_samples:
            assert self.config.sample_priority is not None  # the registry builds this deriver only when enabled
            self.table = SamplePrioritizer(num_samples, self.config.sample_priority, self.config.continuity,
                                           seed=self.config.seed)
            pending, self._pending = self._pending, None
            if pending is not None and pending.size != num_samples:  # sent for another data set: not used
                log.error("sample axis: %d irreducible losses for a data set of %d samples; not used",
                          pending.size, num_samples)
            elif pending is not None:
                self.table.set_irreducible_losses(np.arange(num_samples), pending)

    def observation_rejection(self, rows: object) -> Rejection | None:
        """The sample axis observes ``[("irreducible", losses)]`` under rho-loss: one finite loss >= 0 per
        sample (as many as the data set once its size is known)."""
        assert self.config.sample_priority is not None
        mode = self.config.sample_priority.mode
        if not mode_rule(mode).reducible:
            return Rejection("axis", f"irreducible losses need sample_priority.mode='rho-loss'; this run's is {mode!r}")
        if not (isinstance(rows, (list, tuple)) and len(rows) == 1 and isinstance(rows[0], (list, tuple))
                and len(rows[0]) == 2 and rows[0][0] == _IRREDUCIBLE):
            return Rejection("axis", f"the sample axis observes [({_IRREDUCIBLE!r}, losses)], got {type(rows).__name__}")
        problem = irreducible_problem(rows[0][1], self.table.num_samples if self.table is not None else None)
        return Rejection("axis", problem) if problem is not None else None

    def observe(self, step: int, rows: Sequence[Any]) -> None:
        losses = np.asarray(rows[0][1], dtype=np.float64)
        if self.table is None:
            self._pending = losses.copy()
        else:
            self.table.set_irreducible_losses(np.arange(self.table.num_samples), losses)

    def report_rejection(self, report: WorkerReport) -> Rejection | None:
        """The table's own check of one report's per-sample feedback (the scheduler calls it before any
        deriver ingests the report, so a refused report is counted and never half-applied)."""
        if self.table is None or report.sample_indices is None or report.sample_losses is None:
            return None
        problem = self.table.feedback_problem(np.asarray(report.sample_indices, dtype=np.int64).ravel(),
                                              np.asarray(report.sample_losses, dtype=np.float64).ravel())
        if problem is None:
            return None
        return Rejection("sample_losses", f"worker {report.worker_id} step {report.step}: {problem}")

    def ingest(self, reports: Sequence[WorkerReport]) -> None:
        """All per-sample losses of a report batch go into the table in one update."""
        if self.table is None or not reports:
            return
        step_s = [r.step_s for r in reports if r.step_s > 0]  # NaN: not measured (fails the test)
        if step_s:  # the pay switch's cost reference: selection seconds per step against a step
            self.table.note_step_seconds(float(np.mean(step_s)))
        feedback = [r for r in reports if r.sample_indices is not None]
        if feedback:
            last_step = max(r.step for r in reports)
            self.table.update(np.concatenate([r.sample_indices for r in feedback]),
                              np.concatenate([r.sample_losses for r in feedback]), last_step)

    def decide(self, boundary: Boundary, earlier: Mapping[str, Decision]) -> SampleDecision | None:
        if self.table is None:
            return None
        if self.table.irreducible is not None and not self._warned_plain:
            self._warned_plain = True  # once, at the first plan (a restored table has its own from the checkpoint)
            if not self.table.irreducible.any():
                log.warning("sample_priority.mode='rho-loss' without irreducible losses ranks samples by their plain "
                            "loss; send them with ctx.set_irreducible_losses(losses)")
        node = earlier.get("node")
        sizes = node.batch_sizes if isinstance(node, NodeDecision) else boundary.batch_sizes
        plans = self.table.plans(boundary.first_step, boundary.num_steps, sizes)
        return SampleDecision(version=0, effective_step=0, plans=tuple(plans))

    def stats(self) -> SampleStats | None:
        return self.table.stats() if self.table is not None else None

    def state_dict(self) -> dict[str, Any]:
        return {"table": self.table.state_dict() if self.table is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        table = state.get("table")
        if table is not None:
            self.on_dataset(int(table["num_samples"]))
            assert self.table is not None
            self.table.load_state_dict(table)
