"""Issue 22, items 1 and 2: pdml-ray's saved state is data, never a pickle, and nothing restored is
adopted unchecked.

A checkpoint's ``pdml_scheduler_state.npz`` and the scheduler actor's GCS snapshot are
``pdml_ray.state_format`` zips (JSON plus arrays). What must hold: every value round-trips with its
type, a scheduler reloaded from the file decides as the original, a planted pickle is refused without
running, a damaged file gives one StateError naming it, and a tampered decision is refused.
"""

import io
import json
import os
import pickle
import zipfile
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from pdml_ray.client import LocalSchedulerTransport, SchedulerClient
from pdml_ray.config import GradientPriorityConfig, NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.decisions import (Boundary, GradientDecision, NodeDecision, SampleDecision, SamplePlan, StepBundle,
                                WorkerReport)
from pdml_ray.errors import PlanError, StateError
from pdml_ray.scheduler import Scheduler
from pdml_ray.state_format import VERSION, dumps, loads, read_state, write_state
from pdml_ray.train import context as context_module
from pdml_ray.train.context import PDMLContext
from pdml_ray.train.saved_state import SCHEDULER_STATE_FILE

B, N = 64, 500


def _config() -> PDMLConfig:
    return PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B, warmup_steps=0, hysteresis=0.0,
                                                       min_batch=4, max_batch=60),
                      sample_priority=SamplePriorityConfig(), gradient_priority=GradientPriorityConfig(),
                      report_via="worker")  # two ranks without a process group: no boundary gather


def _drive(s: Scheduler, steps: range, seed: int) -> list[StepBundle]:
    """Two workers (worker 1 half as fast) with losses, gradient norms and per-sample losses; a bundle
    every 4 steps. The same seed gives the same reports."""
    rng = np.random.default_rng(seed)
    bundles = []
    for step in steps:
        reports = []
        for w, per_sample_s in enumerate((0.01, 0.02)):
            b = s.decision().batch_sizes[w]
            reports.append(WorkerReport(
                worker_id=w, step=step, samples=b, compute_s=b * per_sample_s * (1 + 0.05 * rng.random()),
                loss=float(rng.random()), grad_norm=float(rng.random() + 0.5),
                sample_indices=rng.integers(0, N, size=b).astype(np.int64),
                sample_losses=rng.random(b).astype(np.float32)))
        s.report(reports)
        if step % 4 == 3:
            bundles.append(s.bundle(Boundary(step + 1, 4, s.decision().batch_sizes), dict(s.versions)))
    return bundles


def _scheduler() -> Scheduler:
    s = Scheduler(_config(), 2)
    s.set_dataset_size(N)
    return s


