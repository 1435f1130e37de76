"""Plain data (a dict, parsed YAML or JSON) into config dataclasses, nested sections included.

Unknown keys are errors that list the valid ones. Each value is first checked against its field's
type hint (so the string ``'false'`` is not a bool and ``None`` is not a mapping), then by the
dataclass's own ``__post_init__`` (ranges, names); either way the error is a ``ConfigError`` naming
the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, TypeVar

from pdml_ray.errors import ConfigError

T = TypeVar("T")


def load_dataclass(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, recursing into nested config dataclasses.

    ``where`` prefixes field names in messages (``"pipeline."``), so an error names the full path.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted((k for k in data if k not in fields), key=repr)
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {unknown}; valid keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        nested = _config_class(hints[name])
        if nested is not None and isinstance(value, dict):
            value = load_dataclass(nested, value, f"{where}{name}.")
        elif nested is not None and not isinstance(value, nested) and not (value is None and _allows_none(hints[name])):
            raise ConfigError(f"{where}{name}: expected a mapping of {nested.__name__} fields, got {value!r}")
        elif nested is None and not _matches(value, hints[name]):
            raise ConfigError(f"{where}{name} must be {_describe(hints[name])}, got {value!r}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:  # e.g. a missing required field
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def _allows_none(hint: Any) -> bool:
    return hint is type(None) or (_is_union(hint) and type(None) in typing.get_args(hint))


def _is_union(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union


def _matches(value: Any, hint: Any) -> bool:
    """Whether plain data ``value`` (from a dict, YAML or JSON) fits type hint ``hint``. Lists stand in
    for tuples (YAML has no tuples); ints for floats; bools are neither ints nor floats."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if _is_union(hint):
        return any(_matches(value, h) for h in typing.get_args(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        try:
            float(value)
        except OverflowError:  # an int beyond float64: not a float value
            return False
        return True
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_matches(v, h) for v, h in zip(value, args))
        return not args or all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and (not args or all(_matches(k, args[0]) and _matches(v, args[1])
                                                            for k, v in value.items()))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a hint this loader does not know: the dataclass's own checks decide


def _describe(hint: Any) -> str:
    """A type hint in words for messages: 'a number', 'true or false', 'a list of numbers or null'."""
    if _is_union(hint):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} items ({', '.join(_describe(h) for h in args)})"
        return f"a list of {_describe(args[0]) if args else 'items'}"
    if origin is dict:
        return f"a mapping of {_describe(args[0])} to {_describe(args[1])}" if args else "a mapping"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    return words.get(hint, getattr(hint, "__name__", str(hint)))


def _config_class(hint: Any) -> type | None:
    """The config dataclass inside a type hint like ``X`` or ``X | None``, if any."""
    candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for c in candidates:
        if dataclasses.is_dataclass(c):
            return c  # type: ignore[return-value]
    return None
