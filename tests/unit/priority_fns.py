"""User priority functions for tests: named as 'priority_fns:NAME' in GradientPriorityConfig.priority_fn."""


def grad_norm_squared(report):
    """A valid gradient-importance signal: the squared gradient norm."""
    return report.grad_norm ** 2


def with_default(report, scale=2.0):
    """Extra parameters are fine when they have defaults."""
    return scale * report.grad_norm


def negative(report):
    """Returns a value the deriver must refuse."""
    return -1.0


def two_reports(report, other):
    """Wrong signature: needs two positional arguments."""
    return 0.0


def no_arguments():
    """Wrong signature: takes none."""
    return 0.0


NOT_A_FUNCTION = 3
