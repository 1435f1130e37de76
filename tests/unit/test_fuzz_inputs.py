"""Issue 15, "bad input refused clearly": property-based fuzzing of every input that enters pdml-ray.

Each target takes random, mostly malformed input and must either accept it or refuse it with the
project's own error (a ``PDMLError`` naming the field); no other exception, no hang (hypothesis'
deadline), and nothing accepted that fails later (an accepted config builds a scheduler that takes
reports and decides; an accepted plan validates and prints; a scheduler keeps its counters right).
``FUZZED`` counts the inputs per target (``pytest -s`` prints them).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdml_ray.config import PDMLConfig, PipelineConfig, SamplePriorityConfig
from pdml_ray.config.node import NodePriorityConfig
from pdml_ray.decisions import Boundary, SamplePlan, WorkerReport
from pdml_ray.errors import ConfigError, PDMLError, PlanError
from pdml_ray.pipeline.plan import Plan, format, validate
from pdml_ray.pipeline.registry import PROJECT_SCHEDULES, make_schedule
from pdml_ray.priority.sample import SamplePrioritizer
from pdml_ray.scheduler import Scheduler

FUZZED: Counter[str] = Counter()
FUZZ = settings(max_examples=500, deadline=5000, suppress_health_check=list(HealthCheck), derandomize=True)

NASTY = st.sampled_from([None, True, False, "false", "true", "", "abc", 0, 1, -1, 2, 7, 10**18, -(10**18), 10**400,
                         0.0, 0.5, 1.5, -0.5, 1e-300, 5e-324, 1e308, math.nan, math.inf, -math.inf, [], [1, 2],
                         [0.5, 0.5, 0.0], [[1.0, 2.0]], [[1.0]], {}, {"a": 1}, {"H100": 2.0}, {"H100": None},
                         {1: 2}, (1, 2), "1f1b", "gpipe", "osprey", "auto", "loss", "max", "p3"])
VALUES = st.one_of(NASTY, st.integers(-5, 5000), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=5), st.lists(st.floats(-2, 2), max_size=4))

SECTIONS = {
    "node_priority": ["global_batch_size", "ema_alpha", "warmup_steps", "min_batch", "max_batch",
                      "hysteresis", "decision_confidence", "prior", "emulated_speeds", "emulated_per_sample_s",
                      "enabled"],
    "sample_priority": ["score", "score_ema", "exponent", "uniform_mix", "staleness_decay", "stale_after",
                        "is_exponent_start", "is_anneal_steps", "is_exponent_end", "replacement", "unseen_score"],
    "gradient_priority": ["prior_weights", "simplex_resolution", "bandit_discount", "bandit_exploration",
                          "collapse_hold", "normaliser_ema", "worker_ema", "k_min", "k_max", "progress_ema",
                          "max_wait", "max_staleness", "priority_fn", "continuity"],
    "continuity": ["check_interval", "running_sums_from", "min_normalized_ess", "min_effective_items",
                   "max_normalized_ess", "max_tie_fraction", "tie_tolerance", "max_check_items",
                   "recalibration_steps", "recalibration_mix", "noise", "reset_fraction"],
    "pipeline": ["schedule", "memory_limit", "stage_costs", "auto_static", "auto_dispersion_threshold",
                 "auto_bubble_threshold", "osprey"],
    "p3": ["policy", "slice_elements", "credit_bytes", "bucket_bytes", "auto", "emulated_bandwidth_gbps",
           "emulated_latency_us", "element_size"],
}
TOP = ["seed", "decision_interval", "scheduler_name", "namespace", "bogus"]


PLAUSIBLE = st.sampled_from([1, 2, 4, 16, 64, 0.1, 0.5, 0.9, True, False, None, "1f1b", "osprey", "loss_ema", "mean"])


def _section(name: str) -> st.SearchStrategy:
    """A section: its field names (and a bogus one) with plausible values more often than nasty ones."""
    keys = st.sampled_from(SECTIONS[name] + ["bogus"])
    values = st.one_of(PLAUSIBLE, PLAUSIBLE, VALUES)
    valid = {"node_priority": {"global_batch_size": 64}}.get(name, {})
    return st.one_of(st.dictionaries(keys, values, max_size=3).map(lambda d: {**valid, **d}),
                     st.dictionaries(keys, values, max_size=3).map(lambda d: {**valid, **d}), NASTY)


CONFIG_DICTS = st.fixed_dictionaries({}, optional={
    **{name: _section(name) for name in SECTIONS}, **{k: VALUES for k in TOP}})


def _accepted_config_works(cfg: PDMLConfig) -> None:
    """An accepted config must not fail later: a scheduler builds (or says which field to change),
    takes reports, decides and saves its state."""
    assert isinstance(cfg, PDMLConfig)
    if cfg.node_priority is None or cfg.node_priority.global_batch_size is None \
            or cfg.node_priority.global_batch_size > 10**6:  # no node axis (optional), or too big to run here
        return
    workers = 3
    try:
        s = Scheduler(cfg, workers)
    except ConfigError:  # e.g. min_batch x workers above the global batch: the message names the fix
        return
    if cfg.sample_priority is not None:
        s.set_dataset_size(500)
    sizes = s.decision().batch_sizes  # type: ignore[union-attr]
    assert sum(sizes) == cfg.node_priority.global_batch_size
    s.report([WorkerReport(worker_id=w, step=k, samples=max(b, 0), compute_s=0.01 + b * 1e-4)
              for k in range(3) for w, b in enumerate(sizes)])
    s.bundle(Boundary(5, 2, tuple(sizes)), {})
    s.state_dict()


@FUZZ
@given(CONFIG_DICTS)
def test_config_dicts_are_accepted_or_refused_with_a_config_error(data):
    FUZZED["config dicts"] += 1
    try:
        cfg = PDMLConfig.from_dict(data)
    except ConfigError as e:
        assert str(e)
        return
    FUZZED["config dicts accepted"] += 1
    _accepted_config_works(cfg)


YAML_TOKENS = st.sampled_from(["node_priority:", "  global_batch_size: 64", "  enabled: 'false'", "seed: [1, 2",
                               "pipeline: {schedule: osprey}", "- 1", "? a", ": :", "\t", "'", '"', "&a", "*a",
                               "!!python/object:os.system", "%YAML 1.2", "---", "...", "{", "}", "[", "]", "0x1F",
                               "sample_priority:", "  exponent: .inf", "  replacement: no", "node_priority: null",
                               "\x00", "\udcff", "~", "seed: 1e400", "continuity: {noise: .nan}"])


@FUZZ
@given(st.one_of(CONFIG_DICTS.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
                 st.lists(YAML_TOKENS, max_size=8).map("\n".join), st.binary(max_size=40)))
def test_yaml_files_are_accepted_or_refused_with_a_config_error(tmp_path_factory, text):
    FUZZED["config YAML"] += 1
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        cfg = PDMLConfig.from_yaml(path)
    except ConfigError as e:
        assert str(path) in str(e)
        return
    FUZZED["config YAML accepted"] += 1
    _accepted_config_works(cfg)


def test_the_issues_config_examples():
    with pytest.raises(ConfigError, match="node_priority.prior"):
        PDMLConfig.from_dict({"node_priority": {"prior": None}})
    with pytest.raises(ConfigError, match="enabled"):
        PDMLConfig.from_dict({"node_priority": {"enabled": "false"}})
    with pytest.raises(ConfigError, match="global_batch_size"):
        PDMLConfig.from_dict({"node_priority": {"global_batch_size": 10**18}})
    with pytest.raises(ConfigError, match="decision_interval"):
        PDMLConfig(decision_interval=True)


def test_malformed_yaml_is_a_config_error_naming_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("node_priority: {global_batch_size: 64\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        PDMLConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="missing.yaml"):
        PDMLConfig.from_yaml(tmp_path / "missing.yaml")


# -- worker reports ----------------------------------------------------------------------------------
ARRAYS = st.one_of(st.none(), NASTY, st.builds(np.array, st.lists(st.integers(-3, 60), max_size=5)),
                   st.builds(lambda x: np.array(x, dtype=np.float64), st.lists(st.floats(allow_nan=True), max_size=5)),
                   st.builds(lambda x: np.array(x, dtype=np.float32), st.lists(st.floats(width=32), max_size=5)),
                   st.just(np.zeros((2, 2))), st.just(np.array(["a"])))
def _often(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Valid values three times in four, nasty ones else: both paths get exercised."""
    return st.one_of(valid, valid, valid, NASTY)


