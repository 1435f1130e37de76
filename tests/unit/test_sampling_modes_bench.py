"""``bench sampling``'s data kinds, arms and targets (issue 26); Ray-free, tiny sizes."""

import argparse

import numpy as np
import pytest

from pdml_ray.bench import sampling, sampling_arm, sampling_targets
from pdml_ray.bench.common import add_common_arguments
from pdml_ray.errors import UsageError


def _parse(argv):
    parser = argparse.ArgumentParser()
    sampling.add_arguments(parser)
    add_common_arguments(parser)
    return parser.parse_args(argv)


def test_label_noise_flips_that_share_of_training_labels_and_never_the_test_split():
    (_, clean), (_, test_clean) = sampling_arm.make_task(1, 20_000, 3)
    (_, noisy), (_, test_noisy) = sampling_arm.make_task(1, 20_000, 3, label_noise=0.2)
    assert np.mean(clean != noisy) == pytest.approx(0.2, abs=0.01)
    np.testing.assert_array_equal(test_clean, test_noisy)


def test_every_arm_trains_and_rho_loss_counts_its_irreducible_model_from_step_zero():
    args = _parse(["--dataset-size", "400", "--hidden", "8", "--label-noise", "0.2", "--il-steps", "5"])
    trial = sampling._trial(3, args, 0, 4, 1, 0.8, {n: 1e-2 for n in sampling.ARMS})
    arms = trial["arms"]
    assert set(arms) == set(sampling.ARMS) and trial["label_noise"] == 0.2
    il = arms["rho_loss"]["irreducible_model"]
    assert il["train_s"] > 0 and il["infer_s"] > 0
    assert arms["rho_loss"]["train_s"] > il["train_s"] + il["infer_s"]  # its cost is inside its wall time
    assert arms["selective_backprop"]["priority_stats"]["mode"] == "selective-backprop"
    assert all("accuracy" in a["final"] for a in arms.values())


def test_arms_flag_and_targets_follow_the_data():
    assert sampling.choose_arms(_parse(["--arms", "rho_loss"])) == ["uniform", "priority", "rho_loss"]
    with pytest.raises(UsageError, match="valid"):
        sampling.choose_arms(_parse(["--arms", "magic"]))

    def arm(steps, time_s):
        return {"steps_to_target": steps, "time_to_target_s": time_s, "step_ratio": 1000 / steps,
                "time_ratio": 10 / time_s}

    summary = {"arms": {"uniform": arm(1000, 10), "priority": arm(90, 2), "rho_loss": arm(60, 2.5),
                        "label_balanced": arm(55, 1)}, "step_ratio": 1000 / 90, "time_ratio": 5,
               "continuity_overhead_fraction": 1e-4, "best_label_free": "rho_loss"}
    control, tree = {"time_ratio": 0.9}, {"draw_update_ms_median": 1.0}
    scale = {"incremental_fraction_of_step": 1e-4, "table_plan_update_ms_median": 1.5}
    high = sampling_targets.targets(_parse(["--imbalance", "1000"]), summary, control, tree, scale)
    assert high["imbalance >= 1000: best label-free arm (rho_loss) >= 10x fewer steps than tuned uniform"]["met"]
    assert high["imbalance >= 1000: best label-free arm (rho_loss) >= 3x less wall time than tuned uniform"]["met"]
    assert not high["balanced control: priority with the pay switch at most 1.05x slower (time_ratio >= 1/1.05)"]["met"]
    noisy = sampling_targets.targets(_parse(["--imbalance", "1", "--label-noise", "0.2"]), summary, control, tree, scale)
    assert noisy["noisy labels: rho_loss beats importance sampling (priority steps / rho_loss steps > 1)"]["met"]
    assert noisy["noisy labels: rho_loss within 1.2x of label-aware oversampling (rho_loss / label_balanced steps)"]["met"]
    assert not any("imbalance >= 1000" in k for k in noisy)
