"""The two checks every config's ``__post_init__`` uses: a condition with a message, a finite number."""

from __future__ import annotations

import math
from typing import Any

from pdml_ray.errors import ConfigError


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
