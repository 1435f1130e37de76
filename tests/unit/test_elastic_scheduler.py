"""An elastic run resizes its scheduler (Scheduler.resize, no Ray): the node axis starts over for the
new worker count from the accelerator prior, its version numbering continuing; newcomers register; the
first boundary after the resize re-derives the shares from the types they registered; the history
holds only decisions of the new count, so the state saves and loads; a model's batch floor survives."""

import pytest

from pdml_ray.config import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.decisions import Boundary
from pdml_ray.errors import ConfigError, ReportError
from pdml_ray.priority.node import NodePriorityDeriver
from pdml_ray.scheduler import Scheduler

B = 64


def _scheduler(**node) -> Scheduler:
    return Scheduler(PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=B, **node)), 2)


def test_a_resize_starts_the_node_axis_over_from_the_prior_for_the_new_count():
    s = _scheduler()
    for w in (0, 1):
        s.register(w, "A100")
    s.bundle(Boundary(0, 4, (32, 32)), {"node": 0})
    with pytest.raises(ReportError, match="unknown worker 2"):
        s.register(2, "H100")
    before = s.versions["node"]
    s.resize(3)
    assert s.num_workers == 3 and s.versions["node"] == before + 1
    assert len(s.decision().batch_sizes) == 3 and sum(s.decision().batch_sizes) == B
    for w, accel in enumerate(("A100", "A100", "H100")):  # every worker of the new group registers
        s.register(w, accel)
    bundle = s.bundle(Boundary(8, 4, (22, 21, 21)), {"node": before})
    node = bundle.decisions["node"]
    prior = NodePriorityDeriver(s.config, 3, ["A100", "A100", "H100"]).initial()  # the prior's split for them
    assert node.batch_sizes == prior.batch_sizes and node.batch_sizes[2] > B // 2  # the newcomer's H100 gets most
    assert node.effective_step == 8 and node.version > before + 1
    assert all(len(d["batch_sizes"]) == 3 for d in s.decision_history())
    restored = _scheduler()
    restored.resize(3)
    restored.load_state_dict(s.state_dict())  # every kept decision is one of 3 workers: it loads
    assert restored.decision() == s.decision()


def test_shrinking_keeps_the_batch_floor_and_the_same_count_changes_nothing():
    s = _scheduler()
    s.resize(3)
    s.set_shape("node", {"min_batch": 16})
    s.resize(2)
    assert s.derivers["node"].min_batch == 16  # announced again to the new count's deriver
    version = s.versions["node"]
    s.resize(2)
    assert s.versions["node"] == version


def test_a_resize_is_refused_where_the_run_cannot_follow_it():
    with pytest.raises(ConfigError, match="min_batch=30 x 3 workers"):
        _scheduler(min_batch=30).resize(3)
    sampled = Scheduler(PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B),
                                   sample_priority=SamplePriorityConfig()), 2)
    with pytest.raises(ConfigError, match="node axis alone"):
        sampled.resize(3)
    with pytest.raises(ReportError, match="integer >= 1"):
        _scheduler().resize(0)
