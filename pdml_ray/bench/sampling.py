"""``pdml-ray bench sampling``: uniform vs the sample-priority modes on imbalanced, noisy or balanced data.

One process, no Ray: this measures the algorithm and its full overhead (sum-tree draws, importance
weights, score-table updates, continuity checks), not a cluster. Nothing is emulated: the data set
(a seeded, generated binary task with 1 positive in ``--imbalance``, ``--label-noise`` of its training
labels flipped; the test split is always clean), a small torch MLP trained with
Adam on the CPU, every step of every arm, and all timings are real. The arms run interleaved step by
step in the same process with the same initial weights, global batch and step budget, so a noisy
shared machine slows all alike. Each arm runs at its own best learning rate from one shared grid
(``--lr-grid``): a sweep on seeds of its own (``--sweep-seeds``, never the measured ones) runs every
arm at every rate of the grid and picks each arm's rate by the benchmark's target metric (median
steps to the target F1, a miss counting as the budget; ties by time), so no arm is compared at a rate
tuned for another. ``--lr`` instead runs every arm at one given rate, without a sweep.

- ``uniform``: uniform sampling, plain mean loss (the baseline every ratio is taken against);
- ``priority``: loss-priority sampling with the library's defaults except what the bench sets
  (``--unseen-score`` mean by default, where the library's is max, and ``--temperature`` and
  ``--uniform-mix`` where given; the JSON lists them in ``overrides_of_library_defaults``):
  importance-weight exponent beta annealed 0.4 -> 1 over 1,000 steps, loss ``sum(w l) / sum(w)``;
- the other modes, same table and sampler: ``annealed`` (beta rising late), ``selective_backprop``
  (uniform draws; each batch scored by a forward without gradients, then its high-loss third forwarded
  again and backpropagated alone, as ``ctx.step``'s ``backprop_rows``: the arm's wall time holds the
  scoring forward and the saved backward; ``backprop_fraction`` in its JSON), ``rho_loss`` (draws by loss minus
  an irreducible-loss model's loss; that model is cross-fitted on the training set with class-balanced
  draws, ``pdml_ray.bench.sampling_rho``, and its training and inference time is counted in the arm's
  wall time from step 0; the mode's default trains the draws unweighted, as the RHO-LOSS paper does);
- baselines besides uniform: ``focal`` (uniform draws, focal loss with gamma 2: no change to sampling)
  and ``label_balanced`` (below);
- the priority arms run as the library's default does, without the pay switch; ``--pay-threshold 1``
  runs every priority arm with it: uniform draws at first, priority draws while a measured A/B (intervals of the other
  kind of draw now and then, ``pdml_ray.priority.sample_switch``) finds their loss falling faster per
  second than uniform draws'. Common random numbers: each table is seeded like the uniform arm's
  sampler and draws an interval at once as it does, so a priority arm drawing uniformly (switched off,
  or before its first probe) trains on the uniform arm's very batches until its draws first differ;
  its time then differs from uniform's by what the table costs;
- ablations: ``priority_beta1`` (beta held at 1 from step 0: fully unbiased), ``priority_no_correction``
  (beta 0: every weight 1, the sampler's bias left in), ``rho_loss_holdout`` (rho-loss with its first
  irreducible-loss model: a small one on a 10% holdout, ``--holdout-fraction``), ``rho_loss_corrected``
  (rho-loss with importance correction, beta 0.4 -> 1, the mode's default until 2026-12-05) and ``label_balanced`` (what a practitioner who
  knows the labels does: each draw picks a class uniformly, then a sample of it uniformly, i.e. the
  minority oversampled to balance, plain mean loss; it uses the labels, the others do not).

Target metric: F1 of the minority (positive) class on a held-out balanced set (2,000 + 2,000, clean
labels), evaluated every ``--eval-every`` steps; evaluation time is excluded from time-to-target. The
final accuracy on that clean split is reported per arm. The headline label-free arm
(``best_label_free``) is the one of priority, annealed, annealed_beta0 (annealed with
``is_exponent_start`` 0, its config in the arm's description), selective_backprop and rho_loss with the
fewest median steps to the target (ties by time); the targets that name it say so. Every arm is
treated alike: a seed where an arm misses the target counts as the whole budget (steps, or that arm's
training time over the budget) in its medians and ratios, so those are bounds, and the JSON says how
many seeds each arm reached the target in. A balanced control (imbalance 1, target F1
``--control-target-f1``, evaluated every step) checks what priority sampling costs when there is
nothing to focus on; its two arms run at their own best rates of the grid on the balanced task (a
sweep of its own on the sweep seeds, the same rule). Before timing, a short discarded warm-up runs so
that one-time first-call costs of torch and numpy land on no arm.

Costs at scale: the sum-tree's draw + update and the continuity check are also timed on a table of
N = 10^7 synthetic scores (no model is trained at that size), the check both as the library runs it
(incremental sum of squares: O(B) per update, O(1) per check) and as a full pass over the table.

This module runs the sweep, the seeds and the summary; the task and one arm's training run are in
``sampling_arm``, the costs at scale in ``sampling_costs``, the targets in ``sampling_targets``.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Sequence

import numpy as np

from pdml_ray.bench.common import median
from pdml_ray.bench.sampling_arm import Arm, make_task
from pdml_ray.bench.sampling_costs import continuity_cost_at_scale, sumtree_timing
from pdml_ray.bench.sampling_targets import targets

DESCRIPTION = "uniform vs loss-priority sampling on an imbalanced task, with ablations (steps and wall time to a target F1)"

ARMS: dict[str, str] = {
    "uniform": "uniform sampling, plain mean loss (baseline, tuned: its own best rate of the grid)",
    "priority": "loss priority (mode importance), library defaults except the bench's overrides "
                "(overrides_of_library_defaults), beta 0.4 -> 1 over 1,000 steps",
    "annealed": "mode annealed: loss priority, beta 0.4 -> 1 rising as the cube of the anneal (biased until late)",
    "annealed_beta0": "mode annealed from beta 0 (is_exponent_start 0: no correction at first, rising as the "
                      "cube of the anneal to 1 at 1,000 steps): the most biased label-free arm",
    "selective_backprop": "mode selective-backprop: uniform draws, each batch scored without gradients, the "
                          "samples at or above the 2/3 percentile of the last 4,096 losses forwarded again and "
                          "backpropagated alone (biased: their mean)",
    "rho_loss": "mode rho-loss: priority by loss minus an irreducible-loss model's loss, the draws trained "
                "unweighted as the paper trains (the mode's default exponents 0 -> 0); the irreducible-loss models "
                "two-layer width-64, cross-fitted on the training set's folds, class-balanced draws with the logit "
                "adjustment; their cost counted)",
    "focal": "uniform draws, focal loss (gamma 2): a common practitioner fix, no change to sampling",
    "priority_beta1": "(a) loss priority, importance-weight exponent beta = 1 from step 0 (fully unbiased)",
    "priority_no_correction": "(b) loss priority, no importance correction (beta = 0: every weight 1)",
    "label_balanced": "(c) label-aware: classes drawn equally often, uniform within a class (minority "
                      "oversampled to balance), plain mean loss",
    "rho_loss_corrected": "(e) mode rho-loss with importance correction, beta 0.4 -> 1 over 1,000 steps (the "
                          "mode's default until 2026-12-05; the same irreducible-loss models)",
    "rho_loss_holdout": "(d) mode rho-loss with the irreducible-loss model it was first measured with: one layer, "
                        "width 64, 100 steps on uniform draws of a holdout carved off the training set "
                        "(--holdout-fraction)",
}
ABLATIONS = ("priority_beta1", "priority_no_correction", "rho_loss_holdout", "rho_loss_corrected")
MODE_ARMS = ("priority", "annealed", "annealed_beta0", "selective_backprop", "rho_loss")
"""The label-free arms the headline (``best_label_free``) is chosen among."""
BASELINES = ("focal", "label_balanced")
# SamplePriorityConfig fields of each priority arm on top of the benchmark's own (exponent, mix, unseen)
_PRIORITY_ARMS: dict[str, dict[str, Any]] = {
    "priority": {},
    "annealed": {"mode": "annealed"},
    "annealed_beta0": {"mode": "annealed", "is_exponent_start": 0.0},
    "selective_backprop": {"mode": "selective-backprop"},
    "rho_loss": {"mode": "rho-loss"},
    "rho_loss_corrected": {"mode": "rho-loss", "is_exponent_start": 0.4, "is_exponent_end": 1.0},
    "rho_loss_holdout": {"mode": "rho-loss"},
    "priority_beta1": {"is_exponent_start": 1.0, "is_exponent_end": 1.0},
    "priority_no_correction": {"is_exponent_start": 0.0, "is_exponent_end": 0.0},
}
RATIO_DIRECTION = "uniform / arm: > 1 means the arm reaches the target in fewer steps (less time) than uniform"
_CONTROL_ARMS = ("uniform", "priority")
_CONTROL_STEPS = 300  # the balanced control's budget: it reaches its target in tens of steps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--imbalance", type=int, default=200, help="negatives per positive in training (default 200)")
    parser.add_argument("--dataset-size", type=int, default=20_000, metavar="N", help="training samples (default 20000)")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch (default 128)")
    parser.add_argument("--lr", type=float, default=None,
                        help="one Adam learning rate for every arm, no sweep (default: each arm's best of --lr-grid)")
    parser.add_argument("--lr-grid", type=rate_list, default=LR_GRID,
                        help="comma-separated Adam learning rates, one grid for every arm; a sweep picks each "
                             f"arm's best by steps to the target (default {LR_GRID})")
    parser.add_argument("--sweep-seeds", type=int, default=None,
                        help="seeds of the learning-rate sweep, apart from the measured ones (default 3, quick 1)")
    parser.add_argument("--target-f1", type=float, default=0.8, help="minority-class F1 to reach (default 0.8)")
    parser.add_argument("--control-target-f1", type=float, default=0.99,
                        help="F1 the balanced control must reach (default 0.99: balanced data passes 0.8 in a few steps)")
    parser.add_argument("--max-steps", type=int, default=None, help="step budget per arm (default 1500, quick 900)")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between evaluations (default 5)")
    parser.add_argument("--repetitions", type=int, default=None, help="seeds to repeat over (default 10, quick 3)")
    parser.add_argument("--hidden", type=int, default=256, help="MLP width (default 256)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sample_priority.exponent (default 1)")
    parser.add_argument("--uniform-mix", type=float, default=0.1, help="sample_priority.uniform_mix (default 0.1)")
    parser.add_argument("--plan-ahead", type=int, default=5,
                        help="steps per plan batch and per table update, as the scheduler's decision interval "
                             "does in the Ray Train path (default 5; 1 = draw and update every step)")
    parser.add_argument("--check-interval", type=int, default=None,
                        help="continuity.check_interval in steps (default: the library's, ContinuityConfig().check_interval)")
    parser.add_argument("--unseen-score", choices=("max", "mean"), default="mean",
                        help="sample_priority.unseen_score (default mean here; the library default, max, first "
                             "visits every sample once, i.e. one epoch, before it can focus)")
    parser.add_argument("--no-ablations", action="store_true",
                        help="skip the ablations priority_beta1 and priority_no_correction")
    parser.add_argument("--arms", type=str, default=None,
                        help=f"comma-separated arms to run (uniform always runs; default all: {', '.join(ARMS)})")
    parser.add_argument("--label-noise", type=float, default=0.0,
                        help="fraction of training labels flipped at random (0-0.5; the test split stays clean)")
    parser.add_argument("--pay-threshold", type=float, default=0.0,
                        help="sample_priority.pay_threshold of every priority arm (default 0: no switch, the "
                             "library's default; 1 measures the switch)")
    parser.add_argument("--holdout-fraction", type=float, default=0.1,
                        help="share of the training set carved off to train rho_loss_holdout's irreducible-loss model")
    parser.add_argument("--il-folds", type=int, default=2,
                        help="folds rho_loss's irreducible-loss models are cross-fitted on (default 2: halves)")
    parser.add_argument("--il-steps", type=int, default=500,
                        help="Adam steps of each of rho_loss's irreducible-loss models (default 500)")


LR_GRID = "1e-3,3e-3,1e-2,3e-2,1e-1"
"""The shared grid, half a decade apart from Adam's usual 1e-3; the JSON's lr_at_grid_edge names an arm whose best is an end."""
_SWEEP_SEED_OFFSET = 1_000  # sweep seeds are seed + 1000 + k, never one of the measured seeds seed + r


def rate_list(text: str) -> tuple[float, ...]:
    """``--lr-grid``: finite learning rates > 0, comma-separated, each once."""
    from pdml_ray.cli.args import positive_list

    return tuple(sorted(positive_list(text, "learning rates", LR_GRID)))


def choose_rates(sweep_trials: dict[float, list[dict[str, Any]]], arm_names: Sequence[str]) -> dict[str, float]:
    """Each arm's best rate of the sweep: the fewest median steps to the target over the sweep's seeds
    (a miss counts as the budget), ties broken by median time to the target, then by the lower rate."""
    def score(lr: float, name: str) -> tuple[float, float, float]:
        per = [t["arms"][name] for t in sweep_trials[lr]]
        return (median([r["steps_bounded"] for r in per]) or 0.0, median([r["time_bounded_s"] for r in per]) or 0.0, lr)

    return {name: min(sweep_trials, key=lambda lr: score(lr, name)) for name in arm_names}


def _trial(imbalance: int, args, seed: int, max_steps: int, eval_every: int, target: float,
           lrs: dict[str, float], stop_when_reached: bool = False, label_noise: float | None = None) -> dict[str, Any]:
    """Every arm of ``lrs`` (name -> its learning rate) on one generated task, interleaved step by step;
    ``stop_when_reached``: end once every arm has reached the target (a sweep needs no more);
    ``label_noise``: None = ``--label-noise`` (the balanced control passes 0: clean data)."""
    import torch

    from pdml_ray.bench.sampling_rho import RHO_ARMS, irreducible_losses
    from pdml_ray.config import ContinuityConfig
    from pdml_ray.priority.sample import SamplePrioritizer

    noise = args.label_noise if label_noise is None else label_noise
    (x, y), (xt, yt) = make_task(imbalance, args.dataset_size, seed, noise)
    x, y, xt, yt = map(torch.from_numpy, (x, y, xt, yt))
    continuity = ContinuityConfig() if args.check_interval is None else ContinuityConfig(check_interval=args.check_interval)
    arms, il_costs = [], {}
    for name, lr in lrs.items():
        sp, selection_s = None, 0.0
        if name in _PRIORITY_ARMS:
            # seed + 1: the table's uniform draws are the uniform arm's (common random numbers, Arm)
            sp = SamplePrioritizer(args.dataset_size, priority_config(args, name), continuity, seed=seed + 1)
        if name in RHO_ARMS:
            assert sp is not None
            il = irreducible_losses(name, x, y, args, seed)
            sp.set_irreducible_losses(np.arange(args.dataset_size), il.losses)
            selection_s = il.train_s + il.infer_s
            il_costs[name] = {"train_s": il.train_s, "infer_s": il.infer_s}
        arms.append(Arm(name, x, y, args, seed, lr, sp, selection_s))
    for step in range(max_steps):
        for arm in arms:
            arm.step(step)
            if step % eval_every == 0 or step == max_steps - 1:
                arm.evaluate(step + 1, xt, yt, target)  # step + 1 = optimizer steps taken
        if stop_when_reached and all(arm.hit_step is not None for arm in arms):
            break
    results = {arm.name: arm.result(max_steps) for arm in arms}
    u = results["uniform"]
    for name, r in results.items():
        r["step_ratio"] = u["steps_bounded"] / r["steps_bounded"]   # uniform / arm, misses as the budget
        r["time_ratio"] = u["time_bounded_s"] / r["time_bounded_s"]
    for name, costs in il_costs.items():
        results[name]["irreducible_model"] = costs
    return {"seed": seed, "imbalance": imbalance, "label_noise": noise, "max_steps": max_steps, "target_value": target,
            "lr": dict(lrs), "arms": results}


def priority_config(args: argparse.Namespace, name: str):
    """The SamplePriorityConfig of priority arm ``name``: the bench's settings and the arm's own fields."""
    from pdml_ray.config import SamplePriorityConfig

    return SamplePriorityConfig(exponent=args.temperature, uniform_mix=args.uniform_mix, unseen_score=args.unseen_score,
                                pay_threshold=args.pay_threshold or None, **_PRIORITY_ARMS[name])


def _arm_summary(trials: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Medians over seeds of one arm; a seed where it missed the target counts as the budget (a bound)."""
    per = [t["arms"][name] for t in trials]
    out: dict[str, Any] = {
        "steps_to_target": median([r["steps_bounded"] for r in per]),
        "time_to_target_s": median([r["time_bounded_s"] for r in per]),
        "step_ratio": median([r["step_ratio"] for r in per]),
        "time_ratio": median([r["time_ratio"] for r in per]),
        "reached": sum(r["reached"] for r in per), "seeds": len(per),
        "step_time_ms": median([r["step_time_ms"] for r in per]),
        "final_minority_f1": median([r["final"].get("minority_f1") for r in per]),
        "final_minority_recall": median([r["final"].get("minority_recall") for r in per]),
        "final_accuracy": median([r["final"].get("accuracy") for r in per]),
    }
    for key in ("priority_overhead_fraction", "continuity_overhead_fraction", "continuity_update_fraction",
                "continuity_check_us", "recalibration_overhead_fraction", "backprop_fraction"):
        if key in per[0]:
            out[key] = median([r[key] for r in per])
    if "priority_stats" in per[0]:  # the pay switch, over seeds: switches and the share of seeds ending on
        out["switches_off"] = median([r["priority_stats"]["switches_off"] for r in per])
        out["switches_on"] = median([r["priority_stats"]["switches_on"] for r in per])
        out["priority_on_at_end"] = sum(bool(r["priority_stats"]["priority_on"]) for r in per)
        out["probes"] = median([r["priority_stats"]["probes"] for r in per])
    if "irreducible_model" in per[0]:
        out["irreducible_model_s"] = median([r["irreducible_model"]["train_s"] + r["irreducible_model"]["infer_s"]
                                             for r in per])
    return out