def _same(a, b, path="state"):
    """Equal values of the same types all the way down (arrays: dtype, shape and values; NaN == NaN)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple, deque)):
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        if isinstance(a, deque):
            assert a.maxlen == b.maxlen, path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), path
    elif isinstance(a, (SampleDecision, SamplePlan)):
        _same(a.to_dict(), b.to_dict(), path)
    elif isinstance(a, (float, np.floating)) and np.isnan(a):
        assert np.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


# -- the format ---------------------------------------------------------------------------------------
def test_every_kind_of_value_round_trips_with_its_type():
    plan = SamplePlan(3, (np.array([1, 2], dtype=np.int64),), (np.array([0.5, 1.0], dtype=np.float32),))
    state = {
        "list": [1, 2.5, "x", None, True], "tuple": (1, (2, 3), []), "int keys": {0: "a", 7: (1, 2)},
        "mixed keys": {(1, 2): 3, None: 4, 2.5: 5}, "$type": "a user key that looks like a tag",
        "floats": [float("nan"), float("inf"), -float("inf"), -0.0, 1e-308, 0.1],
        "big int": 2 ** 127 + 1,  # a PCG64 generator's state is a 128-bit integer
        "deque": deque([1, 2], maxlen=5), "unbounded deque": deque([[1.0]]),
        "arrays": [np.arange(5, dtype=np.int32), np.array([[np.nan, 1.0]]), np.zeros(0, dtype=bool),
                   np.array(3.5, dtype=np.float32), np.array([1 + 2j])],
        "scalars": [np.int64(-3), np.float32(0.25), np.bool_(True), np.uint8(255), np.float64(np.nan)],
        "decisions": [NodeDecision.uniform(B, 2), GradientDecision(2, 4, (0.5, 1.5), 0.5, (0.2, 0.3, 0.5), 3, 1, "r"),
                      SampleDecision(1, 3, (plan,))],
    }
    back = loads(dumps(state), "test")
    _same(state, back)


def test_a_scheduler_reloaded_from_the_file_has_the_same_state_and_decides_the_same(tmp_path):
    original = _scheduler()
    _drive(original, range(40), seed=0)
    saved = original.state_dict()
    assert set(saved["current"]) == {"node", "gradient"} and saved["derivers"]["sample"]["table"] is not None
    write_state(tmp_path / "s.npz", saved)
    restored = _scheduler()
    restored.load_state_dict(read_state(tmp_path / "s.npz"))
    _same(saved, restored.state_dict())
    # from here on both get the same reports: the same decisions, version for version
    a, b = _drive(original, range(40, 80), seed=1), _drive(restored, range(40, 80), seed=1)
    assert sum(len(x.decisions) for x in a) >= 20
    for x, y in zip(a, b):
        assert list(x.decisions) == list(y.decisions)
        for name in x.decisions:
            _same(x.decisions[name], y.decisions[name], name)
    _same(original.state_dict(), restored.state_dict())


@pytest.mark.parametrize("schedule", ["1f1b", "osprey"])
def test_the_pipeline_axis_round_trips_its_micro_batch_plans(schedule):
    from pdml_ray.config import PipelineConfig

    def run(s: Scheduler, steps: range) -> list[StepBundle]:
        bundles = []
        for step in steps:
            rows = [(0, 0, "F", 0, 0.01), (1, 1, "F", 0, 0.02 + 0.001 * step), (1, 0, "B", 1, 0.03)]
            s.observe("pipeline", step, rows)
            bundles.append(s.bundle(Boundary(step + 1, 1, (0,) * 4), dict(s.versions)))
        return bundles

    def scheduler() -> Scheduler:
        s = Scheduler(PDMLConfig(pipeline=PipelineConfig(schedule=schedule)), 4)
        s.set_shape("pipeline", {"stages": 2, "replicas": [1, 2], "microbatches": 4})
        return s

    original, restored = scheduler(), scheduler()
    run(original, range(6))
    saved = original.state_dict()
    assert len(saved["history"]["pipeline"]) == 6
    restored.load_state_dict(loads(dumps(saved), "test"))
    _same(saved, restored.state_dict())
    for a, b in zip(run(original, range(6, 10)), run(restored, range(6, 10))):
        assert a.decisions["pipeline"] == b.decisions["pipeline"]


def test_what_the_format_cannot_hold_is_refused_when_saving():
    with pytest.raises(StateError, match="dtype object"):
        dumps({"a": np.array([{"x": 1}], dtype=object)})
    with pytest.raises(StateError, match="Path cannot be saved"):
        dumps({"a": Path("/")})


# -- the checkpoint file through the context ----------------------------------------------------------
class _Recorder(LocalSchedulerTransport):
    """The in-process scheduler, with the calls that reached it."""

    def __init__(self, scheduler):
        super().__init__(scheduler)
        self.methods: list[str] = []

    def submit(self, method, *args):
        self.methods.append(method)
        return super().submit(method, *args)


def _context(monkeypatch, rank=0, scheduler=None) -> PDMLContext:
    """Rank ``rank`` of two workers, without a process group (the constructor's barrier is a no-op)."""
    monkeypatch.setattr(context_module.dist, "barrier", lambda: None)
    client = SchedulerClient(_Recorder(scheduler)) if scheduler is not None else None
    return PDMLContext(_config(), rank, 2, torch.device("cpu"), "CPU", client)


def _checkpoint(monkeypatch, directory: Path) -> tuple[PDMLContext, Scheduler]:
    scheduler = _scheduler()
    _drive(scheduler, range(40), seed=0)
    ctx = _context(monkeypatch, 0, scheduler)
    ctx.decision, ctx.global_step, ctx._position = scheduler.decision(), 40, (1, 192)
    ctx.versions = dict(scheduler.versions)
    assert ctx.save_scheduler_state(str(directory))
    return ctx, scheduler


def test_a_checkpoint_is_data_that_a_fresh_run_resumes_from(monkeypatch, tmp_path):
    ctx, scheduler = _checkpoint(monkeypatch, tmp_path)
    assert SCHEDULER_STATE_FILE == "pdml_scheduler_state.npz" and os.listdir(tmp_path) == [SCHEDULER_STATE_FILE]
    assert zipfile.is_zipfile(tmp_path / SCHEDULER_STATE_FILE)
    fresh = _scheduler()
    resumed = _context(monkeypatch, 0, fresh)
    assert resumed.load_scheduler_state(str(tmp_path))
    assert resumed.decision == ctx.decision and resumed.decision.batch_sizes != (32, 32)
    # the versions of the axes whose decisions the file holds: the scheduler sends the others' again
    saved = {name: v for name, v in ctx.versions.items() if name in ("node", "sample")}
    assert (resumed.global_step, resumed.start_epoch, resumed._resume, resumed.versions) == (40, 1, (1, 192), saved)
    assert set(ctx.versions) - set(saved) == {"gradient"}
    _same(scheduler.state_dict(), fresh.state_dict())
    # another rank resumes the same decision and position without touching the scheduler
    other = _context(monkeypatch, 1)
    assert other.load_scheduler_state(str(tmp_path)) and other.decision == ctx.decision


def test_the_old_pickle_file_name_is_not_read(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "pdml_scheduler_state.pkl").write_bytes(pickle.dumps(_Planted(str(marker))))
    assert not _context(monkeypatch).load_scheduler_state(str(tmp_path))
    assert not marker.exists()


class _Planted:
    """Unpickling it creates ``marker``: what a planted checkpoint or snapshot would run."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_planted_pickle_under_the_checkpoint_name_is_refused_without_running(monkeypatch, tmp_path, rank):
    marker = tmp_path / "ran"
    path = tmp_path / SCHEDULER_STATE_FILE
    path.write_bytes(pickle.dumps({"state": _Planted(str(marker))}))
    assert pickle.loads(path.read_bytes()) == {"state": None} and marker.exists()  # the payload works ...
    marker.unlink()
    scheduler = _scheduler()
    ctx = _context(monkeypatch, rank, scheduler)
    with pytest.raises(StateError, match=str(path)):
        ctx.load_scheduler_state(str(tmp_path))
    assert not marker.exists()  # ... and did not run
    assert "load_state_dict" not in ctx.client.transport.methods  # type: ignore[union-attr]
    assert ctx.global_step == 0 and ctx.decision == NodeDecision.uniform(B, 2)


def _rewrite(path: Path, edit) -> None:
    """Rewrite the zip at ``path`` with ``edit(members)`` applied to its {name: bytes}."""
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    edit(members)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _edit_json(edit):
    def apply(members):
        header = json.loads(members["state.json"])
        edit(header)
        members["state.json"] = json.dumps(header).encode()
    return apply


def _object_array(members):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.array([_Planted("/nonexistent/x")], dtype=object), allow_pickle=True)
    members["arrays/0.npy"] = buffer.getvalue()


DAMAGE = {
    "empty": lambda path: path.write_bytes(b""),
    "truncated to half": lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
    "truncated by one byte": lambda path: path.write_bytes(path.read_bytes()[:-1]),
    "a flipped byte inside a member": lambda path: path.write_bytes(_flip(path.read_bytes())),
    "not a zip": lambda path: path.write_text("hello"),
    "another format version": lambda path: _rewrite(path, _edit_json(lambda h: h.update(version=VERSION + 1))),
    "another format name": lambda path: _rewrite(path, _edit_json(lambda h: h.update(format="torch"))),
    "the json member renamed": lambda path: _rewrite(path, lambda m: m.update({"other.json": m.pop("state.json")})),
    "an extra member": lambda path: _rewrite(path, lambda m: m.update({"extra.npy": b"x"})),
    "an array member missing": lambda path: _rewrite(path, lambda m: m.pop("arrays/0.npy")),
    "an object array": lambda path: _rewrite(path, _object_array),
    "a NaN literal in the JSON": lambda path: _rewrite(path, lambda m: m.update(
        {"state.json": m["state.json"].replace(b'"global_step":40', b'"global_step":NaN')})),
    "an unknown tag": lambda path: _rewrite(path, _edit_json(lambda h: h["state"].update(
        position={"$type": "module", "name": "os.system"}))),
    "an unknown decision type": lambda path: _rewrite(path, _edit_json(lambda h: h["state"]["decision"].update(
        kind="os.system"))),
    "a decision field of the wrong type": lambda path: _rewrite(path, _edit_json(
        lambda h: h["state"]["decision"]["fields"].update(batch_sizes="32,32"))),
    "deep nesting": lambda path: _rewrite(path, lambda m: m.update(
        {"state.json": b'{"format":"pdml-ray-state","version":1,"state":' + b"[" * 100_000 + b"]" * 100_000 + b"}"})),
}


def _flip(data: bytes) -> bytes:
    i = data.index(b'"global_step"') + 2  # inside the stored JSON member: its CRC no longer matches
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_checkpoint_file_gives_one_state_error_naming_it_on_every_rank(monkeypatch, tmp_path, damage):
    _checkpoint(monkeypatch, tmp_path)
    path = tmp_path / SCHEDULER_STATE_FILE
    DAMAGE[damage](path)
    for rank in (0, 1):
        scheduler = _scheduler()
        before = scheduler.state_dict()
        ctx = _context(monkeypatch, rank, scheduler)
        with pytest.raises(StateError, match=str(path)) as e:
            ctx.load_scheduler_state(str(tmp_path))
        assert "resume from another checkpoint" in str(e.value) and len(str(e.value)) < 800
        assert ctx.global_step == 0 and ctx.start_epoch == 0 and ctx._resume is None  # nothing half-loaded
        _same(before, scheduler.state_dict())


# -- tampered decisions -------------------------------------------------------------------------------
def _tamper(path: Path, where: str, **fields) -> None:
    def edit(h):
        state = h["state"]
        target = {"in force": lambda: state["decision"]["fields"],
                  "scheduler's current": lambda: state["state"]["current"]["node"]["fields"],
                  "node deriver's": lambda: state["state"]["derivers"]["node"]["decision"],
                  "gradient deriver's": lambda: state["state"]["derivers"]["gradient"]["decision"]}[where]()
        target.update(fields)
    _rewrite(path, _edit_json(edit))


TAMPERED = [
    ("in force", {"batch_sizes": [1000, -936], "grad_weights": [1000 / 64, -936 / 64]}),  # the decision
    ("in force", {"batch_sizes": [62, 2], "grad_weights": [62 / 64, 2 / 64]}),  # below min_batch=4
    ("in force", {"batch_sizes": [40, 40], "grad_weights": [0.5, 0.5]}),  # sums to 80, not 64
    ("in force", {"batch_sizes": [32, 32], "grad_weights": [0.9, 0.1]}),  # weights not the batch shares
    ("in force", {"batch_sizes": [64], "grad_weights": [1.0], "shares": [1.0]}),  # one worker of two
    ("in force", {"batch_sizes": [32.0, 32.0]}),  # not integers
    ("scheduler's current", {"batch_sizes": [1000, -936], "grad_weights": [1000 / 64, -936 / 64]}),
    ("node deriver's", {"batch_sizes": [61, 3], "grad_weights": [61 / 64, 3 / 64]}),
    ("gradient deriver's", {"priorities": [1.0, -5.0]}),
]


@pytest.mark.parametrize("where, fields", TAMPERED)
def test_a_tampered_decision_is_refused_and_nothing_is_adopted(monkeypatch, tmp_path, where, fields):
    _checkpoint(monkeypatch, tmp_path)
    _tamper(tmp_path / SCHEDULER_STATE_FILE, where, **fields)
    scheduler = _scheduler()
    ctx = _context(monkeypatch, 0, scheduler)
    with pytest.raises(StateError, match=str(tmp_path / SCHEDULER_STATE_FILE)):
        ctx.load_scheduler_state(str(tmp_path))
    assert ctx.decision == NodeDecision.uniform(B, 2) and ctx.global_step == 0
    assert "load_state_dict" not in ctx.client.transport.methods  # type: ignore[union-attr]


def test_node_decision_validate_checks_bounds_types_and_weights():
    good = NodeDecision.from_sizes(0, 0, [40, 24], [0.6, 0.4])
    good.validate(64, 4, 60, 2)
    for bad, args, match in [
        (NodeDecision.from_sizes(0, 0, [1000, -936], [1.0, 0.0]), (64,), "must lie in"),
        (good, (64, 30, None, 2), "must lie in"),
        (good, (64, 0, 30, 2), "must lie in"),
        (good, (64, 0, None, 3), "per worker"),
        (good, (100,), "sum to 64"),
        (NodeDecision(0, 0, (32, 32), (0.9, 0.1), (0.5, 0.5)), (64,), "batch share"),
        (NodeDecision(0, 0, (32.0, 32), (0.5, 0.5), (0.5, 0.5)), (64,), "integers"),  # type: ignore[arg-type]
        (NodeDecision(0, 0, (32, 32), (0.5, 0.5), (float("nan"), 0.5)), (64,), "finite"),
    ]:
        with pytest.raises(PlanError, match=match):
            bad.validate(*args)
    with pytest.raises(PlanError, match="wrong type"):
        NodeDecision.from_dict({**good.to_dict(), "batch_sizes": "40,24"})
    with pytest.raises(PlanError, match="missing"):
        GradientDecision.from_dict({"version": 0})


# -- the scheduler actor's GCS snapshot ---------------------------------------------------------------
@pytest.fixture
def kv(monkeypatch):
    """Ray's GCS internal KV as a dict (no cluster)."""
    from ray.experimental import internal_kv

    store: dict[str, bytes] = {}
    monkeypatch.setattr(internal_kv, "_internal_kv_put", lambda k, v, overwrite=True, namespace=None:
                        store.__setitem__(k, v))
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda k, namespace=None: store.get(k))

    def delete(k, del_by_prefix=False, namespace=None):
        for key in [key for key in store if (key.startswith(k) if del_by_prefix else key == k)]:
            del store[key]
    monkeypatch.setattr(internal_kv, "_internal_kv_del", delete)
    return store


