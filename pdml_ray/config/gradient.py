"""Gradient priorities' config: the combined gradient/data/node priority, its weight bandit, top-K.

``priority_fn`` ("module:function") is user code: building the config checks only the name's shape
and imports nothing, so reading or validating a config never runs it. ``load_priority_fn`` imports it
by name with ``importlib`` (never ``eval``) where it is needed: ``PDMLTrainer`` before it launches
anything (``pdml_ray.config.training``), so a typo fails at start-up with a ``ConfigError``, and the
scheduler's gradient deriver, which calls it. It must accept exactly one positional argument, a
``pdml_ray.decisions.WorkerReport``, and return the raw gradient-importance signal of that report (a
finite number >= 0, e.g. ``report.grad_norm ** 2``); the deriver normalises it by its running mean
like the default signal, ``grad_norm``.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdml_ray.config.checks import MAX_REAL, MAX_STEPS, check_range, finite, require
from pdml_ray.config.continuity import ContinuityConfig
from pdml_ray.errors import ConfigError, shown

_FN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def check_priority_fn_name(name: Any, where: str = "gradient_priority.priority_fn") -> None:
    """Check that ``name`` has the shape ``"module:function"`` (dotted identifiers), importing nothing."""
    if not isinstance(name, str) or len(name) > 200 or not _FN_NAME.match(name):
        raise ConfigError(f"{where} must name a function as 'module:function' (e.g. 'my_pkg.priorities:grad_score'), "
                          f"got {shown(name)}")


def load_priority_fn(name: str, where: str = "gradient_priority.priority_fn") -> Callable[[Any], float]:
    """Import ``"module:function"`` and check that it takes exactly one positional argument (a report).

    This runs the module's code: the scheduler's gradient deriver calls it where the function is
    used, ``PDMLTrainer`` before launching anything, ``validate-config`` only with
    ``--import-priority-fn``. Raises ConfigError for a malformed name, a module that is missing or
    fails to import (whatever it raises, ``SystemExit`` included), a missing attribute, something
    not callable, or a signature that cannot be called as ``fn(report)``.
    """
    check_priority_fn_name(name, where)
    module_name, fn_name = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigError(f"{where}: no module named {module_name!r}; install it or put it on "
                              f"PYTHONPATH on the driver and every node") from None
        raise ConfigError(f"{where}: module {module_name!r} failed to import: {str(e)[:200]}") from e
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's module raised (SystemExit too) while importing
        raise ConfigError(f"{where}: module {module_name!r} failed to import: {type(e).__name__}: "
                          f"{str(e)[:200]}") from e
    if not hasattr(module, fn_name):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"{where}: module {module_name!r} has no function {fn_name!r}; its callables: "
                          f"{shown(public, 200)}")
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise ConfigError(f"{where}: {name!r} is a {type(fn).__name__}, not a function")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return fn
    try:
        sig.bind(None)
    except TypeError:
        raise ConfigError(f"{where}: {name!r} has signature {fn_name}{shown(sig, 200)}; it must accept exactly one "
                          "positional argument, fn(report: WorkerReport) -> float (other parameters need defaults)") from None
    return fn


def _simplex(w: Any) -> bool:
    return (isinstance(w, (list, tuple)) and len(w) == 3 and all(finite(x) and x >= 0 for x in w)
            and abs(sum(w) - 1.0) <= 1e-6)


def _few_items_continuity() -> ContinuityConfig:
    # Priorities per worker are few items: checked at every boundary; "peaked" = effectively fewer
    # than 1.5 workers hold the mass (the sample table's defaults, 16 items, would flag every run).
    return ContinuityConfig(check_interval=1, min_normalized_ess=0.5, min_effective_items=1.5)


@dataclass(kw_only=True, slots=True)
class GradientPriorityConfig:
    """Gradient priorities: per-worker priority = alpha * gradient term + beta * data-difficulty term +
    gamma * node-health term (``pdml_ray.priority.gradient``), weights tuned by a bandit, and the
    fraction K of arrived gradients a top-K policy applies."""

    prior_weights: tuple[float, float, float] = (0.5, 0.3, 0.2)
    """(alpha, beta, gamma) on the simplex (>= 0, sum 1): where the bandit starts, and where the weights
    return when the continuity check finds the priorities collapsed."""
    simplex_resolution: int = 2
    """The bandit's arms are the prior plus the grid {(i, j, k) / R : i + j + k = R} on the simplex:
    R = 2 gives 6 grid points (vertices and edge midpoints), (R + 1)(R + 2) / 2 in general. R = 0: the prior
    alone, the weights pinned at ``prior_weights`` (nothing to tune)."""
    bandit_discount: float = 0.98
    """Discounted UCB: each boundary, every arm's past rewards count this much less (loss decrease per
    second shrinks as training converges; 0.98 keeps about the last 50 boundaries). 1.0 = plain UCB1."""
    bandit_exploration: float = 1.0
    """UCB exploration constant c, in units of the running mean absolute reward."""
    collapse_hold: int = 2
    """Boundaries the prior weights are held after a collapse reset before the bandit chooses again."""
    normaliser_ema: float = 0.02
    """Weight of the newest report in the running means that normalise gradient norm and loss (about the
    last 1 / normaliser_ema reports carry them)."""
    worker_ema: float = 0.5
    """Weight of the newest report in each worker's own smoothed gradient norm, loss and throughput."""
    k_min: float = 0.5
    """Smallest fraction of arrived gradients a top-K policy applies (while the loss falls fastest)."""
    k_max: float = 1.0
    """Largest fraction (when progress stalls, and before any progress is measured)."""
    progress_ema: float = 0.2
    """Weight of the newest interval in the smoothed convergence rate (relative loss decrease per step)."""
    max_wait: int = 4
    """No-starvation bound M: every worker's gradient is applied at least once in any M consecutive steps
    (if it arrives), whatever its priority."""
    max_staleness: int = 4
    """S: an asynchronous policy refuses gradients more than S steps stale; fresher ones weigh 1 / (1 + s)."""
    priority_fn: str | None = None
    """Optional "module:function" computing the raw gradient-importance signal of one report,
    ``fn(report: WorkerReport) -> float`` (>= 0); None uses ``report.grad_norm``. Its shape is checked
    when the config is built; it is imported (``load_priority_fn``) only where it runs."""
    continuity: ContinuityConfig = field(default_factory=_few_items_continuity)
    """The continuity check on the per-worker priorities (few items: see ``_few_items_continuity``)."""

    def __post_init__(self) -> None:
        w = self.prior_weights
        require(_simplex(w), "gradient_priority.prior_weights must be three numbers >= 0 summing to 1 "
                             f"(alpha, beta, gamma, e.g. [0.5, 0.3, 0.2]), got {shown(w)}")
        self.prior_weights = (float(w[0]), float(w[1]), float(w[2]))
        check_range(self.simplex_resolution, "gradient_priority.simplex_resolution", 0, 10, whole=True,
                    hint="e.g. 2; 0 pins the weights at prior_weights")
        check_range(self.bandit_discount, "gradient_priority.bandit_discount", 0.5, 1.0, hint="1 = no forgetting")
        check_range(self.bandit_exploration, "gradient_priority.bandit_exploration", 0.0, MAX_REAL, hint="e.g. 1.0")
        check_range(self.collapse_hold, "gradient_priority.collapse_hold", 0, MAX_STEPS, whole=True, hint="boundaries")
        for name in ("normaliser_ema", "worker_ema", "progress_ema"):
            check_range(getattr(self, name), f"gradient_priority.{name}", 0.0, 1.0, open_low=True)
        require(finite(self.k_min) and finite(self.k_max) and 0.0 < self.k_min <= self.k_max <= 1.0,
                f"gradient_priority.k_min and k_max must satisfy 0 < k_min <= k_max <= 1 (fractions of the "
                f"arrived gradients), got {shown(self.k_min)} and {shown(self.k_max)}")
        check_range(self.max_wait, "gradient_priority.max_wait", 1, MAX_STEPS, whole=True, hint="steps")
        check_range(self.max_staleness, "gradient_priority.max_staleness", 0, MAX_STEPS, whole=True, hint="steps")
        if self.priority_fn is not None:
            check_priority_fn_name(self.priority_fn)
        require(isinstance(self.continuity, ContinuityConfig),
                f"gradient_priority.continuity must be a ContinuityConfig, got {shown(self.continuity)}")
