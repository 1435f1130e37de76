"""The step-time fits (``pdml_ray.priority.step_fit``) refitted in one vectorised pass over the workers.

``REFERENCE``, ``NODE_DECISIONS`` and ``NODE_LINES`` are frozen from commit 91fd1c5, whose
``StepTimeFit._fit`` refitted one worker at a time in Python and clipped one report at a time: every
line the vectorised fit gives, all at once or one index at a time, must equal the scalar one to 1e-12
relative, and the node deriver must take the same decisions."""

import numpy as np
import pytest

from pdml_ray.config import NodePriorityConfig, PDMLConfig
from pdml_ray.decisions import Boundary, WorkerReport
from pdml_ray.priority.node import NodePriorityDeriver
from pdml_ray.priority.step_fit import REFIT_ONE_BY_ONE, FloatOps, StepTimeFit, fit_lines


def _streams() -> dict[str, tuple[float, int, list[tuple[int, int, float]]]]:
    """Seeded report streams, name -> (ema_alpha, workers, [(worker, batch size, step time s)]), one per
    branch of the fit: batch sizes spread or one size only, noise-free, outliers, both clamps (c >= 0 and
    the minimum slope), a worker of one report, ema_alpha = 1 (no noise estimate)."""
    rng = np.random.default_rng(27)
    fixed, rate = (0.0, 0.005, 0.02, 0.05), (500.0, 1000.0, 2000.0, 4000.0)
    streams = {}

    def stream(workers, count, sizes, seconds):  # seconds(worker, b, k) -> step time (s)
        out = []
        for k in range(count):
            i = int(rng.integers(0, workers))
            b = int(sizes[int(rng.integers(0, len(sizes)))])
            out.append((i, b, float(seconds(i, b, k))))
        return out

    def noisy(i, b, k):
        return (fixed[i] + b / rate[i]) * (1.0 + 0.05 * rng.standard_normal())

    streams["spread"] = (0.1, 4, stream(4, 160, range(16, 129), noisy))
    streams["one_size"] = (0.1, 4, stream(4, 120, (64,), noisy))
    streams["noise_free"] = (0.05, 4, stream(4, 400, (32, 48, 64), lambda i, b, k: fixed[i] + b / rate[i]))

    def outliers(i, b, k):  # one report in 8 far slower or faster than the line
        scale = (3.0 + 3.0 * rng.random(), 1.0 / 3.0)[int(rng.integers(0, 2))] if k % 8 == 7 else 1.0
        return noisy(i, b, k) * scale

    streams["outliers"] = (0.1, 4, stream(4, 200, range(16, 129), outliers))

    def clamps(i, b, k):
        # 0: a negative intercept (c >= 0 binds); 1: noisy times falling with b, 2: noise-free times that do
        # not grow with b (the minimum slope binds); 3: a line of its own
        return (-0.005 + b / 1000.0, (0.3 - b * 1e-4) * (1.0 + 0.01 * rng.standard_normal()), 0.3, 0.01 + b / 800.0)[i]

    clamp_reports = stream(3, 150, range(8, 129), clamps)
    streams["clamps"] = (0.1, 4, clamp_reports + [(3, 40, clamps(3, 40, 0))])  # worker 3: one report only
    streams["alpha_one"] = (1.0, 3, stream(3, 60, range(16, 129), noisy))
    return streams


def _fed(alpha: float, workers: int, reports: list[tuple[int, int, float]]) -> StepTimeFit:
    fit = StepTimeFit(workers, alpha)
    for i, b, t in reports:
        fit.update(i, b, t)
    return fit


