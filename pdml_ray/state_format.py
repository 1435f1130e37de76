"""pdml-ray's saved state as data: a checkpoint's file and the scheduler actor's restart snapshot.

Nothing read back executes: the state is JSON for its structure plus numpy arrays, together in one
zip (``.npz``-style: uncompressed, one member per array) that ``write_state``/``read_state`` write to a
file and ``dumps``/``loads`` to one blob (the GCS KV snapshot). Reading never unpickles: arrays are
read with ``allow_pickle=False`` (an object array is refused), and decisions are rebuilt only by the
``from_dict`` of a type in ``DECISION_TYPES``, named in the data but looked up in that dict, never
imported. Every decoded decision is validated (``validate()``) on the way in.

The ``state.json`` member holds ``{"format": "pdml-ray-state", "version": 1, "state": ...}``. What JSON
alone would lose is tagged by a one-key-plus-fields object ``{"$type": ...}``:

    {"$type": "float", "value": "nan" | "inf" | "-inf"}     non-finite floats (JSON has none)
    {"$type": "tuple", "items": [...]}                      tuples (lists stay JSON lists)
    {"$type": "deque", "items": [...], "maxlen": n | null}  collections.deque
    {"$type": "dict", "items": [[key, value], ...]}         a dict whose keys are not all strings (or
                                                            one that has a "$type" key)
    {"$type": "array", "member": "arrays/3.npy"}            a numpy array (dtype and shape in its .npy)
    {"$type": "scalar", "dtype": "int64", "value": ...}     a numpy scalar
    {"$type": "decision", "kind": "NodeDecision", "fields": {...}}   a decision's ``to_dict()``

Anything that does not read back as exactly this (another format version, a damaged, truncated or
foreign file, a pickle under the name, an unexpected or missing member, a wrong tag) raises one
``StateError`` naming the file, and nothing is returned: the caller applies a state only once it is
read whole.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pdml_ray.config import PDMLConfig
from pdml_ray.decisions import GradientDecision, MicroBatchPlan, NodeDecision, P3Decision, SampleDecision
from pdml_ray.errors import PDMLError, StateError

FORMAT = "pdml-ray-state"
VERSION = 1
"""The format version written; a reader refuses any other (pre-release: no older versions are read)."""

_STATE_MEMBER = "state.json"
_JSON_SCALARS = (int, float, str, bool, type(None))
_TAG = "$type"

DECISION_TYPES: dict[str, Any] = {"NodeDecision": NodeDecision, "SampleDecision": SampleDecision,
                                  "GradientDecision": GradientDecision, "MicroBatchPlan": MicroBatchPlan,
                                  "P3Decision": P3Decision}
"""The decision types a state may hold, by the name written in it: the only classes a reader builds."""

_ARRAY_KINDS = "biufc"
"""Array dtypes a state may hold: bool, integers, floats, complex (numbers only; no objects, no strings)."""
_SCALAR_DTYPES = {np.dtype(t).name: np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64,
                                                          np.uint8, np.uint16, np.uint32, np.uint64,
                                                          np.float16, np.float32, np.float64)}


class _Malformed(Exception):
    """Raised inside the codec; the public functions turn it into one StateError naming the source."""


# -- encoding -----------------------------------------------------------------------------------------
def _encode(x: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(x, np.generic):  # before float: np.float64 is a float too, and its dtype must come back
        if x.dtype.name not in _SCALAR_DTYPES:
            raise _Malformed(f"a numpy scalar of dtype {x.dtype} cannot be saved")
        return {_TAG: "scalar", "dtype": x.dtype.name, "value": _encode(x.item(), arrays)}
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)  # an IntEnum or other int subclass is written as its value
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else {_TAG: "float", "value": repr(float(x))}
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in _ARRAY_KINDS or x.dtype.fields is not None:
            raise _Malformed(f"an array of dtype {x.dtype} cannot be saved (numbers only)")
        member = f"arrays/{len(arrays)}.npy"
        arrays[member] = x
        return {_TAG: "array", "member": member}
    if isinstance(x, list):
        return x if _plain(x) else [_encode(v, arrays) for v in x]
    if isinstance(x, tuple):
        return {_TAG: "tuple", "items": list(x) if _plain(x) else [_encode(v, arrays) for v in x]}
    if isinstance(x, deque):
        return {_TAG: "deque", "items": [_encode(v, arrays) for v in x], "maxlen": x.maxlen}
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x) and _TAG not in x:
            return {k: _encode(v, arrays) for k, v in x.items()}
        return {_TAG: "dict", "items": [[_encode(k, arrays), _encode(v, arrays)] for k, v in x.items()]}
    kind = type(x).__name__
    if DECISION_TYPES.get(kind) is type(x):
        return {_TAG: "decision", "kind": kind, "fields": _encode(x.to_dict(), arrays)}
    raise _Malformed(f"a {kind} cannot be saved: a state holds None, bools, numbers, strings, lists, tuples, "
                     f"dicts, deques, numpy arrays and scalars, and the decisions {sorted(DECISION_TYPES)}")


def _plain(items: list | tuple) -> bool:
    """Only ints, strings and finite floats: JSON as they are (the common case: a decision's numbers,
    ~10x cheaper than one ``_encode`` call per item). ``v - v == 0.0`` holds for finite floats only."""
    return all(type(v) is int or type(v) is str or (type(v) is float and v - v == 0.0)  # noqa: E721
               for v in items)


def _encode_state(state: Any) -> tuple[bytes, dict[str, np.ndarray]]:
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(state, arrays)
    text = json.dumps({"format": FORMAT, "version": VERSION, "state": tree}, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8"), arrays


def _zip(text: bytes, arrays: Mapping[str, np.ndarray], f: Any) -> None:
    # stored, not deflated: a sample table of millions of float64 scores barely compresses, and a
    # snapshot is written every few seconds
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(_STATE_MEMBER, text)
        for member, array in arrays.items():
            with z.open(member, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, array, allow_pickle=False)


def dumps(state: Any) -> bytes:
    """``state`` as one blob (the zip ``write_state`` writes); StateError if it holds something the
    format cannot hold (an object array, an unknown class)."""
    try:
        text, arrays = _encode_state(state)
    except _Malformed as e:
        raise StateError(f"this state cannot be saved: {e}") from None
    buffer = io.BytesIO()
    _zip(text, arrays, buffer)
    return buffer.getvalue()


def write_state(path: str | os.PathLike[str], state: Any) -> None:
    """Write ``state`` to ``path`` (replaced whole: written to a temporary name first, then renamed)."""
    blob = dumps(state)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


# -- decoding -----------------------------------------------------------------------------------------
def _fields(x: dict[str, Any], *names: str) -> None:
    if set(x) != {_TAG, *names}:
        raise _Malformed(f"a {x[_TAG]!r:.40} entry must hold exactly {sorted(names)}, got {sorted(x)!r:.200}")


def _decode(x: Any, arrays: Callable[[str], np.ndarray]) -> Any:
    if x is None or isinstance(x, (bool, str, int, float)):
        return x
    if isinstance(x, list):
        return x if all(type(v) in _JSON_SCALARS for v in x) else [_decode(v, arrays) for v in x]
    if not isinstance(x, dict):
        raise _Malformed(f"unexpected JSON value {type(x).__name__}")
    if _TAG not in x:
        return {k: _decode(v, arrays) for k, v in x.items()}
    tag = x[_TAG]
    if tag == "float":
        _fields(x, "value")
        if x["value"] not in ("nan", "inf", "-inf"):
            raise _Malformed(f"a non-finite float must be 'nan', 'inf' or '-inf', got {x['value']!r:.40}")
        return float(x["value"])
    if tag in ("tuple", "deque", "dict"):
        _fields(x, "items", *(("maxlen",) if tag == "deque" else ()))
        if not isinstance(x["items"], list):
            raise _Malformed(f"a {tag}'s items must be a list")
        items = _decode(x["items"], arrays)
        if tag == "tuple":
            return tuple(items)
        if tag == "deque":
            maxlen = x["maxlen"]
            if maxlen is not None and not (type(maxlen) is int and 0 <= maxlen):  # noqa: E721 - not a bool
                raise _Malformed(f"a deque's maxlen must be an integer >= 0 or null, got {maxlen!r:.40}")
            return deque(items, maxlen=maxlen)
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
            raise _Malformed("a dict's items must be [key, value] pairs")
        try:
            return {k: v for k, v in items}
        except TypeError:  # an unhashable key
            raise _Malformed("a dict key must be a string, number, tuple or null") from None
    if tag == "array":
        _fields(x, "member")
        if not isinstance(x["member"], str):
            raise _Malformed("an array's member must be a name")
        return arrays(x["member"])
    if tag == "scalar":
        _fields(x, "dtype", "value")
        dtype = _SCALAR_DTYPES.get(x["dtype"]) if isinstance(x["dtype"], str) else None
        value = _decode(x["value"], arrays)
        if dtype is None or not isinstance(value, (bool, int, float)):
            raise _Malformed(f"a numpy scalar needs a numeric dtype and value, got {x['dtype']!r:.40}")
        try:
            return dtype.type(value)
        except (OverflowError, ValueError):
            raise _Malformed(f"{value!r:.40} is not a {dtype.name}") from None
    if tag == "decision":
        _fields(x, "kind", "fields")
        cls = DECISION_TYPES.get(x["kind"]) if isinstance(x["kind"], str) else None
        if cls is None:
            raise _Malformed(f"unknown decision type {x['kind']!r:.40} (known: {sorted(DECISION_TYPES)})")
        try:
            decision = cls.from_dict(_decode(x["fields"], arrays))
            decision.validate()
        except PDMLError as e:
            raise _Malformed(f"a saved {x['kind']} is invalid: {e}") from None
        return decision
    raise _Malformed(f"unknown entry type {tag!r:.40}")


def _read_zip(f: Any) -> Any:
    """The state in zip ``f``; _Malformed (or an error of zipfile/json/numpy, turned into one by the caller)."""
    with zipfile.ZipFile(f) as z:
        names = z.namelist()
        if len(set(names)) != len(names) or _STATE_MEMBER not in names:
            raise _Malformed(f"it has no (single) {_STATE_MEMBER} member")
        header = json.loads(z.read(_STATE_MEMBER).decode("utf-8"), parse_constant=_refuse_constant)
        if not isinstance(header, dict) or set(header) != {"format", "version", "state"} or header["format"] != FORMAT:
            raise _Malformed(f"its {_STATE_MEMBER} is not a {FORMAT} header")
        if header["version"] != VERSION or type(header["version"]) is not int:
            raise _Malformed(f"it is format version {header['version']!r:.40}; this pdml-ray reads version {VERSION} "
                             "only (pre-release versions are not read)")
        used: set[str] = set()

        def array(member: str) -> np.ndarray:
            if member in used or member == _STATE_MEMBER or member not in names:
                raise _Malformed(f"array member {member!r:.80} is missing or used twice")
            used.add(member)
            with z.open(member) as fp:
                a = np.lib.format.read_array(fp, allow_pickle=False)
            if a.dtype.kind not in _ARRAY_KINDS or a.dtype.fields is not None:
                raise _Malformed(f"array member {member!r:.80} has dtype {a.dtype} (numbers only)")
            return a

        state = _decode(header["state"], array)
        extra = set(names) - used - {_STATE_MEMBER}
        if extra:
            raise _Malformed(f"it has members no entry uses: {sorted(extra)[:5]}")
        return state


def _refuse_constant(name: str) -> Any:
    raise _Malformed(f"its JSON holds {name}, which this format writes as a tagged float")


def _read(f: Any, source: str, remedy: str) -> Any:
    try:
        return _read_zip(f)
    except _Malformed as e:
        why = str(e)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, UnicodeDecodeError, ValueError,
            KeyError, TypeError, RecursionError, MemoryError) as e:
        # a truncated or foreign file (a pickle included: it is no zip), a corrupt member (zip's CRC), bad
        # JSON, an .npy header numpy refuses (an object array: allow_pickle=False)
        why = f"{type(e).__name__}: {e}"
    raise StateError(f"{source} is not a readable pdml-ray state ({why:.300}); it is damaged, truncated or was "
                     f"not written by this pdml-ray version: {remedy}")


def read_state(path: str | os.PathLike[str]) -> Any:
    """The state ``write_state`` wrote to ``path``; StateError naming the file if it is not exactly that."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise StateError(f"{os.fspath(path)}: cannot open the pdml-ray state ({e.strerror}); check the checkpoint "
                         "directory") from None
    with f:
        return _read(f, os.fspath(path), "resume from another checkpoint, or start without it")


