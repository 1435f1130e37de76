"""Every error pdml-ray raises on purpose derives from ``PDMLError``; each message names the fix.

Subclasses say what went wrong. Those about bad values are also ``ValueError`` and those about a
wrong order of calls also ``RuntimeError``, so generic ``except ValueError`` / ``except RuntimeError``
handlers keep working.
"""

import reprlib


class PDMLError(Exception):
    """Base class of pdml-ray's own errors."""


class ConfigError(PDMLError, ValueError):
    """A configuration value or argument is invalid; the message names the field and how to fix it."""


class PlanError(PDMLError, ValueError):
    """A plan or decision (batch sizes, sample plan, pipeline plan) failed validation."""


class ReportError(PDMLError, ValueError):
    """A worker report or per-sample feedback is malformed (unknown worker, index out of range)."""


class StateError(PDMLError, ValueError):
    """Saved state (a checkpoint, a replay log) does not fit the run it is loaded into."""


class ResultError(PDMLError, TypeError):
    """A result to be written (a benchmark's JSON) holds a value JSON cannot represent; also a
    ``TypeError``, what ``json.dumps`` callers expect from a ``default`` hook."""


class UsageError(PDMLError, RuntimeError):
    """An API was called in the wrong place or order (outside a training loop, before prepare_model)."""


class SchedulerUnavailableError(PDMLError, RuntimeError):
    """The scheduler actor cannot be reached for a call that must reach it (checkpoints, start-up)."""


class NonFiniteError(PDMLError, RuntimeError):
    """A worker's loss (or the combined gradient) was NaN or infinite for more consecutive steps than
    ``node_priority.max_consecutive_nonfinite`` allows; the message names the worker and the step."""


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message, at most about ``limit`` characters, computed without
    expanding a huge value: containers show their first items and a few levels (a YAML alias bomb
    would otherwise expand to gigabytes), integers of more than 40 digits only their size (``repr``
    of one beyond 4,300 digits raises)."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _ShortRepr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        digits = int(abs(x).bit_length() * 0.30103) + 1  # log10(2): decimal digits from bits, +-1
        return repr(x) if digits <= 40 else f"<{'-' if x < 0 else ''}an integer of ~{digits} digits>"

    def repr_instance(self, x: object, level: int) -> str:
        try:
            return super().repr_instance(x, level)
        except Exception:  # noqa: BLE001 - a user object whose __repr__ raises still gets a name
            return f"<a {type(x).__name__}>"


_SHORT_REPR = _ShortRepr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxtuple, _SHORT_REPR.maxdict = 3, 6, 6, 4
_SHORT_REPR.maxset = _SHORT_REPR.maxfrozenset = _SHORT_REPR.maxdeque = _SHORT_REPR.maxarray = 6
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = _SHORT_REPR.maxlong = 60