FEEDBACK = st.integers(0, 6).flatmap(lambda k: st.tuples(
    st.lists(st.integers(0, 49), min_size=k, max_size=k).map(lambda x: np.array(x, dtype=np.int64)),
    st.lists(st.floats(0, 1e3), min_size=k, max_size=k).map(lambda x: np.array(x, dtype=np.float32))))
REPORTS = st.builds(
    lambda r, fb: WorkerReport(**{**r, "sample_indices": fb[0], "sample_losses": fb[1]}) if fb else WorkerReport(**r),
    st.fixed_dictionaries(dict(
        worker_id=_often(st.integers(0, 2)), step=_often(st.integers(0, 100)), samples=_often(st.integers(0, 60)),
        compute_s=_often(st.floats(1e-3, 10.0)))),
    st.one_of(st.none(), FEEDBACK, FEEDBACK))
REPORTS = st.one_of(REPORTS, REPORTS, REPORTS, REPORTS, st.builds(
    WorkerReport,
    worker_id=st.one_of(st.integers(-1, 3), NASTY), step=st.one_of(st.integers(-1, 100), NASTY),
    samples=st.one_of(st.integers(-1, 60), NASTY), compute_s=st.one_of(st.floats(allow_nan=True), NASTY),
    wait_s=st.one_of(st.floats(0, 1), NASTY), step_s=st.one_of(st.floats(allow_nan=True), NASTY),
    overhead_s=st.one_of(st.just(0.0), NASTY), loss=st.one_of(st.floats(allow_nan=True), NASTY),
    grad_norm=st.one_of(st.floats(allow_nan=True), NASTY), accelerator_type=st.one_of(st.just("A100"), NASTY),
    sample_indices=ARRAYS, sample_losses=ARRAYS))


