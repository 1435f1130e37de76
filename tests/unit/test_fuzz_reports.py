"""Issue 22, "nothing from outside poisons the scheduler": seeded fuzzing of report sequences.

Each of ``SEQUENCES`` generated sequences drives one ``Scheduler`` with the node, sample and gradient
derivers on (a random config, worker count and data set size) through a random mix of operations:
report batches (``WorkerReport`` lists and packed rows, valid or adversarial: extreme, NaN, infinite,
negative and huge values, wrong types, out-of-range ids and sample indices, distinct steps, one
diverged 1e18 loss), ``bundle()`` calls (sound boundaries and garbage ones), and ``state_dict()`` ->
``state_format`` blob -> ``load_state_dict()`` round trips into a fresh scheduler that the sequence then continues on.

A crash is any of: an exception out of ``report``/``bundle``/``load_state_dict`` other than a
``PDMLError`` with a message of one or two lines; a published decision that fails its ``validate``
(node sizes summing to the global batch within min/max, one per worker; sample plans sized by the node
decision in force, indices in the data set; gradient priorities one per worker); a negative or
non-finite score in the sample table, or a table sum (of scores, of the tree's leaves) that is not the
sum of its items; a state that does not reload. Deterministic: sequence i is seeded with ``SEED + i``.
``pytest -s`` prints the counts.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from pdml_ray.client import PackedReports
from pdml_ray.config import (ContinuityConfig, GradientPriorityConfig, NodePriorityConfig, PDMLConfig,
                             SamplePriorityConfig)
from pdml_ray.decisions import Boundary, GradientDecision, NodeDecision, SampleDecision, WorkerReport
from pdml_ray.errors import PDMLError
from pdml_ray.scheduler import Scheduler
from pdml_ray.state_format import dumps, loads

SEED = 20261222
SEQUENCES = 3000

NASTY_NUMBERS = [math.nan, math.inf, -math.inf, -1.0, 0.0, -0.0, 5e-324, 1e-300, 1e-7, 1e9, 1e18, 1e300, 1.7e308,
                 10**30, -(10**30), 2**63, 10**5000, -1, 0, True, None, "1", b"x", [1.0], (), {}, np.float32(np.nan),
                 np.int64(3), np.float64(2.5), complex(1, 1)]


class Fuzz:
    """One sequence: its generator, scheduler and what it found."""

    def __init__(self, seed: int, counts: Counter[str]) -> None:
        self.rng = np.random.default_rng(seed)
        self.counts = counts
        self.crashes: list[str] = []
        rng = self.rng
        self.n = int(rng.choice([1, 2, 3, 4, 8]))
        self.batch = int(rng.integers(self.n, 8 * self.n + 1))
        self.num_samples = int(rng.choice([1, 3, 50, 300]))
        self.step = 0
        min_batch = int(rng.integers(0, 2))
        sample = SamplePriorityConfig(staleness_decay=float(rng.choice([0.0, 0.1, 0.5])),
                                      stale_after=int(rng.choice([1, 3, 50])), exponent=float(rng.choice([0.5, 1.0, 3.0])),
                                      score=str(rng.choice(["loss", "loss_ema"])), replacement=bool(rng.random() < 0.8))
        self.config = PDMLConfig(
            node_priority=NodePriorityConfig(global_batch_size=self.batch, warmup_steps=int(rng.integers(0, 3)),
                                             min_batch=min_batch, hysteresis=float(rng.choice([0.0, 0.01]))),
            sample_priority=sample, gradient_priority=GradientPriorityConfig(),
            continuity=ContinuityConfig(check_interval=int(rng.choice([1, 5]))))
        self.s = Scheduler(self.config, self.n, max_log_rows=256)  # a small report log: 12 MB per scheduler otherwise
        self.s.set_dataset_size(self.num_samples)
        self.since: dict[str, int] = {}

    # -- inputs -------------------------------------------------------------------------------------
    def nasty(self) -> object:
        return NASTY_NUMBERS[int(self.rng.integers(len(NASTY_NUMBERS)))]

    def report(self) -> WorkerReport:
        rng = self.rng
        w = int(rng.integers(self.n))
        samples = int(rng.integers(1, 2 * self.batch + 1))
        fields: dict[str, object] = dict(worker_id=w, step=self.step, samples=samples,
                                         compute_s=float(samples / rng.uniform(100.0, 5000.0) + rng.uniform(0, 0.01)),
                                         wait_s=float(rng.uniform(0, 0.01)), loss=float(rng.exponential()),
                                         grad_norm=float(rng.exponential()))
        if rng.random() < 0.6:
            k = int(rng.integers(0, 2 * self.batch + 1))
            fields["sample_indices"] = rng.integers(0, self.num_samples, k).astype(np.int64)
            fields["sample_losses"] = rng.exponential(size=k)
        if rng.random() < 0.35:  # adversarial: one field (or a few) wrong
            for _ in range(int(rng.integers(1, 3))):
                self.corrupt(fields)
        return WorkerReport(**fields)  # type: ignore[arg-type]

    def corrupt(self, fields: dict[str, object]) -> None:
        rng = self.rng
        kind = int(rng.integers(9))
        if kind == 0:
            fields[str(rng.choice(["worker_id", "step", "samples", "compute_s", "wait_s", "step_s", "overhead_s",
                                   "loss", "grad_norm", "accelerator_type"]))] = self.nasty()
        elif kind == 1:
            fields["worker_id"] = int(rng.choice([-1, self.n, 10**9]))
        elif kind == 2:  # out-of-range sample indices
            k = int(rng.integers(1, 5))
            fields["sample_indices"] = rng.integers(-3, self.num_samples + 3, k).astype(np.int64)
            fields["sample_losses"] = rng.exponential(size=k)
        elif kind == 3:  # extreme per-sample losses: one diverged, huge, negative, NaN
            k = int(rng.integers(1, 6))
            fields["sample_indices"] = rng.integers(0, self.num_samples, k).astype(np.int64)
            losses = rng.exponential(size=k)
            losses[int(rng.integers(k))] = float(rng.choice([1e18, 1e30, 1e200, 1e308, -5.0, np.nan, np.inf, 5e-324]))
            fields["sample_losses"] = losses
        elif kind == 4:  # arrays of the wrong shape, dtype or type
            bad = [np.zeros((2, 2)), np.array(["a"]), [1, 2], np.array([1.5]), np.array([], dtype=np.int64), None]
            fields["sample_indices"] = bad[int(rng.integers(len(bad)))]
            fields["sample_losses"] = bad[int(rng.integers(len(bad)))]
        elif kind == 5:
            fields["step"] = int(rng.choice([2**62, 2**62 + 1, -5, 10**6]))
        elif kind == 6:  # idle, or an impossible rate
            fields["samples"] = int(rng.choice([0, 10**7, 2**41]))
        elif kind == 7:
            fields["compute_s"] = float(rng.choice([1e-9, 1e7, 0.0, -1.0, 1e-6, 1e6]))
        else:
            fields["loss"] = float(rng.choice([1e300, -1e300, 1e18, -0.0]))

    def batch_of_reports(self) -> list[WorkerReport] | PackedReports:
        rng = self.rng
        reports: list[object] = [self.report() for _ in range(int(rng.integers(0, 2 * self.n + 2)))]
        if rng.random() < 0.1:
            reports.append(self.nasty())  # not a report at all
        self.counts["reports"] += len(reports)
        if rng.random() < 0.3:
            rows: list[object] = [(r.worker_id, r.step, r.samples, r.compute_s, r.wait_s, r.step_s, r.overhead_s,
                                   r.loss, r.grad_norm, r.accelerator_type, r.sample_indices, r.sample_losses)
                                  if isinstance(r, WorkerReport) else r for r in reports]
            if rows and rng.random() < 0.2:
                rows[0] = tuple(rows[0])[:5] if isinstance(rows[0], tuple) else (1, 2)  # a short row
            packed = PackedReports(rows)  # type: ignore[arg-type]
            if rng.random() < 0.05:
                packed = PackedReports(self.nasty())  # type: ignore[arg-type]
            return packed
        return reports  # type: ignore[return-value]

    # -- checks -------------------------------------------------------------------------------------
    def crash(self, what: str) -> None:
        self.crashes.append(what)

    def call(self, what: str, fn, *args) -> object:  # type: ignore[no-untyped-def]
        try:
            return fn(*args)
        except PDMLError as e:
            text = str(e)
            self.counts[f"{what} refused"] += 1
            if text.count("\n") > 1 or len(text) > 600:
                self.crash(f"{what}: a {len(text)}-character, {text.count(chr(10)) + 1}-line message")
        except Exception as e:  # noqa: BLE001 - what the fuzzer is looking for
            self.crash(f"{what}: {type(e).__name__}: {str(e)[:120]}")
        return None

    def check_decisions(self, bundle: object) -> None:
        node_cfg = self.config.node_priority
        assert node_cfg is not None
        node = self.s.decision("node")
        for name, d in getattr(bundle, "decisions", {}).items():
            try:
                if isinstance(d, NodeDecision):
                    d.validate(self.batch, node_cfg.min_batch, node_cfg.max_batch, self.n)
                elif isinstance(d, SampleDecision):
                    sizes = node.batch_sizes if isinstance(node, NodeDecision) else None
                    for plan in d.plans:
                        plan.validate(sizes, self.num_samples)
                elif isinstance(d, GradientDecision):
                    d.validate(self.n)
                else:
                    raise AssertionError(f"{name}: a {type(d).__name__}")
            except (PDMLError, AssertionError) as e:
                self.crash(f"published {name} decision fails validate: {str(e)[:120]}")

    def check_table(self) -> None:
        table = self.s.derivers["sample"].table  # type: ignore[attr-defined]
        scores = table.scores[table.seen]
        if scores.size and not (np.all(np.isfinite(scores)) and scores.min() >= 0.0):
            self.crash("negative or non-finite scores in the sample table")
        elif not math.isclose(table.seen_sum, math.fsum(scores), rel_tol=1e-6, abs_tol=1e-9):
            self.crash(f"table sum {table.seen_sum!r} vs its scores' {math.fsum(scores)!r}")
        elif not math.isclose(table.tree.total, math.fsum(table.tree.values()), rel_tol=1e-9, abs_tol=1e-300):
            self.crash(f"tree total {table.tree.total!r} vs its leaves' {math.fsum(table.tree.values())!r}")

    # -- a sequence ---------------------------------------------------------------------------------
    def run(self, operations: int) -> None:
        rng = self.rng
        for _ in range(operations):
            op = rng.random()
            self.counts["operations"] += 1
            if op < 0.6:
                self.call("report", self.s.report, self.batch_of_reports())
                self.step += int(rng.choice([0, 1, 1, 1, 7]))
            elif op < 0.85:
                self.counts["bundles"] += 1
                node = self.s.decision("node")
                sizes = node.batch_sizes if isinstance(node, NodeDecision) else (1,) * self.n
                boundary: object = Boundary(self.step, int(rng.integers(1, 4)), sizes)
                since: object = self.since
                if rng.random() < 0.1:  # garbage from a confused client
                    boundary = Boundary(self.nasty(), self.nasty(), self.nasty())  # type: ignore[arg-type]
                elif rng.random() < 0.05:
                    since = self.nasty()
                bundle = self.call("bundle", self.s.bundle, boundary, since)
                if bundle is not None:
                    self.check_decisions(bundle)
                    self.since.update({k: d.version for k, d in getattr(bundle, "decisions", {}).items()})
            else:
                self.counts["round trips"] += 1
                state = self.call("state_dict", self.s.state_dict)
                fresh = Scheduler(self.config, self.n, max_log_rows=256)
                try:
                    fresh.load_state_dict(loads(dumps(state), "the fuzzed scheduler state"))
                except Exception as e:  # noqa: BLE001 - a state the scheduler wrote must load back
                    self.crash(f"state does not reload: {type(e).__name__}: {str(e)[:120]}")
                else:
                    self.s = fresh
            self.check_table()


def test_seeded_report_sequences_never_crash_the_scheduler(capsys):
    counts: Counter[str] = Counter()
    crashes: Counter[str] = Counter()
    crashed_sequences = 0
    for i in range(SEQUENCES):
        fuzz = Fuzz(SEED + i, counts)
        fuzz.run(int(fuzz.rng.integers(4, 16)))
        counts["reports accepted"] += fuzz.s.reports_received  # the counters travel through the round trips
        counts["reports rejected"] += fuzz.s.reports_rejected
        counts["deriver errors"] += sum(fuzz.s.deriver_errors.values())
        crashed_sequences += bool(fuzz.crashes)
        crashes.update(c.split(":")[0] + ": " + c.split(":")[1][:40] if ":" in c else c for c in fuzz.crashes)
    with capsys.disabled():
        print(f"\nreport sequences: {SEQUENCES} (seeds {SEED}..{SEED + SEQUENCES - 1}), {dict(counts)}; "
              f"crashed sequences {crashed_sequences}, crashes {sum(crashes.values())}: {dict(crashes.most_common(12))}")
    assert crashed_sequences == 0, crashes.most_common(12)
