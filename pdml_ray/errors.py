"""Every error pdml-ray raises on purpose derives from ``PDMLError``; each message names the fix.

Subclasses say what went wrong. Those about bad values are also ``ValueError`` and those about a
wrong order of calls also ``RuntimeError``, so generic ``except ValueError`` / ``except RuntimeError``
handlers keep working.
"""


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
