"""Plain data (a dict, parsed YAML or JSON) into config dataclasses, nested sections included, and
the one YAML reader of every file pdml-ray takes (configs, ``simulate`` scenarios, ``validate-config``).

Unknown keys are errors that list the valid ones. Each value is first checked against its field's
type hint (so the string ``'false'`` is not a bool and ``None`` is not a mapping), then by the
dataclass's own ``__post_init__`` (ranges, names); either way the error is a ``ConfigError`` naming
the field.

YAML is read as JSON-like data only: mappings, lists, strings, numbers, booleans and null. Dates and
timestamps stay strings (``scheduler_name: 2024-02-30`` is the string it looks like), and the tags of
other types (``!!timestamp``, ``!!binary``, ``!!set``, ``!!python/...``) are refused. A file is
bounded before anything is built from it: ``MAX_YAML_BYTES`` of text, ``MAX_YAML_DEPTH`` levels of
nesting and ``MAX_YAML_NODES`` values with every alias expanded, so an alias bomb (a few hundred
bytes that expand to billions of values) is refused while it is read, in milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from pdml_ray.errors import ConfigError, shown

T = TypeVar("T")

MAX_YAML_BYTES = 1 << 18
"""Largest YAML file read (256 KiB; a config or scenario is a few KB)."""
MAX_YAML_DEPTH = 50
"""Deepest nesting of mappings and lists in a YAML file (a config nests three levels)."""
MAX_YAML_NODES = 10_000
"""Most values (scalars, lists, mappings) in a YAML file with every alias expanded."""
_REFUSED_TAGS = ("timestamp", "binary", "set", "omap", "pairs")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded (depth, expanded size) and limited to JSON-like types."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        self._expanded: dict[int, int] = {}  # id(node) -> values under it, aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise ConfigError(f"nested more than {MAX_YAML_DEPTH} levels deep; a config nests a few levels")
        node = super().compose_node(parent, index)
        self._depth -= 1
        if id(node) not in self._expanded and len(self._expanded) >= MAX_YAML_NODES:  # a long list, no alias
            raise ConfigError(f"more than {MAX_YAML_NODES:,} values (line {node.start_mark.line + 1}); a config "
                              "has a few dozen")
        if id(node) not in self._expanded:  # a new node (an alias returns the node it names, counted once)
            children = (node.value if isinstance(node, yaml.SequenceNode) else
                        [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
            size = 1 + sum(self._expanded.get(id(c), 1) for c in children)
            if size > MAX_YAML_NODES:
                raise ConfigError(f"more than {MAX_YAML_NODES:,} values with aliases expanded (line "
                                  f"{node.start_mark.line + 1}); a config has a few dozen: remove the aliases")
            self._expanded[id(node)] = size
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ConfigError, yaml.YAMLError, RecursionError):
            raise
        except Exception as e:  # noqa: BLE001 - a value its tag cannot read: '!!int' of '', '!!float abc'
            raise ConfigError(f"line {node.start_mark.line + 1}: {shown(node.value, 60)} is not a valid "
                              f"{node.tag.rsplit(':', 1)[-1]} ({type(e).__name__}); fix the value or quote it to "
                              "make it a string") from None


def _refuse_tag(loader: _BoundedLoader, node: Any) -> Any:
    raise ConfigError(f"line {node.start_mark.line + 1}: the YAML type {node.tag.rsplit(':', 1)[-1]!r} is not "
                      "supported (configs take mappings, lists, strings, numbers, true/false and null); "
                      "quote the value to make it a string")


_BoundedLoader.yaml_implicit_resolvers = {  # no implicit timestamps: a date-like value stays a string
    first: [(tag, regexp) for tag, regexp in resolvers if not tag.endswith(":timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _tag in _REFUSED_TAGS:
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)


def parse_yaml(text: str) -> Any:
    """The data of one YAML document ``text``, within the bounds above; ConfigError saying what is
    wrong (without the file's name: callers add it) otherwise."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"larger than {MAX_YAML_BYTES:,} characters; a config is a few KB: is it the right file?")
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters already
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {' '.join(str(e).split())[:300]}; fix the syntax at the line "
                          "it names") from None
    except RecursionError:
        raise ConfigError(f"nested too deeply; a config nests a few levels (at most {MAX_YAML_DEPTH})") from None


def read_yaml(path: str | Path) -> Any:
    """The data of YAML file ``path`` (``parse_yaml``); every failure is one ConfigError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e.strerror or e}); check the path") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    except ValueError as e:  # a NUL byte in the path
        raise ConfigError(f"{path!r}: not a usable path ({e})") from None
    try:
        return parse_yaml(text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def load_dataclass(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, recursing into nested config dataclasses.

    ``where`` prefixes field names in messages (``"pipeline."``), so an error names the full path.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted((k for k in data if k not in fields), key=shown)
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {shown(unknown, 200)}; valid keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        nested = _config_class(hints[name])
        if nested is not None and isinstance(value, dict):
            value = load_dataclass(nested, value, f"{where}{name}.")
        elif nested is not None and not isinstance(value, nested) and not (value is None and _allows_none(hints[name])):
            raise ConfigError(f"{where}{name}: expected a mapping of {nested.__name__} fields, got {shown(value)}")
        elif nested is None and not _matches(value, hints[name]):
            raise ConfigError(f"{where}{name} must be {_describe(hints[name])}, got {shown(value)}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:  # e.g. a missing required field
        raise ConfigError(f"{where or cls.__name__}: {str(e)[:300]}") from None


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
        return any(type(value) is type(a) and value == a for a in args)
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
