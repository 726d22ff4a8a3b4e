"""What ``GET /v1/plan`` shows of this machine's files.

A plan names model files, artifact directories, caches and route interpreters by absolute
path — user names, home layouts, where software is installed — and the server's error
bodies already keep such details to its log. So the plan is served with every absolute
path cut to its last component (``/home/ana/models/voice.onnx`` → ``…/voice.onnx``), inside
notes and messages too: what runs where stays readable, the machine's layout does not
leak. ``?paths=full`` serves them whole, to a client on loopback only (the machine's own
user, who could read the files anyway); asked from elsewhere it is a 403.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchestrator.server.guard import is_loopback

PATHS_PARAM = "paths"
FULL = "full"
REDACTED = "redacted"

_ABSOLUTE = re.compile(
    r"""(?<![\w.:/~\\-])(?:/|[A-Za-z]:[\\/]|\\\\)[^\s'"(),;:]*""",
)
"""An absolute path where a token starts: POSIX (``/…``), a drive (``C:\\…``) or UNC
(``\\\\server\\…``); not the tail of a URL or a relative path (``package://…``, ``B/token``)."""


def _cut(match: re.Match[str]) -> str:
    parts = [p for p in re.split(r"[\\/]", match.group(0)) if p]
    return f"…/{parts[-1]}" if parts else "…/"


def redact_paths(value: Any) -> Any:
    """``value`` (a JSON document) with every absolute path in its strings cut to
    ``…/<last component>``; keys and non-string values unchanged."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(_cut, value)
    if isinstance(value, dict):
        return {k: redact_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_paths(v) for v in value]
    return value


def paths_asked(query: Mapping[str, str], client: Any) -> tuple[str, tuple[int, str, str] | None]:
    """(:data:`FULL` or :data:`REDACTED`, None) for a request's ``?paths=``, or the refusal
    (status, message, code): a value that is neither, or ``full`` from a client that is not
    on loopback (``client``: Starlette's ``request.client``, None when unknown)."""
    asked = query.get(PATHS_PARAM, REDACTED)
    if asked not in (REDACTED, FULL):
        return asked, (400, f"paths={asked!r}: give {FULL} or {REDACTED}", "bad_request")
    host = getattr(client, "host", "") or ""
    if asked == FULL and not is_loopback(host):
        return asked, (
            403,
            f"paths={FULL} is served to clients on this machine (loopback) only: the plan's "
            "absolute paths describe this machine's files",
            "paths_not_served",
        )
    return asked, None
