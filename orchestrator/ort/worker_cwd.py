"""Where route workers start: a private empty directory, never the user's working directory."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

_cwd: list[str] = []
_cwd_lock = threading.Lock()


def private_cwd() -> str:
    """An empty directory only this user can enter (0700), made once per process (again if
    something removed it) and removed when the process exits: where route workers start — not
    the working directory omni-edge was started in, which may be a folder someone else made."""
    with _cwd_lock:
        if not _cwd or not os.path.isdir(_cwd[-1]):
            _cwd.append(tempfile.mkdtemp(prefix="omni-edge-cwd-"))
            atexit.register(shutil.rmtree, _cwd[-1], True)
        return _cwd[-1]
