"""Resume as Ray Train users run it, through ctx.epoch and ctx.batch_sampler: a worker dies mid-epoch and
FailureConfig restarts the group from the last checkpoint ctx.report wrote (the run reads its data through
ctx.epoch); the finished run is then rerun under the same RunConfig(name, storage_path) with one more
epoch and continues from its run storage (reading through ctx.batch_sampler). In the final model's
history every step is there once, its global batch is the uninterrupted run's (the seeded permutation
of each epoch, cut in steps), and the final parameters equal a single-process model trained on those
batches in order: shares are uniform (NodePriorityConfig(enabled=False)), so a step's weighted gradient
is its global batch's, and the model has no dropout. Also: a rerun with no epoch left is refused, a
worker's print reaches its logs once, and the scheduler's restart check raises no deprecation warning."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import ray
import ray.train
import torch
import torch.nn.functional as F

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import UsageError
from pdml_ray.train import PDMLTrainer
from pdml_ray.train.workloads import make_classification, make_mlp

from loops import resumable_loop

N, B, CRASH_AT = 512, 64, 13  # 8 steps per epoch; checkpoints after steps 3, 7 (an epoch's end), 11, ...
STEPS = 3 * N // B
CONFIG = PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(global_batch_size=B, enabled=False))


def _fit(tmp: Path, sampler: bool, epochs: int, crash_at: int | None = None, run: int = 0):
    return PDMLTrainer(resumable_loop, train_loop_config={"out": str(tmp / "resumed"), "num_samples": N,
                                                          "epochs": epochs, "crash_at": crash_at, "sampler": sampler,
                                                          "run": run},
                       scaling_config=ray.train.ScalingConfig(num_workers=2),
                       run_config=ray.train.RunConfig(name="resumed", storage_path=str(tmp),
                                                      failure_config=ray.train.FailureConfig(max_failures=1)),
                       pdml_config=CONFIG).fit()


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory):
    """Three fits of one run (each a Ray Train run of ~20 s on 2 cores): 2 epochs with a crash at step
    CRASH_AT (through ctx.epoch), the rerun to 3 epochs (through ctx.batch_sampler), a rerun with none left.
    The crash comes some steps after a checkpoint: Ray Train registers a reported checkpoint a moment later."""
    tmp = tmp_path_factory.mktemp("resume")
    out = {"tmp": tmp, "crashed": _fit(tmp, sampler=False, epochs=2, crash_at=CRASH_AT)}
    out["rerun"] = _fit(tmp, sampler=True, epochs=3, run=1)
    out["params"] = np.array(json.loads((tmp / "resumed.params").read_text())["params"])
    out["logs"] = [[json.loads(line) for line in (tmp / f"resumed.rank{r}").read_text().splitlines()] for r in range(2)]
    try:
        _fit(tmp, sampler=True, epochs=3, run=2)
    except Exception as e:  # noqa: BLE001 - what the test inspects
        out["again"] = e
    return out


def _history(rank_log: list[dict]) -> list[dict]:
    """A rank's steps in the final model's history: each start (attempt) rolls back the steps at and
    after the step it resumed at; attempts are numbered in the order they ran."""
    history: list[dict] = []
    for attempt in sorted({e["attempt"] for e in rank_log}):
        entries = [e for e in rank_log if e["attempt"] == attempt]
        history = [e for e in history if e["step"] < entries[0]["step"]] + entries
    return history


def test_a_resumed_run_continues_exactly_where_it_stopped(runs):
    assert runs["crashed"].error is None and runs["rerun"].error is None
    starts = {}  # attempt -> the step it started at (rank 0)
    for e in runs["logs"][0]:
        starts.setdefault(e["attempt"], e["step"])
    assert sorted(starts) == [0, 1, 3], starts  # the first fit, its restart after the crash, the rerun
    assert starts[1] % 4 == 0 and 0 < starts[1] <= CRASH_AT  # right after a checkpoint before the crash
    assert starts[3] == 2 * N // B and {e["epoch"] for e in runs["logs"][0] if e["attempt"] == 3} == {2}  # epoch 3 of 3
    history = [_history(rank_log) for rank_log in runs["logs"]]
    for rank_log in history:
        assert [e["step"] for e in rank_log] == list(range(STEPS))  # nothing skipped, nothing twice
    # each step's global batch is the uninterrupted run's: the epoch's seeded permutation, cut in steps
    x, y = make_classification(N, 16, 3, seed=7)
    model = make_mlp(16, 64, 3, depth=1, seed=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for entries in zip(*history):
        epoch, step = entries[0]["epoch"], entries[0]["step"] % (N // B)
        batch = np.concatenate([e["indices"] for e in entries])
        perm = np.random.default_rng([CONFIG.seed, epoch]).permutation(N)
        assert sorted(batch.tolist()) == sorted(perm[step * B:(step + 1) * B].tolist()), (epoch, step)
        F.cross_entropy(model(x[batch]), y[batch]).backward()  # the global batch's mean loss, in one process
        optimizer.step()
        optimizer.zero_grad()
    reference = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    gap = float(np.abs(runs["params"] - reference).max())
    assert gap <= 1e-4, gap
    print(f"resumed at steps {starts[1]} (crash) and {starts[3]} (rerun); max |param - single process| = {gap:.3g}")


def test_a_rerun_of_a_finished_run_with_no_epoch_left_is_refused(runs):
    error = runs.get("again")
    assert isinstance(error, UsageError) and "trained no step" in str(error) and "more epochs" in str(error)


def test_each_print_of_a_worker_reaches_its_logs_once(runs):
    lines = [json.loads(line) for line in (runs["tmp"] / "resumed.prints").read_text().splitlines()]
    assert lines and all(all(s.startswith("/") for s in line["sinks"]) for line in lines), lines
    assert [line["copies"] for line in lines] == [1] * len(lines)


@ray.remote(max_restarts=1)
class _Restartable:
    def check(self):
        from pdml_ray.actors.scheduler import _reconstructed

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restarted = _reconstructed()
        return restarted, [str(w.message) for w in caught]

    def die(self):
        import os

        os._exit(1)


def test_the_scheduler_restart_check_tells_a_restart_without_a_deprecation_warning(runs):
    actor = _Restartable.remote()
    assert ray.get(actor.check.remote()) == (False, [])
    actor.die.remote()
    for _ in range(100):
        try:
            assert ray.get(actor.check.remote(), timeout=30) == (True, [])
            break
        except ray.exceptions.RayActorError:
            continue
