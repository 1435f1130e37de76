"""Every error pdml-ray raises on purpose derives from PDMLError.

Configuration mistakes raise ``ConfigError``, which is also a ``ValueError`` so that
``except ValueError`` keeps working for callers that validate input generically.
"""


class PDMLError(Exception):
    """Base class of pdml-ray's own errors."""


class ConfigError(PDMLError, ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


class PlanError(PDMLError, ValueError):
    """A plan or decision (batch sizes, sample plan, pipeline plan) failed validation."""
