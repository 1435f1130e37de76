"""A worker dies mid-run; Ray Train restarts the group from the last checkpoint that ctx.report wrote,
and pdml-ray resumes there: the replayed steps are exactly those since that checkpoint, every sample
of each epoch is used exactly once by the run that finished, and the final loss matches an
undisturbed run."""

import json
from pathlib import Path

import numpy as np
import pytest
import ray.train

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer

from loops import resumable_loop

N, B, CRASH_AT = 1280, 64, 13  # 20 steps per epoch, 2 epochs; checkpoints after steps 3, 7, 11, ...


def _fit(tmp_path: Path, name: str, crash_at: int | None):
    out = tmp_path / name
    config = PDMLConfig(node_priority=NodePriorityConfig(global_batch_size=B, emulated_speeds=[1.0, 0.5],
                                                         decision_interval=2, warmup_steps=1))
    result = PDMLTrainer(resumable_loop, train_loop_config={"out": str(out), "num_samples": N, "crash_at": crash_at},
                         scaling_config=ray.train.ScalingConfig(num_workers=2),
                         run_config=ray.train.RunConfig(name=name, storage_path=str(tmp_path),
                                                        failure_config=ray.train.FailureConfig(max_failures=1)),
                         pdml_config=config).fit()
    logs = [[json.loads(line) for line in Path(f"{out}.rank{r}").read_text().splitlines()] for r in range(2)]
    return result, logs, json.loads(Path(f"{out}.loss").read_text())


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    return _fit(tmp, "crashed", CRASH_AT), _fit(tmp, "undisturbed", None)


def _resumed_at(logs) -> int:
    """The step the second attempt started at: just after the checkpoint Ray Train restored (the newest
    one it had registered when the worker died; registration is asynchronous, so not always the newest
    reported)."""
    return next(e["step"] for e in logs[0] if e["attempt"] == 1)


def test_the_run_resumes_from_a_checkpoint_and_replays_exactly_the_steps_since(runs):
    (result, logs, final), _ = runs
    assert result.error is None and final["attempt"] == 1
    resumed = _resumed_at(logs)
    assert resumed % 4 == 0 and 0 < resumed <= CRASH_AT  # right after one of the checkpoints before the crash
    for rank_log in logs:
        first = [e["step"] for e in rank_log if e["attempt"] == 0]
        second = [e["step"] for e in rank_log if e["attempt"] == 1]
        assert second == list(range(resumed, 2 * N // B))  # from that checkpoint to the end, nothing skipped
        assert first == list(range(len(first))) and max(first) >= CRASH_AT - 1


def test_every_sample_is_used_exactly_once_per_epoch_by_the_run_that_finished(runs):
    (_, logs, _), _ = runs
    last_checkpoint = _resumed_at(logs)
    for epoch in (0, 1):
        used = [i for rank_log in logs for e in rank_log if e["epoch"] == epoch
                and (e["attempt"] == 1 or e["step"] < last_checkpoint) for i in e["indices"]]
        assert sorted(used) == list(range(N)), f"epoch {epoch}"


def test_the_final_loss_matches_an_undisturbed_run(runs):
    (_, _, crashed), (_, _, undisturbed) = runs
    assert abs(crashed["loss"] - undisturbed["loss"]) <= 0.02 * undisturbed["loss"], (crashed, undisturbed)
    assert np.isfinite(undisturbed["loss"])
