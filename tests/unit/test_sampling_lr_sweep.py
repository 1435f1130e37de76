"""``bench sampling`` runs each arm at its own best learning rate from one shared grid, and says
which library defaults it overrides; Ray-free."""

import argparse

import pytest

from pdml_ray.bench import sampling, sampling_arm
from pdml_ray.bench.common import add_common_arguments


def _parse(argv):
    parser = argparse.ArgumentParser()
    sampling.add_arguments(parser)
    add_common_arguments(parser)
    return parser.parse_args(argv)


def _trial(steps_by_arm):
    return {"arms": {n: {"steps_bounded": s, "time_bounded_s": s / 100} for n, s in steps_by_arm.items()}}


def test_each_arm_gets_its_own_best_rate_of_the_grid():
    # uniform is best at the higher rate, priority at the lower one: one shared rate favours one arm
    sweep = {3e-3: [_trial({"uniform": 400, "priority": 130}), _trial({"uniform": 380, "priority": 140})],
             1e-2: [_trial({"uniform": 220, "priority": 150}), _trial({"uniform": 230, "priority": 160})]}
    assert sampling.choose_rates(sweep, ["uniform", "priority"]) == {"uniform": 1e-2, "priority": 3e-3}


def test_the_grid_is_shared_by_default_and_lr_pins_one_rate():
    args = _parse([])
    assert args.lr is None and len(args.lr_grid) >= 3 and list(args.lr_grid) == sorted(args.lr_grid)
    assert _parse(["--lr-grid", "1e-2,3e-3"]).lr_grid == (3e-3, 1e-2)
    for bad in ("nan", "0", "1e-3,1e-3", "fast", "1e-3,,1e-2", "-1e-3"):
        with pytest.raises(SystemExit):
            _parse(["--lr-grid", bad])


def test_arms_train_at_the_rates_they_are_given():
    args = _parse(["--dataset-size", "400", "--hidden", "8"])
    trial = sampling._trial(50, args, 0, 3, 1, 0.8, {"uniform": 1e-2, "priority": 3e-3})
    assert trial["lr"] == {"uniform": 1e-2, "priority": 3e-3}
    import torch

    (x, y), _ = sampling_arm.make_task(50, 400, 0)
    arm = sampling_arm.Arm("uniform", torch.from_numpy(x), torch.from_numpy(y), args, 0, 3e-2)
    assert arm.opt.param_groups[0]["lr"] == 3e-2


def test_the_priority_label_names_the_overridden_default():
    assert sampling.library_overrides(_parse([])) == {"unseen_score": "mean"}  # the switch as the library: off
    assert sampling.library_overrides(_parse(["--unseen-score", "max", "--pay-threshold", "1"])) == {"pay_threshold": 1.0}
    assert sampling.library_overrides(_parse(["--unseen-score", "max"])) == {}
    assert "library defaults except" in sampling.ARMS["priority"]
