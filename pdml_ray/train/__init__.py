"""Ray Train integration: ``PDMLTrainer`` and the in-loop context (``get_context``).

``PDMLTrainer`` (and with it Ray) is imported on first use, so the worker-side pieces
(``pdml_ray.train.context``, ``step``, ``wrappers``, ``timing``) import without Ray.

The modules:

    trainer.py         ``PDMLTrainer``, Ray Train's ``TorchTrainer`` plus the run's scheduler actor
    context.py         the in-loop context: steps, batch sampler, decisions, checkpoints (Ray-free)
    installed_context.py the context a worker's loop runs with (``get_context``, ``get_pipeline_context``)
    saved_state.py     pdml-ray's state in a data-parallel run's checkpoint: the file, what it holds, its checks
    boundary_reports.py  report_via="boundary": the group's reports gathered to rank 0 at each decision boundary
    boundary_spacing.py  decision_interval_min_s: how many decision intervals to the next boundary, from the step time
    step.py            the step block (``ctx.step``) and the batch it trains (``StepBatch``)
    nonfinite.py       the non-finite guard's rule, counts (``ctx.nonfinite``) and fused gradient check
    wrappers.py        gradient weights ``b_i / B`` through DDP's hook or FSDP2's loss scale
    timing.py          a step's compute time, measured without waiting on a collective
    ray_data.py        Ray Data input: materialised datasets read by row position at each worker's batch size (``ctx.iter_torch_batches``)
    result_metrics.py  pdml-ray's figures in ``Result.metrics``
    p3_sync.py         P3's send order for all-reduce users in Ray Train
    pipeline.py        pipeline x data parallelism in a Ray Train loop: torch's pipeline runtime per replica, gradients averaged per stage
    pipeline_latency.py per-action latencies of a rank's stages on torch's pipeline runtime, for osprey and auto
    pipeline_layout.py pipeline x data-parallel ranks: rank r is stage r % S of replica r // S, and their groups
    irreducible.py     RHO-LOSS's irreducible-loss model: a holdout or cross-fitted folds, its per-sample losses and their cost
    workloads.py       small real workloads on generated data (demo, benchmarks, tests)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdml_ray.train.context import PDMLContext, StepBatch
from pdml_ray.train.installed_context import get_context, get_pipeline_context
from pdml_ray.train.irreducible import carve_holdout, fit_crossfit_irreducible_losses, fit_irreducible_losses
from pdml_ray.train.pipeline import PipelineContext
from pdml_ray.train.workloads import classification_loop

if TYPE_CHECKING:
    from pdml_ray.train.trainer import PDMLRunInfo, PDMLTrainer

__all__ = ["PDMLContext", "PDMLRunInfo", "PDMLTrainer", "PipelineContext", "StepBatch", "carve_holdout",
           "classification_loop", "fit_crossfit_irreducible_losses", "fit_irreducible_losses", "get_context",
           "get_pipeline_context"]


def __getattr__(name: str) -> Any:
    if name in ("PDMLTrainer", "PDMLRunInfo"):
        from pdml_ray.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'pdml_ray.train' has no attribute {name!r}")
