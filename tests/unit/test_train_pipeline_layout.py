"""Pipeline x data-parallel ranks: rank r is stage r % S of replica r // S, and the two kinds of groups."""

from __future__ import annotations

import pytest

from pdml_ray.errors import ConfigError
from pdml_ray.train.pipeline_layout import PipelineLayout


def test_ranks_are_stages_of_consecutive_replicas() -> None:
    layout = PipelineLayout.build(6, 3)
    assert layout.replicas == 2
    assert [(layout.stage_of(r), layout.replica_of(r)) for r in range(6)] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert layout.replica_groups() == [[0, 1, 2], [3, 4, 5]]
    assert layout.stage_groups() == [[0, 3], [1, 4], [2, 5]]
    assert all(layout.rank_at(layout.stage_of(r), layout.replica_of(r)) == r for r in range(6))


def test_every_rank_is_in_exactly_one_group_of_each_kind() -> None:
    layout = PipelineLayout.build(8, 2)
    for groups in (layout.replica_groups(), layout.stage_groups()):
        assert sorted(r for g in groups for r in g) == list(range(8))
    assert layout.stage_groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert PipelineLayout.build(4, 4).stage_groups() == [[0], [1], [2], [3]]  # one replica: no data parallel
    assert PipelineLayout.build(4, 1).replica_groups() == [[0], [1], [2], [3]]  # one stage: plain data parallel


@pytest.mark.parametrize("world, stages", [(6, 4), (3, 2), (2, 0), (4, True)])
def test_stages_that_do_not_divide_the_workers_are_refused_naming_both(world: int, stages: int) -> None:
    with pytest.raises(ConfigError, match=rf"pipeline.stages={stages!r} must divide .*num_workers={world}\)"):
        PipelineLayout.build(world, stages)


def test_a_rank_outside_the_run_is_refused() -> None:
    with pytest.raises(ConfigError, match="outside this run's 4 workers"):
        PipelineLayout.build(4, 2).stage_of(4)