def _node_run() -> tuple[list[tuple[int, ...] | None], list[tuple[float, float]]]:
    """The node deriver's decision at every boundary of a seeded run, and its lines (c, s) at the end: 6
    workers with fixed costs, noisy times and one report in 10 three times slower (clipped), flushes of
    5 steps, worker 3 slowing to a third of its rate at step 40, and worker 5 so slow that with
    ``min_batch = 0`` it is idle and probed (its line starts afresh mid-batch)."""
    rng = np.random.default_rng(7)
    fixed = np.array([0.0, 0.01, 0.02, 0.0, 0.005, 0.03])
    rate = np.array([900.0, 1200.0, 2000.0, 600.0, 1500.0, 20.0])
    config = NodePriorityConfig(global_batch_size=384, min_batch=0)
    deriver = NodePriorityDeriver(PDMLConfig(node_priority=config), 6)
    decisions: list[tuple[int, ...] | None] = []
    for first in range(0, 150, 5):
        sizes = deriver.current.batch_sizes
        reports = []
        for step in range(first, first + 5):
            r = rate * np.where(np.arange(6) == 3, 1 / 3 if step >= 40 else 1.0, 1.0)
            times = (fixed + np.asarray(sizes) / r) * (1.0 + 0.03 * rng.standard_normal(6))
            times *= np.where(rng.random(6) < 0.1, 3.0, 1.0)
            # idle workers' reports (0 samples) reach no deriver: the scheduler logs them only
            reports += [WorkerReport(worker_id=w, step=step, samples=sizes[w], compute_s=float(times[w]), step_s=0.1,
                                     loss=1.0) for w in range(6) if sizes[w] > 0]
        deriver.ingest(reports)
        decision = deriver.decide(Boundary(first + 5, 5, sizes), {})
        decisions.append(None if decision is None else tuple(int(b) for b in decision.batch_sizes))
    lines = [deriver.fit.fit(i) for i in range(6)]
    return decisions, [(line.fixed_s, line.slope) for line in lines]


