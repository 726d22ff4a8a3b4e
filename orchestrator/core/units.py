"""Byte quantities: parsed once at the boundary, plain ``int`` inside.

``parse_bytes("16GiB") == 17179869184``. Decimal (kB, MB, GB) and binary
(KiB, MiB, GiB) suffixes are both accepted because vendors quote both; a bare
number is bytes. Nothing inside the orchestrator takes ``int | str``.
"""

from __future__ import annotations

import re

KiB = 2**10
MiB = 2**20
GiB = 2**30

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """Return ``value`` as a whole number of bytes.

    Raises ``ValueError`` with the accepted forms when ``value`` is not one of
    them; negative quantities are rejected.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte quantity")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a byte quantity is >= 0")
        return value
    match = _PATTERN.match(str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"{value!r} is not a byte quantity; write e.g. 1048576, '512MiB', '16GiB' or '8GB'"
        )
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def fmt_bytes(n: int) -> str:
    """Human form with a binary unit: ``fmt_bytes(3 * GiB // 2) == '1.50 GiB'``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= GiB:
        return f"{sign}{n / GiB:.2f} GiB"
    if n >= MiB:
        return f"{sign}{n / MiB:.1f} MiB"
    if n >= KiB:
        return f"{sign}{n / KiB:.1f} KiB"
    return f"{sign}{n} B"
