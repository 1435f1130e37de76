"""The checks every config's ``__post_init__`` uses: a condition with a message, a finite number, and
``check_range``, the one range check of every numeric field.

Every numeric field has an upper bound, not only a lower one: a value far beyond any real run
(``max_batch=10**400``) would be accepted and crash the run at its start (a float conversion
overflows, an allocation fails), so it is refused here with the field's sane range.
"""

from __future__ import annotations

import math
from typing import Any

from pdml_ray.errors import ConfigError, shown

MAX_STEPS = 10**9
"""Largest step count a config takes (intervals, warm-up, staleness): a billion steps, far beyond any run."""
MAX_ITEMS = 1 << 40
"""Largest count of items, elements or bytes a config takes (about 10^12)."""
MAX_REAL = 1e12
"""Largest magnitude of an unbounded real setting (an exploration constant, seconds, Gb/s)."""


def require(ok: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``ok``; the message names the field and the fix."""
    if not ok:
        raise ConfigError(message)


def finite(x: Any) -> bool:
    """A real, finite number (bools and strings are not)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float64
        return False


def integer(x: Any, low: int, high: int | None = None) -> bool:
    """An integer (not a bool) in [low, high]."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= low and (high is None or x <= high)


def check_range(value: Any, name: str, low: float, high: float, *, whole: bool = False, open_low: bool = False,
                open_high: bool = False, hint: str = "", none_ok: bool = False) -> None:
    """Refuse ``value`` of field ``name`` unless it is a number in the range from ``low`` to ``high``
    (an integer with ``whole``; ends excluded with ``open_low`` / ``open_high``; ``None`` too with
    ``none_ok``). The message gives the range, what the value means (``hint``) and a short form of
    the value: ``node_priority.max_batch must be an integer in [1, 1073741824] ..., got <an integer
    of ~401 digits>``. Bools, strings, containers, NaN, infinities and ints beyond float64 are refused."""
    if value is None and none_ok:
        return
    if whole:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = finite(value)
    if ok:
        ok = (value > low if open_low else value >= low) and (value < high if open_high else value <= high)
    if not ok:
        kind = "an integer" if whole else "a number"
        ends = f"{'(' if open_low else '['}{_bound(low)}, {_bound(high)}{')' if open_high else ']'}"
        raise ConfigError(f"{name} must be {kind} in {ends}{f' ({hint})' if hint else ''}"
                          f"{' or None' if none_ok else ''}, got {shown(value)}")


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"
