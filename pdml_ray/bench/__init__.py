"""Benchmarks behind ``pdml-ray bench NAME``: one module per benchmark, looked up by name.

Each module defines ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> dict`` (the JSON
result). Common flags (--quick, --json, --seed, --device) are added by the CLI for every benchmark.
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
