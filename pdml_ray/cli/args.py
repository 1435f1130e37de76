"""Argument types for the ``pdml-ray`` parsers: each checks its value while parsing, so a bad value is
one line from argparse (``argument --stages: ...``) and exit status 2, before anything starts.

Every number is checked for range and finiteness (``float("nan")`` parses, and a NaN noise level once
made ``simulate`` loop forever); upper bounds keep a typo (``--stages 4000000``) from becoming an
hour of work or an out-of-memory kill. Each type is a small callable with a readable ``__name__``
(argparse shows it when the value is not a number at all).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

SEED_MAX = 2**32 - 1  # numpy's default_rng and torch.manual_seed both take it


def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _range_text(low: float | None, high: float | None, low_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}]"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"<= {high:g}"


def int_range(low: int | None = None, high: int | None = None, hint: str = "") -> Callable[[str], int]:
    """An integer in ``[low, high]``; ``hint`` says what the value means (added to the message)."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {_range_text(low, high, False)}{hint}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def float_range(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                hint: str = "") -> Callable[[str], float]:
    """A finite number in ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def parse(text: str) -> float:
        value = _number(text, float)
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a number {_range_text(low, high, low_open)}{hint}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def items(text: str, what: str, sep: str = ",", example: str = "1f1b,osprey") -> list[str]:
    """The ``sep``-separated items of a list argument, stripped; an empty list or an empty item
    (``1f1b,,``, ``,2``) is refused: it is a typo, not a shorter list."""
    parts = [p.strip() for p in text.split(sep)]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"{what} must not be empty; give {sep!r}-separated items, e.g. {example}")
    if not all(parts):
        raise argparse.ArgumentTypeError(f"{what} has an empty item in {text!r}; separate items by one {sep!r}, "
                                         f"e.g. {example}")
    return parts


def non_empty(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{what} must not be empty")
        return text

    parse.__name__ = what
    return parse


def file_path(what: str) -> Callable[[str], str]:
    """A path: not empty, no NUL byte (which ``open`` refuses with a ValueError)."""

    def parse(text: str) -> str:
        if not text.strip() or "\0" in text:
            raise argparse.ArgumentTypeError(f"{what} must be a file path (not empty, no NUL byte), got {text!r}")
        return text

    parse.__name__ = what
    return parse


seed = int_range(0, SEED_MAX)


def ray_address(text: str) -> str:
    """``auto``, ``local``, ``HOST:PORT`` or ``ray://HOST:PORT``; a malformed one is refused while parsing
    (the rest of the check, whether anything answers there, is ``cluster.probe``)."""
    if text in ("auto", "local"):
        return text
    rest = text[len("ray://"):] if text.startswith("ray://") else text
    host, sep, port = rest.rpartition(":")
    if not sep or not host.strip() or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected auto, HOST:PORT or ray://HOST:PORT with a port in 1..65535 "
                                         f"(e.g. 10.0.0.1:6379), got {text!r}")
    return text


ray_address.__name__ = "address"


def positive_list(text: str, what: str, example: str) -> tuple[float, ...]:
    """A comma-separated list of distinct finite numbers > 0 (``--ratios 0.5,1,2``, ``--lr-grid``)."""
    try:
        values = tuple(float(item) for item in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v > 0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"needs distinct finite {what} > 0 separated by commas, e.g. {example}; "
                                         f"got {text[:80]!r}")
    return values
