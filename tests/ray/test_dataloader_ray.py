"""A DataLoader with worker processes over ctx.batch_sampler, on two Ray Train workers whose shares
change during the epoch: the ranks agree on every step's split, every sample of each epoch is
trained exactly once, and the batch sizes move towards the faster worker."""

import json
from pathlib import Path

import ray.train

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.train import PDMLTrainer

from loops import dataloader_loop

N, B = 64 * 24, 64


def test_every_sample_once_per_epoch_through_a_prefetching_dataloader(ray_local, tmp_path):
    out = tmp_path / "dl"
    config = PDMLConfig(decision_interval=4, node_priority=NodePriorityConfig(global_batch_size=B, emulated_speeds=[1.0, 0.4], warmup_steps=1))
    PDMLTrainer(dataloader_loop, train_loop_config={"out": str(out), "num_samples": N},
                scaling_config=ray.train.ScalingConfig(num_workers=2),
                run_config=ray.train.RunConfig(name="dataloader", storage_path=str(tmp_path)),
                pdml_config=config).fit()
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
    a, b = ranks[0]["steps"], ranks[1]["steps"]
    assert len(a) == len(b) == 2 * N // B
    for sa, sb in zip(a, b):
        assert sa["sizes"] == sb["sizes"] and [len(sa["ids"]), len(sb["ids"])] == sa["sizes"]
    for epoch in (0, 1):
        ids = [i for rank in (a, b) for s in rank if s["epoch"] == epoch for i in s["ids"]]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}"
    assert ranks[0]["adopted"] == ranks[1]["adopted"]
    assert len(ranks[0]["adopted"]) >= 1, f"no decision adopted ({ranks[0]['stale']} bundles came late)"
    assert a[-1]["sizes"][0] > a[-1]["sizes"][1]  # the emulated-fast worker ends with more
