"""``pdml-ray validate-config FILE``: check a pdml-ray config or a Ray cluster config before a run needs it.

A pdml-ray config is YAML that ``PDMLConfig.from_yaml`` loads (``node_priority:``, ``pipeline:``, ...);
each top-level section is checked on its own first, so one run lists an error per bad section, and then
the whole (checks across sections), and then, for ``--runtime train`` (the default), what ``PDMLTrainer``
requires before it launches (``pdml_ray.config.training``: ``node_priority.global_batch_size`` set,
and with ``--workers N`` that N workers can split it). A ``gradient_priority.priority_fn`` is user
code: only its shape (``module:function``) is checked, and it is imported (which runs its module) only
with ``--import-priority-fn``. A Ray cluster config (``ray up``'s YAML: ``cluster_name``,
``provider``, ...) is checked against Ray's own schema (every violation, with its path), then by Ray's
own ``prepare_config`` + ``validate_config`` (what ``ray up`` runs). Which kind a file is, is told by its
keys unless ``--kind`` says.

Exit status: 0 valid, 1 invalid (each error on its own line: the field and the fix), 2 bad usage (no
such file, not readable).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
from typing import Any

from pdml_ray.cli.args import file_path, int_range
from pdml_ray.config.loading import MAX_YAML_BYTES, parse_yaml
from pdml_ray.config.node import MAX_GLOBAL_BATCH
from pdml_ray.errors import ConfigError, UsageError, shown

DESCRIPTION = "check a pdml-ray config or a Ray cluster config (exit 0 valid, 1 invalid, 2 bad usage)"
KINDS = ("auto", "pdml", "ray")
RUNTIMES = ("train", "any")
RAY_KEYS = frozenset({"cluster_name", "provider", "available_node_types", "head_node_type", "max_workers",
                      "auth", "head_start_ray_commands", "worker_start_ray_commands"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", type=file_path("FILE"), help="YAML file: a pdml-ray config or a Ray cluster (`ray up`) config")
    parser.add_argument("--kind", choices=KINDS, default="auto",
                        help="what FILE is (default auto: a Ray cluster config has cluster_name/provider keys)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="train",
                        help="train (default): also what PDMLTrainer requires (node_priority.global_batch_size); "
                             "any: only the config's own checks (the pipeline and straggler runtimes need no "
                             "node_priority)")
    parser.add_argument("--workers", type=int_range(1, MAX_GLOBAL_BATCH), default=None,
                        help="with --runtime train: check that this many workers can split the global batch "
                             "within min_batch and max_batch")
    parser.add_argument("--import-priority-fn", action="store_true",
                        help="import gradient_priority.priority_fn and check its signature (this runs its module's "
                             "code); without it only the 'module:function' shape is checked")


def load_yaml(path: str) -> tuple[Any, str | None]:
    """(data, None), or (None, why the file is not YAML). A missing or unreadable file is bad usage."""
    if not path.strip():
        raise UsageError("FILE must not be empty; give the path of a YAML file")
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory; give the path of a YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_YAML_BYTES + 1)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        return parse_yaml(text), None
    except ConfigError as e:
        return None, str(e)


def pdml_errors(data: Any, runtime: str = "train", workers: int | None = None,
                import_priority_fn: bool = False) -> list[str]:
    """Every error ``PDMLConfig`` finds: each section alone, then the whole (cross-section checks), then
    for ``runtime="train"`` what ``PDMLTrainer`` requires (``check_ray_train``)."""
    from pdml_ray.config import PDMLConfig
    from pdml_ray.config.training import check_ray_train

    if data is None:
        data = {}
    if not isinstance(data, dict):
        return [f"top level: expected a mapping of PDMLConfig sections (node_priority:, pipeline:, ...), "
                f"got {type(data).__name__}"]
    errors: list[str] = []

    def check(part: dict[str, Any], whole: bool = False) -> None:
        try:
            config = PDMLConfig.from_dict(part)
            if whole and runtime == "train":
                check_ray_train(config, workers, import_user_code=import_priority_fn)
        except ConfigError as e:
            message = str(e)
        except Exception as e:  # noqa: BLE001 - a value of a type no check foresaw: still one line, not a traceback
            message = f"{', '.join(map(shown, part))[:100] or 'config'}: invalid value ({type(e).__name__}: {str(e)[:200]})"
        else:
            return
        if message not in errors:
            errors.append(message)

    for key in data:
        check({key: data[key]})
    if not errors:
        check(data, whole=True)
    return errors


def _ray_schema() -> dict[str, Any]:
    import ray.autoscaler

    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json"), encoding="utf-8") as f:
        return json.load(f)


def _fix(error: Any) -> str:
    """How to fix one jsonschema violation, in words."""
    v, arg = error.validator, error.validator_value
    if v == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return f"remove it{f' (valid keys: {allowed})' if allowed else ''}"
    if v == "required":
        return "add it"
    if v == "type":
        return f"give a value of type {arg}"
    if v == "enum":
        return f"use one of {arg}"
    if v in ("minimum", "exclusiveMinimum"):
        return f"use a value >= {arg}"
    if v in ("maximum", "exclusiveMaximum"):
        return f"use a value <= {arg}"
    return "see Ray's cluster config reference (ray-schema.json)"


def ray_errors(data: Any) -> list[str]:
    """Every violation of Ray's cluster config schema, then Ray's own checks (``ray up``'s)."""
    import jsonschema

    if not isinstance(data, dict):
        return [f"top level: expected a mapping (cluster_name:, provider:, ...), got {type(data).__name__}"]
    validator = jsonschema.Draft7Validator(_ray_schema())
    errors = []
    for e in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        where = ".".join(str(p) for p in e.absolute_path) or "top level"
        errors.append(f"{where[:100]}: {e.message[:300]}; {_fix(e)}")
    if errors:
        return errors
    from ray.autoscaler._private.util import prepare_config, validate_config

    logger = logging.getLogger("ray.autoscaler")
    level = logger.level
    logger.setLevel(logging.ERROR)  # prepare_config logs what it fills in; that is not an error
    try:
        validate_config(prepare_config(copy.deepcopy(data)))
    except Exception as e:  # noqa: BLE001 - Ray raises ValueError, KeyError, RuntimeError, ...: each is a finding
        return [f"Ray's validate_config: {type(e).__name__}: {' '.join(str(e).split())[:300]}"]
    finally:
        logger.setLevel(level)
    return []


def run(args: argparse.Namespace) -> int:
    data, yaml_error = load_yaml(args.file)
    kind = args.kind
    if kind == "auto":
        kind = "ray" if isinstance(data, dict) and RAY_KEYS & set(map(str, data)) else "pdml"
    label = "Ray cluster config" if kind == "ray" else "pdml-ray config"
    errors = ([yaml_error] if yaml_error else ray_errors(data) if kind == "ray" else
              pdml_errors(data, args.runtime, args.workers, args.import_priority_fn))
    if errors:
        print(f"{args.file}: invalid {label}, {len(errors)} error(s):", file=sys.stderr)
        for message in errors:
            print(f"  {message}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid {label}")
    return 0
