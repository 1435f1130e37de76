"""pdml-ray's figures in Ray Train's reported metrics: what ``ctx.report`` adds to the user's metrics
(so they reach ``Result.metrics`` and the user's callbacks), one worker's view.

``pdml_metrics(ctx)`` gives them, under keys prefixed ``pdml/``, units in the names as in the
exported metrics:

- this worker: ``pdml/batch_size_samples``, ``pdml/grad_weight_ratio`` and
  ``pdml/node_priority_ratio`` of the decision in force, ``pdml/decision_version`` (node: the
  newest adopted, which may not be in force yet), ``pdml/global_step``; when a decision is adopted
  but waits for its effective step (``lead_steps`` with a batch sampler), the newest such one's
  ``pdml/pending_batch_size_samples``, ``pdml/pending_decision_version`` and
  ``pdml/pending_effective_step``; of its newest timed step ``pdml/step_seconds``,
  ``pdml/step_compute_seconds``, ``pdml/step_wait_seconds`` and ``pdml/rate_samples_per_second``
  (samples / compute); ``pdml/overhead_seconds_total`` (its pdml-ray bookkeeping),
  ``pdml/stale_bundles_total``, and the non-finite guard's ``pdml/nonfinite_excluded_steps_total``
  (this worker's) and ``pdml/nonfinite_dropped_steps_total``;
- rank 0 only, from one call to the scheduler (left out when it does not answer within 5 s):
  ``pdml/reports_received_total``, ``pdml/reports_rejected_total``,
  ``pdml/scheduler_decide_errors_total``, ``pdml/scheduler_decision_requests_total``,
  ``pdml/scheduler_decision_seconds_total`` and ``pdml/decision_version/<axis>`` for every axis.

A figure not known yet (no step timed) is left out; values are plain floats.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pdml_ray.client import SchedulerClient
from pdml_ray.decisions import NodeDecision, WorkerReport
from pdml_ray.errors import PDMLError
from pdml_ray.train.nonfinite import NonFiniteCounts

log = logging.getLogger(__name__)


class MetricsSource(Protocol):
    """What these figures read of a worker's context (``PDMLContext`` is the one implementation)."""

    rank: int
    decision: NodeDecision
    _upcoming: list[NodeDecision]
    versions: dict[str, int]
    global_step: int
    overhead_s: float
    stale_bundles: int
    nonfinite: NonFiniteCounts
    client: SchedulerClient | None
    _last_report: WorkerReport | None

    @property
    def _untimed(self) -> Mapping[int, Any]:
        """Finished steps whose compute time is not known yet, by step (each with ``batch``, ``wait_s``, ``step_s``)."""


def pdml_metrics(ctx: MetricsSource) -> dict[str, float]:
    """The figures of the module docstring for worker ``ctx.rank`` now."""
    rank, d = ctx.rank, ctx.decision
    out: dict[str, float] = {
        "pdml/batch_size_samples": float(d.batch_sizes[rank]), "pdml/grad_weight_ratio": float(d.grad_weights[rank]),
        "pdml/node_priority_ratio": float(d.shares[rank]),
        "pdml/decision_version": float(ctx.versions.get("node", d.version)),
        "pdml/global_step": float(ctx.global_step), "pdml/overhead_seconds_total": float(ctx.overhead_s),
        "pdml/stale_bundles_total": float(ctx.stale_bundles),
        "pdml/nonfinite_excluded_steps_total": float(ctx.nonfinite.excluded[rank]),
        "pdml/nonfinite_dropped_steps_total": float(ctx.nonfinite.dropped_steps)}
    if ctx._upcoming:  # adopted by every rank, in force from its effective step
        pending = ctx._upcoming[-1]
        out.update({"pdml/pending_batch_size_samples": float(pending.batch_sizes[rank]),
                    "pdml/pending_decision_version": float(pending.version),
                    "pdml/pending_effective_step": float(pending.effective_step)})
    last = ctx._last_report  # the newest timed step's report (sent at a boundary or still buffered)
    if last is not None:
        out["pdml/step_compute_seconds"] = float(last.compute_s)
        if last.compute_s > 0:
            out["pdml/rate_samples_per_second"] = last.samples / last.compute_s
    untimed = ctx._untimed[max(ctx._untimed)] if ctx._untimed else None  # newer, compute not known yet
    newest = untimed if untimed is not None and (last is None or untimed.batch.step > last.step) else last
    if newest is not None:
        out["pdml/step_wait_seconds"] = float(newest.wait_s)
        if math.isfinite(newest.step_s):
            out["pdml/step_seconds"] = float(newest.step_s)
    if ctx.rank == 0 and ctx.client is not None and ctx.client.available:
        try:
            stats = ctx.client.call("stats", timeout_s=5.0)
        except PDMLError as e:  # the scheduler is slow, dead or restarting: report without its figures
            log.debug("ctx.report: no scheduler figures (%s)", e)
        else:
            out.update({"pdml/reports_received_total": float(stats.reports_received),
                        "pdml/reports_rejected_total": float(stats.reports_rejected),
                        "pdml/scheduler_decide_errors_total": float(stats.decide_errors),
                        "pdml/scheduler_decision_requests_total": float(stats.decision_requests),
                        "pdml/scheduler_decision_seconds_total": float(stats.decision_s)})
            out.update({f"pdml/decision_version/{axis}": float(v) for axis, v in stats.versions.items()})
    return out


def in_force_and_pending(history: Sequence[Mapping[str, Any]],
                         step: int) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """The scheduler's view of the node decisions at ``step`` (its newest reported step), from its history
    (``decision_history``, oldest first): the one in force there, and the newest one published for a later
    step, pending (None when there is none).

    The newest decision is not always in force: one takes effect at its ``effective_step`` (``lead_steps``
    after the boundary that adopts it), and one whose bundle reached rank 0 after that step is dropped by
    the workers and re-issued by the scheduler, the same batch sizes under the next version for a later
    step: a decision so superseded never took effect and is skipped here."""
    def reissue(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        return (list(a["batch_sizes"]) == list(b["batch_sizes"]) and b["version"] == a["version"] + 1
                and b["effective_step"] > a["effective_step"])

    live = [d for d, nxt in zip(history, [*history[1:], None]) if nxt is None or not reissue(d, nxt)]
    in_force = next((d for d in reversed(live) if d["effective_step"] <= step), None)
    pending = next((d for d in reversed(live) if d["effective_step"] > step), None)
    return in_force, pending


def describe_decision(decision: Mapping[str, Any] | None) -> str:
    """One node decision in a line: version, effective step and batch sizes."""
    if decision is None:
        return "none"
    return f"v{decision['version']} from step {decision['effective_step']}: batch sizes {list(decision['batch_sizes'])}"