def _summary(trials: list[dict[str, Any]], arm_names: Sequence[str]) -> dict[str, Any]:
    """The per-arm medians, plus the flat uniform-vs-priority keys earlier JSON had."""
    arms = {name: _arm_summary(trials, name) for name in arm_names}
    u, p = arms["uniform"], arms["priority"]
    out: dict[str, Any] = {
        "steps_to_target_uniform": u["steps_to_target"], "steps_to_target_priority": p["steps_to_target"],
        "step_ratio": p["step_ratio"], "time_to_target_uniform_s": u["time_to_target_s"],
        "time_to_target_priority_s": p["time_to_target_s"], "time_ratio": p["time_ratio"],
        "step_time_uniform_ms": u["step_time_ms"], "step_time_priority_ms": p["step_time_ms"],
        "final_uniform_minority_f1": u["final_minority_f1"], "final_priority_minority_f1": p["final_minority_f1"],
        "final_uniform_minority_recall": u["final_minority_recall"],
        "final_priority_minority_recall": p["final_minority_recall"],
        "reached_uniform": u["reached"], "reached_priority": p["reached"],
    }
    for key in ("priority_overhead_fraction", "continuity_overhead_fraction", "continuity_update_fraction",
                "continuity_check_us", "recalibration_overhead_fraction"):
        out[key] = p[key]
    out["arms"] = arms
    free = [n for n in MODE_ARMS if n in arms]
    out["best_label_free"] = min(free, key=lambda n: (arms[n]["steps_to_target"], arms[n]["time_to_target_s"]))
    return out