def _restarted(snapshot_store):
    from pdml_ray.actors.scheduler import MeteredScheduler

    actor = MeteredScheduler(_config(), 2, snapshots=False)
    actor._store = snapshot_store
    actor._restore()
    actor._store = None  # closed without deleting the snapshot, as a killed actor leaves it
    actor.close()
    return actor


def test_the_snapshot_is_data_in_chunks_and_a_restarted_actor_restores_it(monkeypatch, kv):
    from pdml_ray.actors import scheduler as actor_module

    from pdml_ray.actors import snapshot_store

    monkeypatch.setattr(snapshot_store, "SNAPSHOT_CHUNK_BYTES", 4096)
    original = actor_module.MeteredScheduler(_config(), 2, snapshots=False)
    original.set_dataset_size(N)
    _drive(original, range(40), seed=0)
    original._store = actor_module.SnapshotStore("run", "ns")
    assert original.snapshot() > 0
    manifest = json.loads(kv[f"{original._store.prefix}manifest"])
    assert manifest["chunks"] > 1 and manifest["generation"] == 1
    restored = _restarted(actor_module.SnapshotStore("run", "ns"))
    assert restored.restarts == 1 and restored._generation == 1
    _same(Scheduler.state_dict(original), Scheduler.state_dict(restored))
    original.close()


