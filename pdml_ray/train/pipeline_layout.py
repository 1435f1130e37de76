"""Pipeline x data-parallel ranks of a ``PDMLTrainer`` run: which stage and replica each rank is.

``W`` ranks run ``S`` pipeline stages (``PipelineConfig.stages``) times ``D = W / S`` data-parallel
replicas. Rank ``r`` is stage ``r % S`` of replica ``r // S``: a replica's stages are consecutive
ranks, which Ray Train places on the same node first, so the stage-to-stage transfers (every
micro-batch, both directions) stay local where they can and only the per-step gradient all-reduce
of a stage (one flat bucket) crosses nodes.

Two kinds of process groups follow: one per replica over its ``S`` stages (torch's pipeline runtime
sends activations and gradients within it) and one per stage over its ``D`` replicas (that stage's
gradients are averaged over it). Pure: no torch.distributed, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdml_ray.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PipelineLayout:
    """Where every rank of ``world_size`` sits in ``stages`` stages x ``replicas`` data-parallel replicas."""

    world_size: int
    stages: int
    replicas: int

    @classmethod
    def build(cls, world_size: int, stages: int) -> "PipelineLayout":
        """The layout of ``world_size`` ranks into pipelines of ``stages`` stages; ConfigError naming both
        unless ``stages`` divides ``world_size``."""
        ok = all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (world_size, stages))
        if not ok or world_size % stages:
            raise ConfigError(f"pipeline.stages={stages!r} must divide the number of workers "
                              f"(ScalingConfig(num_workers={world_size!r})): every data-parallel replica runs the whole "
                              f"pipeline, one stage per worker. Give num_workers a multiple of pipeline.stages, e.g. "
                              f"{stages if isinstance(stages, int) and stages >= 1 else 2} x replicas")
        return cls(world_size=world_size, stages=stages, replicas=world_size // stages)

    def stage_of(self, rank: int) -> int:
        """The pipeline stage rank ``rank`` runs."""
        return self._check(rank) % self.stages

    def replica_of(self, rank: int) -> int:
        """The data-parallel replica rank ``rank`` belongs to."""
        return self._check(rank) // self.stages

    def rank_at(self, stage: int, replica: int) -> int:
        """The rank that runs ``stage`` of ``replica``."""
        if not (0 <= stage < self.stages and 0 <= replica < self.replicas):
            raise ConfigError(f"stage {stage} of replica {replica} is outside {self.stages} stages x {self.replicas} "
                              "replicas")
        return replica * self.stages + stage

    def replica_groups(self) -> list[list[int]]:
        """Per replica, its ranks in stage order: the process group its pipeline runs over."""
        return [[self.rank_at(s, d) for s in range(self.stages)] for d in range(self.replicas)]

    def stage_groups(self) -> list[list[int]]:
        """Per stage, its ranks in replica order: the process group its gradients are averaged over."""
        return [[self.rank_at(s, d) for d in range(self.replicas)] for s in range(self.stages)]

    def _check(self, rank: int) -> int:
        if not (isinstance(rank, int) and 0 <= rank < self.world_size):
            raise ConfigError(f"rank {rank!r} is outside this run's {self.world_size} workers")
        return rank