@FUZZ
@pytest.mark.filterwarnings("ignore:Generating overly large repr")  # a drawn loss array of thousands of values
@given(st.lists(st.one_of(REPORTS, REPORTS, REPORTS, NASTY), max_size=6), st.booleans())
def test_report_batches_never_raise_and_every_report_is_counted_once(batch, sample):
    FUZZED["worker reports"] += len(batch)
    from pdml_ray.config import GradientPriorityConfig

    cfg = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=90, warmup_steps=0, min_batch=0),
                     sample_priority=SamplePriorityConfig(exponent=2.0) if sample else None,
                     gradient_priority=GradientPriorityConfig() if sample else None)
    s = Scheduler(cfg, 3)
    s.set_dataset_size(50)
    s.report(batch)
    FUZZED["worker reports accepted"] += s.reports_received
    assert s.reports_received + s.reports_rejected == len(batch)
    assert sum(s.rejected_by_kind.values()) == s.reports_rejected
    s.bundle(Boundary(101, 2, s.decision().batch_sizes), {})  # type: ignore[union-attr]
    t = Scheduler(cfg, 3)
    t.load_state_dict(s.state_dict())  # nothing saved is poisoned
    t.bundle(Boundary(103, 2, t.decision().batch_sizes), {})  # type: ignore[union-attr]
    assert (t.reports_received, t.reports_rejected, t.last_step) == (s.reports_received, s.reports_rejected,
                                                                    s.last_step)


# -- sample plans ------------------------------------------------------------------------------------
@FUZZ
@given(st.lists(st.one_of(st.integers(-2, 200), NASTY), max_size=5), st.one_of(st.integers(-1, 4), NASTY),
       st.one_of(st.integers(-1, 10**6), NASTY), st.booleans())
def test_sample_plan_requests_are_served_or_refused_with_a_plan_error(sizes, num_steps, first_step, replacement):
    FUZZED["sample plan requests"] += 1
    sp = SamplePrioritizer(64, SamplePriorityConfig(replacement=replacement), seed=0)
    sp.update(np.arange(10), np.linspace(0, 5, 10), step=0)
    try:
        plans = sp.plans(first_step, num_steps, sizes)
    except PDMLError as e:
        assert str(e)
        return
    FUZZED["sample plan requests accepted"] += 1
    for plan in plans:
        plan.validate(tuple(sizes), 64)


@FUZZ
@given(st.lists(st.tuples(ARRAYS, ARRAYS), max_size=3), st.one_of(st.none(), st.lists(st.integers(-1, 5), max_size=3),
                                                                   NASTY), st.one_of(st.none(), st.integers(-1, 70)))
def test_sample_plans_validate_or_raise_a_plan_error(pairs, batch_sizes, num_samples):
    FUZZED["sample plans"] += 1
    plan = SamplePlan(step=0, indices=tuple(p[0] for p in pairs), weights=tuple(p[1] for p in pairs))
    try:
        plan.validate(batch_sizes, num_samples)  # type: ignore[arg-type]
    except PlanError as e:
        assert str(e)