def loads(blob: bytes, source: str, remedy: str = "load a blob that dumps() wrote") -> Any:
    """The state ``dumps`` wrote; StateError naming ``source`` (where the blob came from) and saying
    ``remedy`` (what to do) if it is not."""
    if not isinstance(blob, (bytes, bytearray)):
        raise StateError(f"{source}: a pdml-ray state blob must be bytes, got {type(blob).__name__}; {remedy}")
    return _read(io.BytesIO(blob), source, remedy)


# -- what a restored decision must satisfy -----------------------------------------------------------
def check_decision(decision: Any, config: PDMLConfig, num_workers: int) -> None:
    """Raise PlanError unless ``decision`` is one this run's scheduler could publish: a node decision
    with one integer size per worker within the config's min/max summing to the global batch, weights
    its batch shares; a gradient decision with one priority per worker; any other known decision well
    formed (``validate``)."""
    if isinstance(decision, NodeDecision):
        cfg = config.node_priority
        if cfg is None:
            raise StateError("a saved node decision needs PDMLConfig.node_priority: resume with the same config")
        decision.validate(cfg.batch, cfg.min_batch, cfg.max_batch, num_workers)
    elif isinstance(decision, GradientDecision):
        decision.validate(num_workers)
    elif type(decision).__name__ in DECISION_TYPES:
        decision.validate()
    else:
        raise StateError(f"a saved decision must be one of {sorted(DECISION_TYPES)}, got {type(decision).__name__}")


def check_scheduler_decisions(state: Any, config: PDMLConfig, num_workers: int) -> None:
    """Raise PlanError unless every decision in a ``Scheduler.state_dict()`` passes ``check_decision``:
    the decisions in force and in the history, and those the node and gradient derivers keep (as
    ``to_dict`` dicts) to decide from. StateError if the state is not shaped like one."""
    sections = ("current", "history", "derivers")
    if not (isinstance(state, dict) and all(isinstance(state.get(k), dict) for k in sections)):
        raise StateError("a saved scheduler state must be a dict with 'current', 'history' and 'derivers' mappings, "
                         "as Scheduler.state_dict() writes it")
    for decisions in (list(state["current"].values()), *state["history"].values()):
        if not isinstance(decisions, (list, tuple, deque)):
            raise StateError("a saved decision history must be a list of decisions")
        for decision in decisions:
            check_decision(decision, config, num_workers)
    for name, cls in (("node", NodeDecision), ("gradient", GradientDecision)):
        saved = state["derivers"].get(name)
        if isinstance(saved, dict) and "decision" in saved:
            check_decision(cls.from_dict(saved["decision"]), config, num_workers)
