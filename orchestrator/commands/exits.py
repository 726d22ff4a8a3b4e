"""The command line's exit codes, and the check of a numeric flag every command shares.

Below ``cli`` and every command module, so that a command can name its exit code without
importing ``cli`` (which loads the commands by name: that would be a cycle).

Exit codes: 0 success or admitted, 2 bad input (a ``ConfigError``, any other
``OmniEdgeError``, no command), 3 refused (plan or verification, returned by the
command), 4 a stage failed at run time (``StageFailed``), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import math

from orchestrator.core.errors import ConfigError

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_REFUSED = 3
EXIT_STAGE_FAILED = 4
MAX_PROBLEMS_SHOWN = 20
"""A file with thousands of broken entries gets a readable error, not thousands of lines."""


def check_number(
    flag: str,
    value: float | None,
    *,
    above: float | None = None,
    at_least: float | None = None,
    fix: str,
) -> None:
    """``ConfigError`` (exit 2) naming ``flag`` unless ``value`` is None (not given) or a finite
    number greater than ``above`` / at least ``at_least``: argparse's ``type=float`` takes
    ``-5``, ``nan`` and ``inf``, and each became a traceback or a silent misbehaviour
    where the number was finally used. Commands call it before any slow work."""
    if value is None:
        return
    if not math.isfinite(value):
        what = f"{value} is not a finite number"
    elif above is not None and not value > above:
        what = f"{value:g} is not above {above:g}"
    elif at_least is not None and not value >= at_least:
        what = f"{value:g} is below {at_least:g}"
    else:
        return
    raise ConfigError.single(flag, what, fix)
