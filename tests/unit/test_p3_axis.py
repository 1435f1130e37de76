"""P3's slice size and credit as an axis of the one scheduler: decided by ``p3.auto``'s rule from the
measured link, the config's own values published unchanged with auto off, bad link reports refused
whole, saved and restored as data, replayed exactly (no Ray)."""

from __future__ import annotations

import math
import re

import pytest

from pdml_ray.config import P3Config, PDMLConfig
from pdml_ray.decisions import Boundary, P3Decision
from pdml_ray.errors import PlanError, StateError
from pdml_ray.p3.auto import tune
from pdml_ray.p3.link import LinkModel
from pdml_ray.priority.registry import DERIVERS
from pdml_ray.replay import recorded, replay
from pdml_ray.scheduler import Scheduler
from pdml_ray.state_format import dumps, loads

GBPS_1 = 1e9 / 8  # bytes/s of a 1 Gb/s link


def _scheduler(**p3) -> Scheduler:
    return Scheduler(PDMLConfig(p3=P3Config(**p3), replay_log=1000), 2)


def _bundle(s: Scheduler, step: int) -> P3Decision | None:
    d = s.bundle(Boundary(step, 5, ()), {"p3": s.versions["p3"]}).get("p3")
    assert d is None or isinstance(d, P3Decision)
    return d


def test_the_p3_axis_is_registered_and_built_from_its_section_alone():
    assert DERIVERS["p3"].config_field == "p3"
    s = _scheduler()
    assert list(s.derivers) == ["p3"] and s.config.node_priority is None


def test_a_fixed_config_is_published_unchanged_and_stays_whatever_is_measured():
    s = _scheduler(slice_elements=20_000, credit_bytes=160_000)
    first = s.bundle(Boundary(0, 5, ()), {}).get("p3")
    assert isinstance(first, P3Decision) and first.version == 0 and first.effective_step == 0
    assert (first.slice_elements, first.credit_bytes, first.method) == (20_000, 160_000, "config")
    assert math.isnan(first.bandwidth_Bps)
    assert s.observe("p3", 3, [(GBPS_1, 1e-4, 0.0)])
    assert _bundle(s, 5) is None  # auto off: the config's choice stands
    stats = s.stats().derivers["p3"]
    assert stats.observations == 1 and stats.bandwidth_Bps == GBPS_1 and stats.method == "config"
    assert "slice 20,000 elements, credit 160,000 bytes (config)" in stats.summary_lines()[0]
    # credit None: four slices, as P3Config says
    assert s.decision("p3").credit_bytes == 160_000
    assert _scheduler(slice_elements=1000).decision("p3").credit_bytes == 4 * 1000 * 4


def test_auto_decides_by_the_rule_of_p3_auto_from_the_slowest_measured_link():
    s = _scheduler(auto=True)
    assert s.decision("p3").method == "config" and s.decision("p3").slice_elements == 40_000
    assert _bundle(s, 5) is None  # nothing measured yet
    # two links: the slowest bandwidth, the longest latency and overhead decide
    assert s.observe("p3", 3, [(10 * GBPS_1, 50e-6, 20e-6), (GBPS_1, 200e-6, 5e-6)])
    d = _bundle(s, 5)
    want = tune(LinkModel(GBPS_1, 200e-6, 20e-6))
    assert d is not None and d.method == "rule" and d.version == 1 and d.effective_step == 5
    assert (d.slice_elements, d.credit_bytes) == (want.slice_elements, round(want.credit_bytes))
    # the rule's numbers: overhead 20 us at 1 Gb/s over 2% of a slice's wire time -> >= 31,250 elements,
    # rounded up to 31,744; the bandwidth-delay product (25 KB) plus a slice is 2 slices' worth
    assert d.slice_elements == 31_744 and d.credit_bytes == 2 * 31_744 * 4
    assert (d.bandwidth_Bps, d.latency_s, d.overhead_s) == (GBPS_1, 200e-6, 20e-6)
    # the same link again: the same choice, so no new decision (a switch would only flush the runtimes)
    assert s.observe("p3", 8, [(GBPS_1, 200e-6, 20e-6)])
    assert _bundle(s, 10) is None
    # a 10x faster link: larger slices (the overhead is a smaller share of each)
    assert s.observe("p3", 13, [(10 * GBPS_1, 200e-6, 20e-6)])
    d2 = _bundle(s, 15)
    assert d2 is not None and d2.version == 2 and d2.slice_elements == 313_344 > d.slice_elements
    assert [h.method for h in s.history["p3"]] == ["config", "rule", "rule"]
    stats = s.stats().derivers["p3"]
    assert stats.decisions == 2 and stats.observations == 3 and stats.slice_elements == 313_344
    gauges = {g.name: g.value for g in s.stats().gauges()}
    assert gauges["pdml_p3_slice_bytes"] == 313_344 * 4 and gauges["pdml_p3_decisions_total"] == 2
    for name in (n for n in gauges if n.startswith("pdml_p3_")):  # Prometheus' conventions: the unit (or _total for a count) ends the name
        assert re.fullmatch(r"pdml_[a-z0-9_]+", name) and name.endswith(("_bytes", "_bytes_per_second", "_total"))


