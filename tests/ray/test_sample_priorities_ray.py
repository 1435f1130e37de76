"""Sample priorities through real Ray Train workers with unequal batch sizes: samples with high
loss are drawn more often, weights arrive with the plan, and the table survives a checkpoint; under
rho-loss, the irreducible losses the loop sends leave the mislabelled samples."""

import json
import os

import numpy as np
import pytest
import ray
import ray.train

from pdml_ray.config import NodePriorityConfig, PDMLConfig, SamplePriorityConfig
from pdml_ray.scheduler import Scheduler
from pdml_ray.state_format import read_state
from pdml_ray.train import PDMLTrainer
from pdml_ray.train.saved_state import SCHEDULER_STATE_FILE

from loops import sampling_loop

N, HARD = 2000, 100  # 5% of the samples are mislabelled


def _fit(tmp, mode: str, epochs: int):
    # sleep-emulated compute (0.2 ms/sample / speed): the MLP's own sub-millisecond compute is noise on a
    # loaded machine, and a noise gate that keeps the uniform split is right to (a flake seen under load)
    config = PDMLConfig(decision_interval=3, node_priority=NodePriorityConfig(global_batch_size=200, emulated_speeds=[1.0, 0.5],
                                                         emulated_per_sample_s=2e-4, warmup_steps=1),
                        sample_priority=SamplePriorityConfig(mode=mode, exponent=1.0, uniform_mix=0.1),
                        scheduler_name=f"sampling-test-{mode}")
    rho = mode == "rho-loss"
    result = PDMLTrainer(sampling_loop, train_loop_config={"num_samples": N, "hard": HARD, "epochs": epochs,
                                                           "rho": rho, "report": rho, "out": str(tmp / "rank"),
                                                           "checkpoint_dir": str(tmp)},
                         scaling_config=ray.train.ScalingConfig(num_workers=2),
                         run_config=ray.train.RunConfig(name=f"sampling-test-{mode}", storage_path=str(tmp)),
                         pdml_config=config).fit()
    ranks = [json.loads((tmp / f"rank.{r}").read_text()) for r in range(2)]
    return result, ranks, tmp, config


def _late_hard_fraction(ranks, skip: int = 30) -> float:
    late = [i for r in ranks for step in r["drawn"][skip:] for i in step]  # by default once the table has filled
    return float(np.mean(np.asarray(late) < HARD))


@pytest.fixture(scope="module")
def run(ray_local, tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("sampling"), "importance", 6)


@pytest.fixture(scope="module")
def rho_run(ray_local, tmp_path_factory):
    """rho-loss for 3 epochs (10 steps each), a Ray Train checkpoint after each; then the same run to 5
    epochs, resumed from its run storage: the rerun's ranks write only the steps they ran."""
    tmp = tmp_path_factory.mktemp("sampling_rho")
    first = _fit(tmp, "rho-loss", 3)
    return first, _fit(tmp, "rho-loss", 5)


def test_high_loss_samples_are_drawn_more_often(run):
    _, ranks, _, _ = run
    hard_fraction = _late_hard_fraction(ranks)
    assert hard_fraction > 2 * HARD / N, hard_fraction  # uniform sampling would give 0.05


def test_rho_loss_with_irreducible_losses_from_the_loop_leaves_the_mislabelled_samples(run, rho_run):
    """The loop cross-fits the irreducible-loss models and sends their losses (ctx.set_irreducible_losses):
    the scheduler's table ranks by the reducible loss, so the mislabelled samples that loss priority
    chases are drawn less than uniform draws would. A rerun resumes from the Ray Train checkpoint (the
    table's state reaches the scheduler actor as read-only arrays: this failed before) and goes on
    leaving them; its checkpoint keeps the losses."""
    (first, first_ranks, _, _), (rerun, ranks, tmp, config) = rho_run
    assert first.error is None and rerun.error is None
    assert [r["first_step"] for r in ranks] == [30, 30] and len(ranks[0]["drawn"]) == 20  # epochs 4 and 5 only
    priority = _late_hard_fraction(run[1])
    assert _late_hard_fraction(first_ranks, skip=10) < HARD / N < priority, (_late_hard_fraction(first_ranks, 10), priority)
    assert _late_hard_fraction(ranks, skip=0) < HARD / N, _late_hard_fraction(ranks, skip=0)
    restored = Scheduler(config, 2)
    restored.load_state_dict(read_state(os.path.join(tmp, SCHEDULER_STATE_FILE))["state"])
    il = restored.derivers["sample"].table.irreducible
    assert il[:HARD].mean() > 3 * il[HARD:].mean()  # the models got the mislabelled samples wrong too


def test_workers_had_different_batch_sizes_and_weights(run):
    _, ranks, _, _ = run
    sizes = ranks[0]["sizes"]
    assert any(a != b for a, b in sizes), sizes
    for r, rank in enumerate(ranks):  # each rank drew exactly its share of every step
        assert [len(d) for d in rank["drawn"]] == [s[r] for s in rank["sizes"]]
    mins = [w for w in ranks[0]["weights_min"][10:] if w is not None]
    assert mins and min(mins) < 1.0  # importance weights below 1 for over-sampled items


def test_the_sample_table_survives_a_checkpoint(run):
    result, ranks, tmp, config = run
    assert ranks[0]["saved"] and not ranks[1]["saved"]
    saved = read_state(os.path.join(tmp, SCHEDULER_STATE_FILE))
    restored = Scheduler(config, 2)
    restored.load_state_dict(saved["state"])
    table = restored.derivers["sample"].table
    assert table is not None and table.num_samples == N
    assert table.scores[:HARD].mean() > 2 * table.scores[HARD:].mean()
    assert "sample" in result.pdml.stats.derivers
