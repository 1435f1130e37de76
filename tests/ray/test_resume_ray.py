"""Resume as Ray Train users run it, through ctx.epoch and ctx.batch_sampler: a worker dies mid-epoch and
FailureConfig restarts the group from the last checkpoint ctx.report wrote; a finished run is rerun under
the same RunConfig(name, storage_path) with more epochs and continues from its run storage (the crash
reads its data through ctx.epoch, the rerun through ctx.batch_sampler). Either way
every sample of each epoch is used exactly once in the final model's history, and the final parameters
match an uninterrupted run's: shares are uniform (NodePriorityConfig(enabled=False)), so every run trains
the same batches, and the model has no dropout. Also: a rerun with no epoch left is refused, a worker's
print reaches its logs once, and the scheduler's restart check raises no deprecation warning."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import ray
import ray.train

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.errors import UsageError
from pdml_ray.train import PDMLTrainer

from loops import resumable_loop

N, B, CRASH_AT = 512, 64, 13  # 8 steps per epoch, 2 epochs; checkpoints after steps 3, 7 (an epoch's end), 11, ...
STEPS = 2 * N // B


def _fit(tmp: Path, name: str, sampler: bool, epochs: int = 2, crash_at: int | None = None, run: int = 0):
    config = PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(global_batch_size=B, enabled=False))
    return PDMLTrainer(resumable_loop, train_loop_config={"out": str(tmp / name), "num_samples": N, "epochs": epochs,
                                                          "crash_at": crash_at, "sampler": sampler, "run": run},
                       scaling_config=ray.train.ScalingConfig(num_workers=2),
                       run_config=ray.train.RunConfig(name=name, storage_path=str(tmp),
                                                      failure_config=ray.train.FailureConfig(max_failures=1)),
                       pdml_config=config).fit()


def _logs(tmp: Path, name: str):
    return [[json.loads(line) for line in (tmp / f"{name}.rank{r}").read_text().splitlines()] for r in range(2)]


def _params(tmp: Path, name: str) -> np.ndarray:
    return np.array(json.loads((tmp / f"{name}.params").read_text())["params"])


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    out = {"tmp": tmp, "undisturbed": _fit(tmp, "undisturbed", sampler=False)}
    out["crashed-epoch"] = _fit(tmp, "crashed-epoch", False, crash_at=CRASH_AT)
    out["first-sampler"] = _fit(tmp, "rerun-sampler", True, epochs=1)
    out["rerun-sampler"] = _fit(tmp, "rerun-sampler", True, epochs=2, run=1)
    try:
        _fit(tmp, "rerun-sampler", True, epochs=2, run=2)
    except Exception as e:  # noqa: BLE001 - what the test inspects
        out["again"] = e
    return out


def _history(logs, resumed_attempt: int) -> list[list[dict]]:
    """Each rank's steps in the final model's history: the resumed attempt's, and before it only the
    earlier attempts' steps below the step it resumed at (the later ones were rolled back)."""
    history = []
    for rank_log in logs:
        resumed = min(e["step"] for e in rank_log if e["attempt"] == resumed_attempt)
        history.append([e for e in rank_log if e["attempt"] == resumed_attempt
                        or (e["attempt"] < resumed_attempt and e["step"] < resumed)])
    return history


# Each way of resuming with one way of reading the data (each fit is a Ray Train run of ~25 s on 2 cores):
# both hand the loop the same checkpoint, and how the loop continues from it is what the mode decides.
@pytest.mark.parametrize(("path", "mode"), [("crashed", "epoch"), ("rerun", "sampler")])
def test_a_resumed_run_continues_exactly_where_it_stopped(runs, path, mode):
    tmp, name = runs["tmp"], f"{path}-{mode}"
    assert runs[name].error is None
    logs = _logs(tmp, name)
    resumed_attempt = 1 if path == "crashed" else 2
    history = _history(logs, resumed_attempt)
    resumed = min(e["step"] for e in logs[0] if e["attempt"] == resumed_attempt)
    if path == "crashed":
        assert resumed % 4 == 0 and 0 < resumed <= CRASH_AT  # right after a checkpoint before the crash
    else:
        assert resumed == N // B and {e["epoch"] for e in logs[0] if e["attempt"] == 2} == {1}  # epoch 2 of 2
    for rank_log in history:
        assert [e["step"] for e in rank_log] == list(range(STEPS))  # nothing skipped, nothing twice
    for epoch in (0, 1):
        used = [i for rank_log in history for e in rank_log if e["epoch"] == epoch for i in e["indices"]]
        assert sorted(used) == list(range(N)), f"epoch {epoch}"
    gap = float(np.abs(_params(tmp, name) - _params(tmp, "undisturbed")).max())
    assert gap <= 1e-4, gap
    print(f"{name}: resumed at step {resumed}, max |param - undisturbed| = {gap:.3g}")


def test_a_rerun_of_a_finished_run_with_no_epoch_left_is_refused(runs):
    error = runs.get("again")
    assert isinstance(error, UsageError) and "trained no step" in str(error) and "more epochs" in str(error)


def test_each_print_of_a_worker_reaches_its_logs_once(runs):
    lines = [json.loads(line) for line in (runs["tmp"] / "undisturbed.prints").read_text().splitlines()]
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