def library_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The priority arms' settings that differ from ``SamplePriorityConfig()``'s, as field -> value."""
    from pdml_ray.config import SamplePriorityConfig

    library = SamplePriorityConfig()
    mine = {"exponent": args.temperature, "uniform_mix": args.uniform_mix, "unseen_score": args.unseen_score,
            "pay_threshold": args.pay_threshold or None}
    return {k: v for k, v in mine.items() if getattr(library, k) != v}


def _control_rates(args: argparse.Namespace, grid: Sequence[float], seeds: Sequence[int],
                   max_steps: int) -> dict[str, float]:
    """The balanced control's arms at their own best rates of the grid on the balanced task itself (the
    main sweep's rates are tuned to the imbalanced task: uniform's best there can be far off here)."""
    sweep = {lr: [_trial(1, args, seed, min(max_steps, _CONTROL_STEPS), 1, args.control_target_f1,
                         {n: lr for n in _CONTROL_ARMS}, stop_when_reached=True, label_noise=0.0) for seed in seeds]
             for lr in grid}
    return choose_rates(sweep, _CONTROL_ARMS)


def _verdicts(result: dict[str, Any]) -> str:
    """A priority arm's pay-switch verdicts, 'step:gain:on|off' each (a table line)."""
    return " ".join(f"{step}:{gain:.2g}:{'on' if on else 'off'}" for step, gain, on in result["switch_verdicts"]) or "none"