@pytest.mark.parametrize("planted", ["manifest", "blob"])
def test_a_planted_pickle_in_the_kv_is_refused_without_running(kv, tmp_path, caplog, planted):
    from pdml_ray.actors.snapshot_store import SnapshotStore

    marker = tmp_path / "ran"
    store = SnapshotStore("run", "ns")
    blob = pickle.dumps({"state": _Planted(str(marker))})
    if planted == "manifest":
        kv[f"{store.prefix}manifest"] = pickle.dumps({"generation": _Planted(str(marker)), "chunks": 1})
    else:
        store.save(blob, 1)  # a whole, well-committed snapshot: only its content is foreign
    with pytest.raises(StateError, match="scheduler-snapshot/ns/run/"):
        found = store.load()
        assert found is not None
        loads(found[0], f"the snapshot {store.prefix}")
    restored = _restarted(store)
    assert not marker.exists()
    assert restored.restarts == 1 and restored.reports_received == 0 and restored.versions == {"node": 0,
                                                                                             "gradient": 0}
    assert any("could not load its snapshot" in r.getMessage() for r in caplog.records)


def test_a_snapshot_with_a_tampered_decision_or_missing_chunk_starts_empty(monkeypatch, kv):
    from pdml_ray.actors import scheduler as actor_module

    original = actor_module.MeteredScheduler(_config(), 2, snapshots=False)
    original.set_dataset_size(N)
    _drive(original, range(40), seed=0)
    state = Scheduler.state_dict(original)
    state["current"]["node"] = NodeDecision.from_sizes(3, 40, [1000, -936], [0.5, 0.5])
    store = actor_module.SnapshotStore("run", "ns")
    store.save(dumps({"state": state, "registered": [0, 1], "restarts": 0, "time": 0.0}), 1)
    assert _restarted(store).reports_received == 0
    del kv[f"{store.prefix}1/0"]
    with pytest.raises(StateError, match="incomplete or corrupt"):
        store.load()
    assert _restarted(store).reports_received == 0
    original.close()