def test_the_element_size_enters_the_rule():
    s = _scheduler(auto=True, element_size=2)
    s.observe("p3", 0, [(GBPS_1, 0.0, 20e-6)])
    d = _bundle(s, 5)
    assert d is not None and d.slice_elements == tune(LinkModel(GBPS_1, 0.0, 20e-6), element_size=2).slice_elements
    assert d.slice_elements == 63_488  # >= 62,500 two-byte elements (twice 31,250), rounded up to 1,024s


@pytest.mark.parametrize("rows", [[], "fast", [(0.0, 0.0, 0.0)], [(-1.0, 0.0, 0.0)], [(GBPS_1, -1e-6, 0.0)],
                                  [(GBPS_1, 0.0, float("nan"))], [(float("inf"), 0.0, 0.0)], [(GBPS_1, 0.0)],
                                  [[GBPS_1, 0.0, 0.0]], [(True, 0.0, 0.0)], [(1e14, 0.0, 0.0)], [(GBPS_1, 11.0, 0.0)]])
def test_a_bad_link_report_is_refused_whole_and_counted(rows):
    s = _scheduler(auto=True)
    before = s.derivers["p3"].state_dict()
    assert not s.observe("p3", 1, [(GBPS_1, 0.0, 0.0)] + list(rows) if isinstance(rows, list) and rows else rows)
    assert s.derivers["p3"].state_dict() == before
    assert s.rejected_by_kind == {"p3": 1}
    assert _bundle(s, 5) is None


def test_the_decision_refuses_what_no_run_could_send():
    good = P3Decision(version=0, effective_step=0, slice_elements=4096, credit_bytes=32_768, method="rule",
                      bandwidth_Bps=GBPS_1, latency_s=0.0, overhead_s=0.0)
    good.validate()
    for bad in ({"slice_elements": 0}, {"credit_bytes": 2.5}, {"method": "guess"}, {"bandwidth_Bps": float("nan")},
                {"latency_s": -1.0}, {"slice_elements": True}):
        with pytest.raises(PlanError):
            P3Decision(**{**good.to_dict(), **bad}).validate()
    with pytest.raises(PlanError, match="missing"):
        P3Decision.from_dict({"version": 0})


def test_state_round_trips_as_data_and_the_restored_axis_decides_the_same():
    s = _scheduler(auto=True)
    s.observe("p3", 3, [(GBPS_1, 1e-4, 1e-5)])
    _bundle(s, 5)
    s.observe("p3", 8, [(4 * GBPS_1, 1e-4, 1e-5)])  # measured, not decided yet
    state = loads(dumps(s.state_dict()), "test")
    restored = _scheduler(auto=True)
    restored.load_state_dict(state)
    assert restored.decision("p3") == s.decision("p3") and restored.derivers["p3"].state_dict() == s.derivers["p3"].state_dict()
    assert _bundle(restored, 10) == _bundle(s, 10)
    assert restored.decision("p3").version == 2
    bad = dict(state, derivers={"p3": {**state["derivers"]["p3"], "choice": (0, 10)}})
    with pytest.raises(StateError):
        _scheduler(auto=True).load_state_dict(bad)


def test_the_axis_replays_exactly_from_the_input_log():
    s = _scheduler(auto=True, policy="fifo")
    s.bundle(Boundary(0, 5, ()), {})
    for k, gbps in enumerate((1.0, 1.0, 4.0, 0.5)):
        s.observe("p3", 5 * k + 3, [(gbps * GBPS_1, 1e-4, 1e-5)])
        s.observe("p3", 5 * k + 4, "garbage")  # refused, and refused again on replay
        _bundle(s, 5 * (k + 1))
    decided = replay(recorded(s))
    published = [d["p3"] for d in decided if "p3" in d]
    assert [d["version"] for d in published] == [0, 1, 2, 3]
    assert published[-1] == s.decision("p3").to_dict()


def test_the_parameter_server_s_client_fetches_each_decision_a_segment_ahead_in_process():
    from pdml_ray.runtime.p3_ps import P3Decisions

    client = P3Decisions(PDMLConfig(p3=P3Config(auto=True), decision_interval=2), 2, in_process=True)
    assert client.scheduler_name is None
    assert client.first().method == "config"
    client.request(2)  # at boundary 0, nothing measured yet
    client.observe(1, [(GBPS_1, 0.0, 20e-6), (2 * GBPS_1, 0.0, 20e-6)])  # after segment 0
    assert client.take(2) is None  # decided before the measurement: the config stands
    client.request(4)
    tuned = client.take(4)
    assert tuned is not None and tuned.effective_step == 4 and tuned.slice_elements == 31_744
    assert [d.version for d in client.ran] == [0, 1]
    assert client.stats().derivers["p3"].observations == 1
    client.close()  # in-process: nothing to end
