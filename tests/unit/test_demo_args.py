"""``pdml-ray demo``'s defaults, without Ray: the four workers the README describes (two at speed 1.0, two
at 0.4) and the speed-ratio split the demo prints beside node priorities' (tests/e2e/test_demo.py runs the
demo itself, at two workers)."""

from pdml_ray.cli import build_parser
from pdml_ray.cli.demo import speed_ratio_split, split_note, validate


def test_the_default_demo_is_four_workers_two_fast_two_slow():
    args = build_parser(["demo"]).parse_args(["demo"])
    assert validate(args) == [1.0, 1.0, 0.4, 0.4] and args.steps == 60 and args.global_batch == 1024


def test_the_speed_ratio_split_rounds_to_the_global_batch():
    assert speed_ratio_split([1.0, 1.0, 0.4, 0.4], 64) == (23, 23, 9, 9)  # 64 x 1/2.8 and 64 x 0.4/2.8, rounded
    assert speed_ratio_split([1.0, 0.4], 64) == (46, 18)  # what the end-to-end demo run prints
    assert sum(speed_ratio_split([1.0, 1.0, 0.4, 0.4], 1024)) == 1024


def test_the_split_note_says_why_a_real_compute_split_differs_from_the_speeds():
    assert "follows the emulated speeds" in split_note("sleep", 4, 2)
    assert "4 workers share 2 cores" in split_note("real", 4, 2) and "share" not in split_note("real", 2, 4)
