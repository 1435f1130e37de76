"""Plain data (a dict, parsed YAML or JSON) into config dataclasses, nested sections included.

Unknown keys are errors that list the valid ones; values are checked by each dataclass's own
``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from pdml_ray.errors import ConfigError

T = TypeVar("T")


def load_dataclass(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, recursing into nested config dataclasses.

    ``where`` prefixes field names in messages (``"pipeline."``), so an error names the full path.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {unknown}; valid keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        nested = _config_class(hints[name])
        if nested is not None and isinstance(value, dict):
            value = load_dataclass(nested, value, f"{where}{name}.")
        elif nested is not None and value is not None and not isinstance(value, nested):
            raise ConfigError(f"{where}{name}: expected a mapping of {nested.__name__} fields, got {value!r}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:  # e.g. a missing required field
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def _config_class(hint: Any) -> type | None:
    """The config dataclass inside a type hint like ``X`` or ``X | None``, if any."""
    candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for c in candidates:
        if dataclasses.is_dataclass(c):
            return c  # type: ignore[return-value]
    return None