def choose_arms(args: argparse.Namespace) -> list[str]:
    """The arms of this run, in ``ARMS`` order: ``--arms`` (uniform and priority always run), else all
    but the ablations under ``--no-ablations``."""
    from pdml_ray.errors import UsageError

    if args.arms is None:
        return [n for n in ARMS if not (args.no_ablations and n in ABLATIONS)]
    asked = {a.strip() for a in args.arms.split(",") if a.strip()}
    unknown = asked - set(ARMS)
    if unknown:
        raise UsageError(f"--arms: unknown arm(s) {', '.join(sorted(unknown))}; valid: {', '.join(ARMS)}")
    return [n for n in ARMS if n in asked | {"uniform", "priority"}]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from pdml_ray.bench.common import finish, print_table
    from pdml_ray.errors import UsageError
    from pdml_ray.config import ContinuityConfig

    if not 0.0 <= args.label_noise < 0.5:
        raise UsageError(f"--label-noise must be in [0, 0.5) (a share of labels flipped), got {args.label_noise}")
    if not 0.0 < args.holdout_fraction < 1.0:
        raise UsageError(f"--holdout-fraction must be in (0, 1), e.g. 0.1, got {args.holdout_fraction}")
    if args.il_folds < 2 or args.il_steps < 1:
        raise UsageError(f"--il-folds must be >= 2 and --il-steps >= 1, e.g. 2 and 500, got {args.il_folds} and "
                         f"{args.il_steps}")
    if not args.pay_threshold >= 0.0:
        raise UsageError(f"--pay-threshold must be >= 0 (0 = no switch), got {args.pay_threshold}")
    if args.device != "cpu":  # the JSON must never record a device that was not used
        raise UsageError("--device cuda is not supported here: this benchmark trains a small MLP in one process on the CPU; use --device cpu")
    torch.set_num_threads(1)  # the arms share one core; the machine may be shared
    # Collapses are counted in the JSON (priority_stats); one warning line per collapse would bury the table.
    logging.getLogger("pdml_ray.priority.continuity").setLevel(logging.ERROR)
    reps = args.repetitions or (3 if args.quick else 10)
    max_steps = args.max_steps or (900 if args.quick else 1500)
    check_interval = ContinuityConfig().check_interval if args.check_interval is None else args.check_interval
    arm_names = choose_arms(args)
    overrides = library_overrides(args)
    grid = (args.lr,) if args.lr is not None else args.lr_grid
    sweep_seeds = [args.seed + _SWEEP_SEED_OFFSET + k for k in range(args.sweep_seeds or (1 if args.quick else 3))]
    print("pdml-ray bench sampling: one process, no Ray. Nothing emulated: real generated data, real torch MLP\n"
          f"training on the CPU, real timings; arms {', '.join(arm_names)} interleaved step by step (same init,\n"
          "batch, budget; each arm at its own best rate of one grid). N = 1e7 cost timings use synthetic scores.\n"
          f"priority arms: library defaults except {overrides}")
    # Warm-up, discarded: first calls into torch and numpy (allocators, lazy imports, kernel choice)
    # cost milliseconds once per process and would land on whichever arm runs first.
    _trial(args.imbalance, args, args.seed + 10_000, 60, 30, args.target_f1, {n: grid[0] for n in arm_names})
    sweep: dict[float, list[dict[str, Any]]] = {}
    if len(grid) > 1:
        for lr in grid:  # every arm at every rate, on the sweep's own seeds, until each has reached the target
            sweep[lr] = [_trial(args.imbalance, args, seed, max_steps, args.eval_every, args.target_f1,
                                {n: lr for n in arm_names}, stop_when_reached=True) for seed in sweep_seeds]
            print(f"  sweep lr {lr:g}: steps to F1>={args.target_f1} (median over seeds {sweep_seeds}): "
                  + ", ".join(f"{n} {median([t['arms'][n]['steps_bounded'] for t in sweep[lr]]):g}"
                              for n in arm_names), flush=True)
        lrs = choose_rates(sweep, arm_names)
    else:
        lrs = {n: grid[0] for n in arm_names}
    print("  learning rate per arm: " + ", ".join(f"{n} {lr:g}" for n, lr in lrs.items()), flush=True)
    control_lrs = _control_rates(args, grid, sweep_seeds, max_steps) if len(grid) > 1 else \
        {n: lrs[n] for n in _CONTROL_ARMS}
    print("  balanced control, learning rate per arm (its own sweep): "
          + ", ".join(f"{n} {lr:g}" for n, lr in control_lrs.items()), flush=True)
    runs, controls = [], []
    for r in range(reps):
        seed = args.seed + r
        runs.append(_trial(args.imbalance, args, seed, max_steps, args.eval_every, args.target_f1, lrs))
        # Balanced data reaches the target within tens of steps: evaluate every step to resolve it.
        controls.append(_trial(1, args, seed, min(max_steps, _CONTROL_STEPS), 1, args.control_target_f1, control_lrs,
                               label_noise=0.0))
        a, c = runs[-1]["arms"], controls[-1]["arms"]
        stats = a["priority"]["priority_stats"]
        print(f"  seed {seed}: steps to F1>={args.target_f1}: " + ", ".join(f"{n} {a[n]['steps_to_target']}" for n in arm_names)
              + f"; control {c['uniform']['steps_to_target']} vs {c['priority']['steps_to_target']} (pay switch "
              f"verdicts {_verdicts(c['priority'])}); continuity "
              f"collapses (peaked/flat) {stats['collapsed_peaked']:.0f}/{stats['collapsed_flat']:.0f}")
    summary, control = _summary(runs, arm_names), _summary(controls, ["uniform", "priority"])
    # Both control arms train the whole budget: uniform's training time over priority's is what keeping the
    # switch (off, and its probes) costs over the run, beside the few steps the target takes.
    control["budget_time_ratio"] = median([c["arms"]["uniform"]["train_s"] / c["arms"]["priority"]["train_s"]
                                           for c in controls])
    tree = sumtree_timing(10 if args.quick else 50, args.seed)
    at_scale = continuity_cost_at_scale(args, priority_config(args, "priority"), 200 if args.quick else 1000,
                                        summary["step_time_priority_ms"])
    ablations = {name: {"steps_to_target": summary["arms"][name]["steps_to_target"],
                        "time_to_target_s": summary["arms"][name]["time_to_target_s"],
                        "step_ratio": summary["arms"][name]["step_ratio"],
                        "time_ratio": summary["arms"][name]["time_ratio"],
                        "reached": summary["arms"][name]["reached"], "seeds": reps, "what": ARMS[name]}
                 for name in arm_names if name in ABLATIONS + BASELINES}
    result = {
        "benchmark": "sampling",
        "note": "one process, no Ray: the sampling algorithm and all its overhead on a real (generated) task",
        "target_metric": "minority_f1 (positive-class F1 on a balanced held-out set, threshold 0.5)",
        "target_value": args.target_f1, "imbalance": args.imbalance, "label_noise": args.label_noise,
        "dataset_size": args.dataset_size, "pay_threshold": args.pay_threshold or None,
        "holdout_fraction": args.holdout_fraction, "il_folds": args.il_folds, "il_steps": args.il_steps,
        "label_aware_gap": (summary["arms"]["label_balanced"]["step_ratio"]
                            / summary["arms"][summary["best_label_free"]]["step_ratio"]
                            if "label_balanced" in summary["arms"] else None),
        "batch_size": args.batch_size, "max_steps": max_steps, "repetitions": reps,
        "lr_grid": list(grid), "lr_by_arm": lrs,
        "lr_at_grid_edge": [n for n, lr in lrs.items() if len(grid) > 1 and lr in (grid[0], grid[-1])],
        "lr_sweep": {"seeds": sweep_seeds if sweep else [], "selection": "each arm's fewest median steps to the "
                     "target over the sweep seeds (a miss counts as the budget), ties by time; the measured seeds "
                     "are not among them; a sweep trial ends once every arm has reached the target",
                     "per_rate": {f"{lr:g}": {n: {"steps_to_target": median([t["arms"][n]["steps_bounded"] for t in ts]),
                                                  "time_to_target_s": median([t["arms"][n]["time_bounded_s"] for t in ts]),
                                                  "reached": sum(t["arms"][n]["reached"] for t in ts)}
                                              for n in arm_names} for lr, ts in sweep.items()}},
        "overrides_of_library_defaults": overrides,
        "sample_priority": {"exponent": args.temperature, "uniform_mix": args.uniform_mix,
                            "unseen_score": args.unseen_score},
        "plan_ahead": args.plan_ahead, "continuity_check_interval": check_interval,
        "ratio_direction": RATIO_DIRECTION,
        "misses": "a seed where an arm misses the target counts as the budget (steps, or the arm's training time "
                  "over the budget) in that arm's medians and ratios: medians and ratios are then bounds; "
                  "'reached' says in how many seeds each arm reached the target",
        "arm_descriptions": {n: ARMS[n] for n in arm_names},
        **summary,
        "ablations": ablations,
        "control": {"target_value": args.control_target_f1, "lr_by_arm": control_lrs, **control},
        "sumtree": tree,
        "continuity_cost_at_1e7": at_scale,
        "runs": runs, "control_runs": controls,
    }
    result["targets"] = targets(args, summary, control, tree, at_scale)
    arms = summary["arms"]
    rows = [[n, arms[n]["steps_to_target"], arms[n]["time_to_target_s"], arms[n]["step_ratio"], arms[n]["time_ratio"],
             f"{arms[n]['reached']}/{reps}", arms[n]["final_minority_f1"], arms[n]["final_accuracy"],
             arms[n]["step_time_ms"]] for n in arm_names]
    rows.append(["control: priority", control["steps_to_target_priority"], control["time_to_target_priority_s"],
                 control["step_ratio"], control["time_ratio"], f"{control['reached_priority']}/{reps}", "", "",
                 control["step_time_priority_ms"]])
    rows.append(["control: uniform", control["steps_to_target_uniform"], control["time_to_target_uniform_s"],
                 1.0, 1.0, f"{control['reached_uniform']}/{reps}", "", "", control["step_time_uniform_ms"]])
    print_table(["arm (median over seeds)", "steps", "time (s)", "step ratio", "time ratio", "reached", "final F1",
                 "final acc", "step (ms)"], rows,
                title=f"imbalance {args.imbalance}, label noise {args.label_noise:g}, N={args.dataset_size}, batch {args.batch_size}, {reps} seed(s), "
                      f"lr per arm {', '.join(f'{n} {lr:g}' for n, lr in lrs.items())}, "
                      f"budget {max_steps} steps; ratios {RATIO_DIRECTION}; a miss counts as the budget")
    print(f"priority overhead {summary['priority_overhead_fraction']:.1%} of a priority step; continuity "
          f"{summary['continuity_overhead_fraction']:.3%} of a step (checks {summary['continuity_check_us']:.0f} us "
          f"each, every {check_interval} steps; running sum {summary['continuity_update_fraction']:.3%}), "
          f"recalibrations {summary['recalibration_overhead_fraction']:.3%}")
    print(f"N={at_scale['n']:,} (synthetic scores): continuity {at_scale['incremental_per_step_us']:.2f} us per step "
          f"incremental = {at_scale['incremental_fraction_of_step']:.3%} of a {at_scale['reference_step_ms']:.2f} ms step "
          f"(a full pass would be {at_scale['full_pass_us'] / 1e3:.1f} ms per check = "
          f"{at_scale['full_pass_fraction_of_step']:.1%}); sum-tree draw+update B={tree['batch']}: "
          f"{tree['draw_update_ms_median']:.2f} ms median; the table's plan + update B=1024: "
          f"{at_scale['table_plan_update_ms_median']:.2f} ms median")
    print(f"balanced control over its whole budget ({min(max_steps, _CONTROL_STEPS)} steps, both arms): uniform's "
          f"training time over priority's {control['budget_time_ratio']:.3f}")
    print(f"best label-free arm: {summary['best_label_free']}"
          + (f"; label-aware oversampling is {result['label_aware_gap']:.3g}x its step ratio (it uses the labels)"
             if result["label_aware_gap"] is not None else ""))
    for name, t in result["targets"].items():
        value = "n/a" if t["value"] is None else f"{t['value']:.4g}"
        print(f"  target {'met    ' if t['met'] else 'MISSED '} {name}: {value}")
    return finish(args, result, emulated={
        "nothing": "real compute: a torch MLP trained on the CPU, in one process; no speeds, bandwidth or "
                   "stragglers emulated",
        "synthetic_scores": "the N = 1e7 timings (sumtree, continuity_cost_at_1e7) run on random exponential "
                            "scores, not on a trained model's losses"})
