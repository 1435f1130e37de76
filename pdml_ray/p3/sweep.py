"""P3 / FIFO / per-layer FIFO / DDP-bucketed side by side over a range of bandwidths: where P3's gain appears.

    python -m pdml_ray.p3.sweep [--models vgg19 resnet50 gpt] [--ratios 0.5 1 2] [--no-auto] [--json FILE]

Each row: one model at one comm/compute ratio (the bandwidth at which sending the whole model takes
``ratio`` x its compute), the simulated iteration time of each policy (``pdml_ray.p3.simulate``), the
bound max(compute, communication), and the P3 slice size and credit used (``auto``: chosen per
bandwidth by ``pdml_ray.p3.auto.tune``). Bandwidth is EMULATED and compute MODELLED from FLOPs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pdml_ray.p3.auto import tune
from pdml_ray.p3.link import EMULATION_NOTE, LinkModel
from pdml_ray.p3.models import ModelProfile, model_profile
from pdml_ray.p3.simulate import P3_SLICE_ELEMENTS, bandwidth_for_ratio, simulate_iteration


@dataclass(frozen=True, slots=True)
class SweepRow:
    model: str
    ratio: float  # communication / compute
    bandwidth_gbps: float
    p3_s: float
    fifo_s: float
    layer_fifo_s: float  # one message per layer, no slicing: the P3 paper's baseline
    bucketed_s: float
    bound_s: float
    p3_slice_elements: int
    p3_credit_bytes: float | None

    @property
    def p3_vs_fifo(self) -> float:
        return self.p3_s / self.fifo_s

    @property
    def p3_vs_layer_fifo(self) -> float:
        return self.p3_s / self.layer_fifo_s

    @property
    def p3_vs_best_baseline(self) -> float:
        return self.p3_s / min(self.fifo_s, self.layer_fifo_s, self.bucketed_s)


def sweep(profile: ModelProfile, ratios: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0),
          latency_s: float = 50e-6, overhead_s: float = 5e-6, auto: bool = True,
          slice_elements: int = P3_SLICE_ELEMENTS, credit_bytes: float | None = None,
          allreduce: bool = False) -> list[SweepRow]:
    """P3 / FIFO / bucketed at several comm/compute ratios (bandwidth EMULATED). With ``auto`` the P3
    slice size and credit come from ``pdml_ray.p3.auto.tune`` for each bandwidth; otherwise the given
    ones (credit None: four slices)."""
    rows = []
    for ratio in ratios:
        link = LinkModel(bandwidth_for_ratio(profile, ratio), latency_s, overhead_s)
        if auto:
            choice = tune(link, profile)
            slices, credit = choice.slice_elements, choice.credit_bytes
        else:
            slices = slice_elements
            credit = credit_bytes if credit_bytes is not None else 4.0 * slice_elements * profile.element_size
        p3 = simulate_iteration(profile, "p3", link, slice_elements=slices, credit_bytes=credit, allreduce=allreduce)
        fifo = simulate_iteration(profile, "fifo", link, slice_elements=slice_elements, allreduce=allreduce)
        layer = simulate_iteration(profile, "layer-fifo", link, slice_elements=slice_elements, allreduce=allreduce)
        bucketed = simulate_iteration(profile, "bucketed", link, slice_elements=slice_elements, allreduce=allreduce)
        rows.append(SweepRow(profile.name, ratio, link.bandwidth_Bps * 8 / 1e9, p3.iteration_s, fifo.iteration_s,
                             layer.iteration_s, bucketed.iteration_s, p3.bound_s, slices, credit))
    return rows


def format_sweep(rows: list[SweepRow]) -> str:
    lines = [f"# {EMULATION_NOTE}; compute MODELLED from FLOPs",
             f"{'model':9s} {'comm/comp':>9s} {'Gb/s':>7s} {'p3 ms':>8s} {'fifo ms':>8s} {'layer ms':>8s} "
             f"{'bucket ms':>9s} {'bound ms':>8s} {'p3/fifo':>7s} {'p3/layer':>8s} {'p3/best':>7s} {'slice':>7s} "
             f"{'credit KB':>9s}"]
    for r in rows:
        credit = f"{r.p3_credit_bytes / 1e3:9.0f}" if r.p3_credit_bytes is not None else f"{'-':>9s}"
        lines.append(f"{r.model:9s} {r.ratio:9.2f} {r.bandwidth_gbps:7.2f} {r.p3_s * 1e3:8.2f} {r.fifo_s * 1e3:8.2f} "
                     f"{r.layer_fifo_s * 1e3:8.2f} {r.bucketed_s * 1e3:9.2f} {r.bound_s * 1e3:8.2f} "
                     f"{r.p3_vs_fifo:7.3f} {r.p3_vs_layer_fifo:8.3f} {r.p3_vs_best_baseline:7.3f} "
                     f"{r.p3_slice_elements:7d} {credit}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="P3 vs FIFO vs per-layer FIFO vs DDP-bucketed, simulated "
                                                 "(bandwidth EMULATED)")
    parser.add_argument("--models", nargs="+", default=["vgg19", "resnet50", "gpt"])
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.25, 0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--latency-us", type=float, default=50.0)
    parser.add_argument("--overhead-us", type=float, default=5.0)
    parser.add_argument("--no-auto", action="store_true", help="P3 at 40,000-element slices and a 4-slice credit")
    parser.add_argument("--allreduce", action="store_true",
                        help="all-reduce instead of push/pull (ratio: the all-reduce's time / compute)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows = [r for m in args.models for r in sweep(model_profile(m), tuple(args.ratios), args.latency_us * 1e-6,
                                                   args.overhead_us * 1e-6, auto=not args.no_auto,
                                                   allreduce=args.allreduce)]
    print(format_sweep(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"emulated": {"bandwidth": EMULATION_NOTE, "compute": "modelled from FLOPs"},
                       "rows": [asdict(r) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
