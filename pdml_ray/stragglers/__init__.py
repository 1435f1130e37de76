"""Straggler-tolerant data parallelism: do not wait for every worker.

A collective all-reduce waits for every rank; here worker actors compute gradients of data
partitions, and an aggregator combines whatever a policy says is enough. Pure core (no Ray):

    coding.py         FR and CR gradient codes (Tandon et al. 2017): encoding matrices, decoding vectors
                      per arrived set, codes accepted by their float32 error bound
    delays.py         seeded straggler models (fixed, shifted-exp, pareto, correlated, death), labelled
    policy.py         the policy seam: WorkerTask -> Arrival -> ready? -> Combination (decisions as data)
    policies/         one module per policy: sync, ignore_stragglers, backup, gc (gc-fr, gc-cr),
                      pgc (pgc-fr, pgc-cr: pipelined gradient coding), topk, async_updates
    registry.py       POLICIES: name -> "module:Class"; make_policy(name, workers=n, stragglers=s)
    gradient_feed.py  GradientFeed: the topk/async rule from the scheduler's gradient axis, over
                      SchedulerClient (the run's actor, or an in-process scheduler)
    worker.py         a worker's logic: partition gradients, latest versions, coded message, cancellable
                      EMULATED compute time
    simulate.py       the same loop on a simulated clock (unit tests, no Ray)
    run.py            StepRecord / RunResult and the figures the benchmark reports
    stats.py          the runtime's stats record (``pdml_straggler_*`` series)
    problem.py        the convex test problem (L2-regularised logistic regression on generated data)

The Ray shells: ``pdml_ray.actors.gradient_worker`` (worker actor) and ``pdml_ray.runtime.stragglers``
(the aggregator's loop); the benchmark: ``pdml-ray bench stragglers``. Gradient target everywhere:
the mean over the data partitions of the partition gradients (the full-batch gradient).
"""

from pdml_ray.stragglers.delays import (Correlated, Death, FixedSlowdown, NoStragglers, Pareto, ShiftedExponential,
                                        StragglerModel, make_straggler_model)
from pdml_ray.stragglers.policies.async_updates import AsyncPolicy
from pdml_ray.stragglers.policies.topk import TopKPolicy
from pdml_ray.stragglers.policy import Arrival, Combination, PartitionTerm, StragglerPolicy, WorkerTask
from pdml_ray.stragglers.problem import logistic_data, logistic_loss, logistic_model
from pdml_ray.stragglers.registry import POLICIES, make_policy

__all__ = ["POLICIES", "Arrival", "AsyncPolicy", "Combination", "Correlated", "Death", "FixedSlowdown",
           "NoStragglers", "Pareto", "PartitionTerm", "ShiftedExponential", "StragglerModel", "StragglerPolicy",
           "TopKPolicy", "WorkerTask", "logistic_data", "logistic_loss", "logistic_model", "make_policy",
           "make_straggler_model"]
