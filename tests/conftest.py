import atexit
import faulthandler
import os
import sys

import pytest

# Tests must not pick up more threads than the 2-core CI machine has.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
# Ray Train's controller polls its workers every 2 s by default, so each fit waits that long and more to
# see its workers start, report and finish. Measured here: a 2-worker TorchTrainer fit of a loop that
# only reports took 16-18 s warm, 12-13 s at 0.25 s. (Tests only: a user's fit is not changed.)
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")

_status: list[int] = []

_TIERS = {"ray": "ray", "e2e": "e2e", "gpu": "gpu"}
"""Test folder -> the marker every test in it carries (``-m "not ray and not e2e"`` runs the unit tier)."""


def pytest_collection_modifyitems(config, items):
    """Each test carries its tier's marker, from the folder it lives in (tests/ray, tests/e2e, tests/gpu)."""
    for item in items:
        parts = item.path.parts
        tier = next((_TIERS[p] for p in reversed(parts[:-1]) if p in _TIERS), None)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    _status[:] = [int(exitstatus)]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The test runner itself ends with pytest's verdict, skipping interpreter finalization.

    Why: this one process starts and stops a local Ray cluster some 20 times (one per test module). A CI
    run of the whole suite (780 passed) then died of a segmentation fault after pytest's summary, in
    finalization, where Ray's native objects of earlier sessions are torn down (ray-project/ray#31145
    describes this family: Ray restarted in one process). pdml-ray's own threads are joined when their
    owners close and at exit (``PriorityGauges``, the P3 worker's link threads); every process that
    stands for a user's program (the examples, README snippets, guides, the CLI, ``bench``, a job
    submitted to the local cluster) runs as a subprocess whose exit code its test checks, so an exit
    crash there still fails a test. ``faulthandler`` stays on to the end: a crash before this exit
    prints every thread's stack.
    """
    if not _status:
        return
    faulthandler.enable(file=sys.__stderr__, all_threads=True)

    def _exit() -> None:  # registered last, so it runs first among the exit handlers
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_status[0])

    atexit.register(_exit)
