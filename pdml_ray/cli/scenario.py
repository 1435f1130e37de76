"""Scenario files of ``pdml-ray simulate --scenario FILE``: YAML mappings whose keys are the flags' names
(with ``_``), each value checked by the same argument type as its flag, so a file and a command line
fail alike (one line, exit status 2)."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from pdml_ray.config.loading import read_yaml
from pdml_ray.errors import ConfigError, shown

KINDS = ("pipeline", "stragglers")


def load_scenario(path: str) -> dict[str, Any]:
    """The scenario file as a mapping (``kind`` included); a missing or malformed file is a ConfigError."""
    try:
        data = read_yaml(path)  # bounded, JSON-like types only
    except ConfigError as e:
        raise ConfigError(f"--scenario {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--scenario {path}: expected a mapping of scenario keys, got {type(data).__name__}")
    kind = data.get("kind", "pipeline")
    if kind not in KINDS:
        raise ConfigError(f"--scenario {path}: kind must be pipeline or stragglers, got {shown(kind)}")
    return data


def as_flag_text(value: Any) -> str:
    """A YAML value as the text its flag takes: lists comma-separated, a list of lists ';'-separated."""
    if isinstance(value, (list, tuple)):
        return (";" if any(isinstance(v, (list, tuple)) for v in value) else ",").join(map(as_flag_text, value))
    return str(value)


def scenario_values(data: dict[str, Any], path: str, types: dict[str, Callable[[str], Any]],
                    repeatable: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Scenario keys checked by the flags' own types (a ``repeatable`` key takes a list, one value per
    repetition of its flag); an unknown key lists the valid ones."""
    unknown = sorted(set(data) - set(types) - {"kind"}, key=shown)
    if unknown:
        raise ConfigError(f"--scenario {path}: unknown key(s) {shown(unknown, 200)}; valid keys: {sorted(types)}")
    values: dict[str, Any] = {}
    for key, parse in types.items():
        if key not in data:
            continue
        raw = data[key]
        try:
            if key in repeatable:
                values[key] = [parse(as_flag_text(v)) for v in (raw if isinstance(raw, list) else [raw])]
            else:
                values[key] = parse(as_flag_text(raw))
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"--scenario {path}: {key}: {e}") from None
    return values