FIELDS = ("fixed_s", "slope", "mean_b", "mean_t", "noise_var", "noise_dof", "cov_cc", "cov_cs", "cov_ss")
REFERENCE = {  # name -> one row of FIELDS per worker, from 91fd1c5's scalar StepTimeFit._fit
    'spread': [
        (0.0, 0.002031056523990826, 79.8481462152998,
         0.1617475267830054, 5.54948397352364e-05, 16.656605885406815,
         1.7261264323893224e-05, -1.789789556922285e-07, 2.2425122575150283e-09),
        (0.0071185252114357, 0.0009531746592788065, 91.57077759307414,
         0.09440723781747845, 3.151281718969853e-05, 15.545982469370443,
         1.6397393172524766e-05, -1.5949703894910788e-07, 1.7432010255966347e-09),
        (0.019231654670434313, 0.0005182971563696817, 73.47164790234123,
         0.05732157371592693, 7.830840558936509e-06, 16.775153990341728,
         2.619208578090306e-06, -2.9985876044605795e-08, 4.0833593215387205e-10),
        (0.050470492463539095, 0.0002507633151157047, 71.011092398246,
         0.06830133580827763, 1.0102954061267288e-05, 16.35738113548541,
         2.7456086700674924e-06, -3.0916376877948205e-08, 4.355797878850907e-10),
    ],
    'one_size': [
        (0.0, 0.001950806962952401, 64.0,
         0.12485164562895366, 3.3916634445379044e-05, 14.471000932267968,
         0.003896983354064592, -6.089036490725925e-05, 9.519548535814695e-07),
        (0.0, 0.0010862643564695943, 64.0,
         0.06952091881405403, 1.5310667535142337e-05, 15.823016333144855,
         0.001208289538187644, -1.8879524034181937e-05, 2.95216475931634e-07),
        (0.0, 0.0008085029772156842, 64.0,
         0.05174419054180379, 5.611634875996707e-06, 17.57437197367467,
         0.000669365313706694, -1.0458833026667093e-05, 1.6349312030120519e-07),
        (0.0, 0.0010505341907322307, 64.0,
         0.06723418820686276, 1.0553947575519095e-05, 16.679805736162006,
         0.0011301090159589555, -1.765795337435868e-05, 2.760518927707219e-07),
    ],
    'noise_free': [
        (0.0, 0.0019999999999999996, 45.79694159792915,
         0.09159388319585829, 2.3260593120246853e-08, 36.616219190037626,
         9.3364540044735e-09, -1.9071023036235285e-10, 4.164258103134169e-12),
        (0.00499998257585776, 0.001000000342609044, 46.878538870661146,
         0.051878538870661156, 7.085337029483294e-09, 36.635312958212396,
         2.3447518416940846e-09, -4.6104604482418425e-11, 9.83490914232367e-13),
        (0.019999836865046892, 0.0005000033122264935, 46.1548292418351,
         0.04307741462091756, 9.117178807236185e-09, 36.32792185381264,
         3.784044073640881e-09, -7.68297093524526e-11, 1.6646091000081581e-12),
        (0.0499997625300219, 0.00025000500367007225, 44.27134642263497,
         0.06106783660565874, 1.1469779374321915e-08, 36.57499595209747,
         4.427932274946159e-09, -9.32998452442688e-11, 2.1074551046586133e-12),
    ],
    'outliers': [
        (0.0025678026350472736, 0.0019157134858910755, 77.89312933763034,
         0.15179437482152683, 0.00023851271375197446, 16.828078083682154,
         8.513338667972884e-05, -9.325273156567936e-07, 1.1998241527139702e-08),
        (0.046542289247846834, 0.00041515716933660494, 68.75104748785584,
         0.07625865919730983, 0.0006943526494378736, 17.083869363163657,
         0.000246317948603169, -3.1396477499934314e-06, 4.681870884934011e-08),
        (0.0148084405341332, 0.0005486703565128199, 67.10369228496386,
         0.051673989417666294, 3.9699997424700335e-05, 16.493239370777435,
         1.3570290403368378e-05, -1.708083652176794e-07, 2.5536455910859084e-09),
        (0.05550897441145813, 0.00020642460710988155, 67.51633766949313,
         0.06970684596047363, 0.00010734543212358714, 16.83838997057831,
         3.339628464882651e-05, -4.124174850348969e-07, 6.1371137640341056e-09),
    ],
    'clamps': [
        (0.0, 0.000943615175791331, 73.88837574720046,
         0.06888837574720046, 4.672939205031324e-06, 16.92135859303916,
         1.4795201792564759e-06, -1.668449704411096e-08, 2.258538098166475e-10),
        (0.2938839430472416, 4.768818515282273e-06, 61.69215925945331,
         0.29419871132422365, 2.750761854984571e-05, 16.207997183857554,
         4.941345149134563e-06, -5.555302900709713e-08, 9.005507012446933e-10),
        (0.29969977754133326, 3.6652880964151693e-06, 81.84895487299201,
         0.3, 3.1558441742218516e-07, 16.90168602452518,
         8.703219825173178e-08, -8.592818483099072e-10, 1.0498392892907365e-11),
        (6.672013369141565e-18, 0.0015, 40.0,
         0.060000000000000005, 3.6000000000000014e-05, 1.8,
         0.0009000000000000004, -2.2500000000000008e-05, 5.850000000000002e-07),
    ],
    'alpha_one': [
        (0.0, 0.0017877661242129883, 85.0,
         0.151960120558104, 0.0, 0.0,
         0.0, 0.0, 0.0),
        (0.0, 0.0010025571739821404, 58.0,
         0.058148316090964144, 0.0, 0.0,
         0.0, 0.0, 0.0),
        (0.0, 0.0007172603335735733, 105.0,
         0.0753123350252252, 0.0, 0.0,
         0.0, 0.0, 0.0),
    ],
}
NODE_DECISIONS = [
    (80, 90, 55, 53, 105, 1),
    None,
    (62, 82, 81, 47, 112, 0),
    None,
    None,
    None,
    (65, 67, 109, 43, 100, 0),
    None,
    None,
    None,
    (68, 72, 110, 29, 105, 0),
    (73, 75, 124, 0, 111, 1),
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    (73, 75, 123, 1, 111, 1),
    (69, 75, 116, 15, 109, 0),
    None,
    None,
    None,
    None,
    None,
    None,
    None,
]
"""The node deriver's decision at each boundary of ``_node_run``, from 91fd1c5."""
NODE_LINES = [
    (0.002108091732776837, 0.0011223523386990999),
    (2.5724676251360052e-06, 0.0010192358642960343),
    (0.0017987864127328574, 0.0006687215433582313),
    (0.0, 0.005030895993396529),
    (0.0001106593298443921, 0.000711392204178049),
    (0.03199615877922102, 0.05018469392568645),
]
"""Its lines (c, s) at the end of the run, from 91fd1c5."""


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= 1e-12 * abs(want)  # an exact 0 (a clamp, no noise estimate) must stay 0