# -- pipeline plans and schedule sizes ---------------------------------------------------------------
ACTIONS = st.one_of(st.sampled_from(["s0r0F0", "s0r0B0", "s1r0F0", "s1r0B0", "s0r1F1", "s0r0F1", "s0r0B1", "x",
                                     "s9r9F9", "s0r0F99999999999999999999"]), NASTY)
def _real_plan(name: str, stages: int, replicas: int, microbatches: int) -> dict:
    return make_schedule(name, stages=stages, replicas=replicas, microbatches=microbatches).plan(0).to_dict()


def _mutated(plan: dict, key: str, value: object, drop_action: bool) -> dict:
    plan = {**plan, "orders": {k: list(v) for k, v in plan["orders"].items()}}
    if drop_action:
        first = sorted(plan["orders"])[0]
        plan["orders"][first] = plan["orders"][first][1:]
    elif key:
        plan[key] = value
    return plan


REAL_PLANS = st.builds(_real_plan, st.sampled_from(["gpipe", "1f1b", "critical-path"]), st.integers(1, 3),
                       st.integers(1, 2), st.integers(1, 4))
PLAN_DICTS = st.one_of(
    REAL_PLANS,
    st.builds(_mutated, REAL_PLANS, st.sampled_from(["", "num_stages", "replicas", "num_microbatches", "reorder",
                                                     "memory_limit", "schedule", "orders"]), NASTY, st.booleans()),
    st.fixed_dictionaries({"num_stages": st.one_of(st.integers(-1, 3), NASTY),
                           "replicas": st.one_of(st.lists(st.integers(-1, 2), max_size=3), NASTY),
                           "num_microbatches": st.one_of(st.integers(-1, 3), NASTY),
                           "reorder": st.one_of(st.booleans(), NASTY),
                           "memory_limit": st.one_of(st.none(), st.integers(-1, 3), NASTY),
                           "orders": st.one_of(st.dictionaries(st.one_of(st.sampled_from(["0,0", "0,1", "1,0", "a",
                                                                                          "0", "0,0,0", "-1,0"]),
                                                                         NASTY.filter(lambda v: isinstance(v, str))),
                                                               st.one_of(st.lists(ACTIONS, max_size=4), NASTY),
                                                               max_size=3), NASTY)},
                          optional={"schedule": st.one_of(st.just("gpipe"), NASTY)}),
    NASTY)


@FUZZ
@given(PLAN_DICTS)
def test_pipeline_plan_dicts_are_loaded_valid_or_refused_with_a_plan_error(data):
    FUZZED["pipeline plans"] += 1
    try:
        plan = Plan.from_dict(data)
    except PlanError as e:
        assert str(e)
        return
    FUZZED["pipeline plans accepted"] += 1
    validate(plan)  # accepted means valid: it does not fail later
    format(plan)
    assert Plan.from_dict(plan.to_dict()) == plan


@FUZZ
@given(st.sampled_from(sorted(PROJECT_SCHEDULES) + ["nope"]), st.one_of(st.integers(-1, 4), NASTY),
       st.one_of(st.integers(-1, 3), st.lists(st.integers(-1, 3), max_size=4), NASTY), st.one_of(st.integers(-1, 8), NASTY))
def test_schedule_sizes_are_built_or_refused_with_a_config_error(name, stages, replicas, microbatches):
    FUZZED["schedule sizes"] += 1
    try:
        scheduler = make_schedule(name, stages=stages, replicas=replicas, microbatches=microbatches,
                                   config=PipelineConfig())
    except ConfigError as e:
        assert str(e)
        return
    FUZZED["schedule sizes accepted"] += 1
    validate(scheduler.plan(0))


def test_the_issues_schedule_size_example():
    with pytest.raises(ConfigError, match="replicas"):
        make_schedule("gpipe", stages=1, replicas=0, microbatches=4)
    with pytest.raises(ConfigError, match="microbatches"):
        make_schedule("1f1b", stages=2, replicas=1, microbatches=10**12)


def test_zz_fuzz_counts(capsys):
    """Runs last in this module: prints how many inputs each target got (crashes and hangs: 0, or a test failed)."""
    with capsys.disabled():
        print("\nfuzzed inputs per target:", dict(FUZZED))
