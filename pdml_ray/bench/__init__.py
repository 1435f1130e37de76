"""Benchmarks behind ``pdml-ray bench NAME``: one module per benchmark, looked up by name.

Each module defines ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> dict`` (the JSON
result). Common flags (--quick, --json, --seed, --device) are added by the CLI for every benchmark.

The modules:

    common.py              the flags, machine facts, JSON output and table every benchmark shares
    hetero.py              ``bench hetero``, uniform shares vs node priorities
    sampling.py            ``bench sampling``, uniform vs loss-priority sampling, with ablations
    sampling_arm.py        ``bench sampling``'s generated task and one arm's training run
    sampling_costs.py      ``bench sampling``'s costs at N = 1e7: sum-tree, sample table, continuity check
    sampling_rho.py        ``bench sampling``'s irreducible-loss models for its rho-loss arms
    sampling_targets.py    ``bench sampling``'s targets: each figure's value, target and whether it was met
    pipeline.py            ``bench pipeline``, schedules on the simulator grid
    pipeline_actors.py     ``bench pipeline``'s Ray-actor half (sleep compute mode)
    pipeline_planning.py   ``bench pipeline``'s planning section: the driver's time blocked on plans
    pipeline_scenarios.py  ``bench pipeline``'s non-stationary section: osprey (planning a step ahead) vs the best static order per scenario
    pipeline_torch.py      ``bench pipeline``'s torch-runtime section: registry plans on torch's own pipeline runtime vs torch's schedule classes
    stragglers.py          ``bench stragglers``, every straggler policy on the same seeded delays
    gradients.py           ``bench gradients``, gradient priorities on the straggler runtime
    p3.py                  ``bench p3``, P3 vs FIFO vs bucketed order in both P3 runtimes
    scheduler.py           ``bench scheduler``, the scheduler actor under many workers' reports
"""

BENCHMARKS: dict[str, str] = {
    "gradients": "pdml_ray.bench.gradients",
    "hetero": "pdml_ray.bench.hetero",
    "sampling": "pdml_ray.bench.sampling",
    "p3": "pdml_ray.bench.p3",
    "pipeline": "pdml_ray.bench.pipeline",
    "scheduler": "pdml_ray.bench.scheduler",
    "stragglers": "pdml_ray.bench.stragglers",
}
