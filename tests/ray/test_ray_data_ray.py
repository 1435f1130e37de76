"""Ray Data input on two Ray Train workers whose shares change during the epoch: ctx.iter_torch_batches
gives each rank its current batch size at every step, the ranks run the same steps, and every row of
each epoch is trained exactly once, from a dataset of several blocks."""

import json
from pathlib import Path

import numpy as np
import ray.data
import ray.train

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer
from pdml_ray.train.workloads import make_classification

from ray_data_loops import ray_data_loop, ray_data_resume_loop

N, B = 64 * 24, 64


def test_every_row_once_per_epoch_at_changing_unequal_sizes(ray_local, tmp_path):
    x, y = make_classification(N, 16, 2, seed=9)
    rows = {"x": x.numpy(), "y": y.numpy(), "id": np.arange(N)}
    ds = ray.data.from_items([{"x": rows["x"][i], "y": int(rows["y"][i]), "id": i} for i in range(N)],
                             override_num_blocks=5)
    out = tmp_path / "rd"
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(
        global_batch_size=B, emulated_speeds=[1.0, 0.4], warmup_steps=1))
    PDMLTrainer(ray_data_loop, train_loop_config={"out": str(out), "prefetch": 2},
                datasets={"train": ds},
                # fractional CPUs: the cluster keeps some for Ray Data's tasks
                scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                run_config=ray.train.RunConfig(name="ray-data", storage_path=str(tmp_path)),
                pdml_config=config).fit()
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
    a, b = ranks[0]["steps"], ranks[1]["steps"]
    assert len(a) == len(b) == 2 * N // B
    for sa, sb in zip(a, b):
        assert sa["sizes"] == sb["sizes"] and [len(sa["ids"]), len(sb["ids"])] == sa["sizes"]
        assert sa["dtype"] == "torch.float32"
    for epoch in (0, 1):
        ids = [i for rank in (a, b) for s in rank if s["epoch"] == epoch for i in s["ids"]]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}"
    assert ranks[0]["adopted"] == ranks[1]["adopted"]
    assert len(ranks[0]["adopted"]) >= 1, f"no decision adopted ({ranks[0]['stale']} bundles came late)"
    sizes = {tuple(s["sizes"]) for s in a}
    assert len(sizes) >= 2  # the sizes changed during the run
    assert a[-1]["sizes"][0] > a[-1]["sizes"][1]  # the emulated-fast worker ends with more


def test_a_restart_mid_epoch_replays_from_the_checkpoint_and_uses_every_row_once(ray_local, tmp_path):
    x, y = make_classification(N, 16, 2, seed=9)
    ds = ray.data.from_items([{"x": x[i].numpy(), "y": int(y[i]), "id": i} for i in range(N)], override_num_blocks=5)
    out = str(tmp_path / "steps.jsonl")
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(
        global_batch_size=B, emulated_speeds=[1.0, 0.4], warmup_steps=1))
    result = PDMLTrainer(ray_data_resume_loop, train_loop_config={"out": out, "crash_at": 14}, datasets={"train": ds},
                         scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                         run_config=ray.train.RunConfig(name="ray-data-resume", storage_path=str(tmp_path),
                                                        failure_config=ray.train.FailureConfig(max_failures=1)),
                         pdml_config=config).fit()
    assert result.error is None
    lines = [json.loads(line) for line in Path(out).read_text().splitlines()]
    starts = sorted({line["start"] for line in lines})
    assert len(starts) == 2 and 0 < starts[1] <= 14  # restarted from a checkpoint before the crash
    history = [line for line in lines if line["start"] == 0 and line["step"] < starts[1]]
    history += [line for line in lines if line["start"] == starts[1]]
    assert [line["step"] for line in history] == list(range(2 * N // B))
    for line in history:
        assert [len(r) for r in line["ids"]] == line["sizes"]
    for epoch in (0, 1):
        ids = [i for line in history if line["epoch"] == epoch for rank in line["ids"] for i in rank]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}"
    replayed = [line for line in lines if line["start"] == 0 and line["step"] >= starts[1]]
    assert replayed  # the steps the crash rolled back were run again from the checkpoint ...
    again = {line["step"]: sorted(i for rank in line["ids"] for i in rank) for line in history}
    # ... on the same rows of the global batch (each step is the next B of the epoch's order, whatever the shares)
    assert all(sorted(i for rank in line["ids"] for i in rank) == again[line["step"]] for line in replayed)
