"""What a Ray Train run (``PDMLTrainer``) requires of a config beyond the config's own checks, in one
place: ``PDMLTrainer`` applies it before launching anything and ``pdml-ray validate-config`` applies
the same, so a file it calls valid does not fail at the start of a run."""

from __future__ import annotations

from pdml_ray.config.gradient import load_priority_fn
from pdml_ray.config.pdml import PDMLConfig
from pdml_ray.errors import ConfigError


def check_ray_train(config: PDMLConfig, num_workers: int | None = None, *, import_user_code: bool = True) -> None:
    """Raise ``ConfigError`` naming the field unless ``config`` can run under ``PDMLTrainer``: node
    priorities set with a global batch size (which ``num_workers`` workers, when given, can split
    within min_batch and max_batch), and, with ``import_user_code``, a ``priority_fn`` that imports
    and takes one report (importing it runs the user's module). A pipeline run (``pipeline`` set) needs
    ``pipeline_ray_train`` instead."""
    if config.pipeline is not None:
        pipeline_ray_train(config)
        return
    node = config.node
    if num_workers is None:
        node.batch  # noqa: B018 - raises when the global batch size is missing
    else:
        node.check_workers(num_workers)
    gradient = config.gradient_priority
    if import_user_code and gradient is not None and gradient.priority_fn is not None:
        load_priority_fn(gradient.priority_fn)


def pipeline_ray_train(config: PDMLConfig) -> None:
    """Raise ``ConfigError`` unless a pipeline run (``pipeline`` set) can run under ``PDMLTrainer``
    (``pdml_ray.train.pipeline``): its stages given, plans of one stage per worker, and no axis it cannot
    act on. ``PDMLTrainer`` checks that the stages divide its workers."""
    pipeline = config.pipeline
    assert pipeline is not None
    if config.node_priority is not None:
        raise ConfigError("node priorities stay off for pipeline runs under PDMLTrainer: a replica's stages step in "
                          "lockstep on the same micro-batches, so there is no per-worker batch share to act on. Leave "
                          "PDMLConfig.node_priority unset with pipeline (or unset pipeline for data parallelism with "
                          "node priorities)")
    if config.sample_priority is not None:
        raise ConfigError("sample priorities do not act in pipeline runs under PDMLTrainer (the per-sample losses are "
                          "on the last stage, the batch is read on the first): leave PDMLConfig.sample_priority unset "
                          "with pipeline")
    if config.p3 is not None:
        raise ConfigError("P3 orders DDP's gradient slices; a pipeline run averages each stage's gradients in one "
                          "flat all-reduce: leave PDMLConfig.p3 unset with pipeline")
    if pipeline.stages is None:
        raise ConfigError("a pipeline run under PDMLTrainer needs pipeline.stages: the stages per data-parallel "
                          "replica (num_workers must be a multiple of it), e.g. PipelineConfig(stages=2)")
    if pipeline.osprey.plans != "full-backward":
        raise ConfigError(f"pipeline.osprey.plans {pipeline.osprey.plans!r} lets osprey choose several chunks per rank, "
                          "but a PDMLTrainer pipeline builds one stage per worker at its start: set "
                          "pipeline.osprey.plans: full-backward")
    if pipeline.rebalance.enabled:
        raise ConfigError("layer re-balancing moves layers between the Ray-actor runtime's stage replicas; a "
                          "PDMLTrainer pipeline keeps its cut: set pipeline.rebalance.enabled: false")
