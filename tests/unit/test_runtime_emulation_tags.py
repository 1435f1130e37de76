"""The runtimes' metric series say what they EMULATE (help text and an ``emulated`` tag), so a dashboard
reader on a CPU test machine is never shown a slept step as a measured one."""

from pdml_ray.pipeline.plan import Kind, Measurement
from pdml_ray.pipeline.stats import PipelineRunStats
from pdml_ray.stragglers.stats import StragglerRunStats


def test_every_runtime_series_carries_the_emulated_tag_and_says_so_in_its_help():
    pipeline = PipelineRunStats(emulated="compute,speeds")
    pipeline.observe("osprey", 1.0, [Measurement(0, 0, Kind.FORWARD, 0, 0.5)], 1)
    stragglers = StragglerRunStats("gc-cr", emulated="stragglers")
    stragglers.observe(0.3, dropped=1, dead=0)
    for stats, value in ((pipeline, "compute,speeds"), (stragglers, "stragglers")):
        gauges = stats.gauges()
        assert gauges and all(dict(g.tags)["emulated"] == value for g in gauges)
        step = next(g for g in gauges if g.name.endswith("_step_seconds"))
        assert "EMULATED" in step.description
    assert dict(PipelineRunStats().gauges()[0].tags)["emulated"] == "none"