def _row(fields, i=None):
    return [fields[f] if i is None else fields[f][i] for f in FIELDS]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_lines_over_arrays_and_on_floats_are_the_scalar_fits(name):
    alpha, workers, reports = _streams()[name]
    fit = _fed(alpha, workers, reports)
    over_arrays = fit_lines(fit.stats)  # every worker in one pass
    for i, want in enumerate(REFERENCE[name]):
        on_floats = fit_lines({k: float(v[i]) for k, v in fit.stats.items()}, FloatOps)  # one worker
        for path, row in (("arrays", _row(over_arrays, i)), ("floats", _row(on_floats))):
            bad = [(f, g, w) for f, g, w in zip(FIELDS, row, want) if not _close(g, w)]
            assert not bad, f"{name} worker {i} on {path}: {bad}"
    lines = fit.lines()
    assert all(fit.fit(i) == lines.line(i) for i in range(workers))
    assert np.array_equal(fit.values, 1.0 / lines.slope)


def test_many_stale_lines_are_refitted_in_one_pass_as_one_by_one():
    rng = np.random.default_rng(11)
    fit = StepTimeFit(64, 0.1)
    fit.ingest([(int(rng.integers(0, 64)), float(rng.integers(8, 128)), float(0.01 + rng.random() * 0.2))
                for _ in range(2000)])
    assert int(fit.measured.sum()) > REFIT_ONE_BY_ONE  # lines() takes the pass over arrays
    lines = fit.lines()
    over_arrays = {f: getattr(lines, f) for f in FIELDS}
    for i in range(64):
        on_floats = fit_lines({k: float(v[i]) for k, v in fit.stats.items()}, FloatOps)
        assert all(_close(g, w) for g, w in zip(_row(over_arrays, i), _row(on_floats))), i


def test_the_streams_reach_every_branch():
    # what the table pins: the clamps bind, one worker has one report, ema_alpha = 1 has no noise estimate
    ref = REFERENCE
    assert ref["clamps"][0][0] == 0.0 and ref["clamps"][0][1] > 0  # c >= 0: the line through the origin
    for i in (1, 2):  # the minimum slope: 1e-3 of the proportional model's
        assert ref["clamps"][i][1] == pytest.approx(1e-3 * ref["clamps"][i][3] / ref["clamps"][i][2], rel=1e-12)
    assert ref["alpha_one"][0][4] == 0.0 and ref["alpha_one"][0][5] == 0.0
    assert all(row[0] == 0.0 for row in ref["one_size"])  # one batch size: the proportional model
    assert _fed(*_streams()["clamps"]).stats["w"][3] == pytest.approx(1.0)


def test_stale_lines_are_refitted_alone_and_equal_a_fresh_fit():
    alpha, workers, reports = _streams()["outliers"]
    fit = _fed(alpha, workers, reports[:100])
    fit.lines()
    for i, b, t in reports[100:110]:  # a few workers' lines go stale
        fit.update(i, b, t)
    fresh = StepTimeFit(workers, alpha)
    fresh.load_state_dict(fit.state_dict())
    kept, refitted = fit.lines(), fresh.lines()
    for name in FIELDS:
        assert np.array_equal(getattr(kept, name), getattr(refitted, name)), name


def test_node_decisions_and_lines_are_unchanged():
    # batches of reports clipped against their workers' lines as of the batch's start, one of them new
    # (its first report unclipped), one probed (its line reset mid-batch)
    decisions, lines = _node_run()
    assert decisions == NODE_DECISIONS
    assert sum(d is not None and d[5] == 1 for d in decisions) >= 2 and any(d and d[3] == 0 for d in decisions)
    for (c, s), (c_ref, s_ref) in zip(lines, NODE_LINES):
        assert _close(c, c_ref) and _close(s, s_ref)
