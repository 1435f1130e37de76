"""A worker whose loss is NaN or infinite, on real Ray Train workers (gloo): its contribution to the step
is excluded and counted, the step's update equals the good workers' update computed in one process,
training continues (when every worker fails, the step is dropped); a worker that keeps failing ends the run with an error naming it and the step."""

import json
import time

import pytest
import ray.train

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer

from nonfinite_loops import nan_loop


def _fit(tmp_path, name, sync, bad_steps, steps=8, kind="nan", num_workers=2, bad_rank=1, all_bad_steps=(), **node):
    out = tmp_path / f"{name}.json"
    config = PDMLConfig(decision_interval=2, node_priority=NodePriorityConfig(global_batch_size=128, warmup_steps=1,
                                                         ema_alpha=1.0, **node),
                        scheduler_name=name)
    t0 = time.perf_counter()
    trainer = PDMLTrainer(nan_loop, train_loop_config={"out": str(out), "steps": steps, "sync": sync,
                                                       "bad_steps": bad_steps, "kind": kind,
                                                       "bad_rank": bad_rank, "all_bad_steps": list(all_bad_steps)},
                          scaling_config=ray.train.ScalingConfig(num_workers=num_workers),
                          run_config=ray.train.RunConfig(name=name, storage_path=str(tmp_path)), pdml_config=config)
    try:
        result, error = trainer.fit(), None
    except Exception as e:  # Ray Train V2 raises the workers' error from fit()
        result, error = None, e
    ranks = [json.loads((tmp_path / f"{name}.json.rank{r}").read_text()) for r in range(num_workers)]
    return result, error, ranks, time.perf_counter() - t0


# One fit per way the user syncs (each ~20 s of Ray Train on 2 cores). With plain DDP both ranks also
# go bad at step 3: nothing finite is left to apply, the step's gradients are dropped and SGD leaves the
# parameters as they were; training continues.
@pytest.mark.parametrize("sync,kind,all_bad", [("ddp", "nan", []), ("plain", "inf", [3]), ("fsdp", "nan", [])],
                         ids=["ddp-nan", "plain-inf-all-at-3", "fsdp-nan"])
def test_a_nan_step_is_excluded_and_the_update_is_the_good_workers(ray_local, tmp_path, sync, kind, all_bad):
    result, error, (rank0, rank1), wall = _fit(tmp_path, f"nonfinite-{sync}", sync, bad_steps=[2, 5], kind=kind,
                                               all_bad_steps=all_bad)
    assert error is None and result.error is None, error
    assert rank0["steps_done"] == rank1["steps_done"] == 8  # training continued
    for check in rank0["checks"]:
        assert check["finite"], check
        assert check["max_abs_diff"] < 1e-5, check  # = the update from the good ranks alone (none: no change)
        assert check["excluded"] == ([1] if check["step"] in (2, 5) else [0, 1] if check["step"] in all_bad
                                     else []), check
    assert [s["dropped"] for s in rank0["seen"]] == [s in all_bad for s in range(8)]
    for r in (rank0, rank1):  # every rank counted the same exclusions
        assert r["excluded"] == [len(all_bad), 2 + len(all_bad)] and r["dropped_steps"] == len(all_bad)
        assert [e[0] for e in r["events"]] == sorted([2, 5, *all_bad])


def test_a_worker_that_keeps_failing_ends_the_run_naming_it_and_the_step(ray_local, tmp_path):
    result, error, (rank0, rank1), wall = _fit(tmp_path, "nonfinite-always", "ddp", bad_steps=list(range(8)),
                                               max_consecutive_nonfinite=3)
    message = str(error) if error is not None else str(result.error)
    assert "NonFiniteError" in message or "non-finite" in message.lower() or "NaN" in message, message
    assert "worker rank 1 (CPU)" in message and "step 2" in message, message
    for r in (rank0, rank1):  # both ranks stopped at the same step with the same error
        assert r["error"] is not None and "worker rank 1 (CPU)" in r["error"] and r["steps_done"] == 2, r
        assert r["excluded"] == [0, 3]
    assert wall < 120  # it ends, it does not hang (about 20 s of it is Ray Train starting the workers)
