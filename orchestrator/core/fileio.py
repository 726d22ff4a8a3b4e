"""Writing files so that nothing is ever half-written.

Every file omni-edge writes — plans, profiles, run records, gate evidence, the
memos of graph statistics, GGUF headers and route probes — goes through
:func:`write_bytes_atomic`: the bytes go to a temporary file in the target's
directory, which is then renamed over the target (or, with
``overwrite=False``, linked to it, so an existing file is never replaced). A
reader sees the old file or the new one, never a torn one, and two writers of
the same memo leave one whole file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.core.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
try:
    import msvcrt as _msvcrt
except ImportError:  # every system but Windows
    _msvcrt = None  # type: ignore[assignment]
msvcrt: Any = _msvcrt
"""Windows' C runtime module (``locking``), or None; ``Any`` because its stubs exist only for win32."""

LOCK_RETRY_S = 0.05
"""Windows: how long to wait between attempts while another process holds a lock."""


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file's bytes (hex), read in ``chunk``-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes, held while the block runs.

    POSIX: ``flock`` (advisory; it blocks until the holder lets go). Windows:
    ``msvcrt.locking`` on the file's first byte (mandatory for that byte; its
    ``LK_LOCK`` gives up after ten one-second tries, so this retries until the
    holder lets go). With neither, a no-op: an atomic rename still keeps
    half-written work out of use.
    """
    if fcntl is not None:
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return
    if msvcrt is not None:
        with open(path, "a+b") as f:
            _windows_lock(f.fileno())
            try:
                yield
            finally:
                os.lseek(f.fileno(), 0, os.SEEK_SET)
                msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
        return
    yield  # pragma: no cover - neither flock nor msvcrt


def _windows_lock(fd: int) -> None:
    """Lock byte 0 of ``fd`` with ``msvcrt.locking``, waiting as long as another holds it."""
    while True:
        os.lseek(fd, 0, os.SEEK_SET)  # locking() locks from the current position
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return
        except OSError:  # held by another process (EACCES / EDEADLOCK)
            time.sleep(LOCK_RETRY_S)


def write_bytes_atomic(
    path: str | Path, data: bytes, *, overwrite: bool = True, durable: bool = False
) -> None:
    """Write ``data`` to ``path`` atomically, creating the parent directory.

    ``overwrite=False``: raise ``FileExistsError`` when ``path`` exists, even if
    it appears between any check of the caller's and this write (the last step
    is a hard link, which fails on an existing name; on a file system without
    hard links, a check and a rename). ``durable``: ``fsync`` the data before it
    is renamed into place (for files a user asked for, not for caches).

    The file gets the mode a plain ``open(path, "w")`` would give it (the umask
    applies), not ``tempfile``'s owner-only 0600.
    """
    target = Path(path)
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, target)
        else:
            _link_new(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _link_new(tmp: Path, target: Path) -> None:
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError:
        # A file system without hard links: check, then rename.
        if target.exists():
            raise FileExistsError(f"{target} exists") from None
        os.replace(tmp, target)


def write_text_atomic(
    path: str | Path, text: str, *, overwrite: bool = True, durable: bool = False
) -> None:
    """:func:`write_bytes_atomic` for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"), overwrite=overwrite, durable=durable)


def write_json_atomic(
    path: str | Path,
    data: Any,
    *,
    indent: int | None = 2,
    default: Callable[[Any], Any] | None = None,
    overwrite: bool = True,
    durable: bool = False,
) -> None:
    """:func:`write_bytes_atomic` for a JSON document (with a final newline).

    ``indent=None`` writes it compact (memos that only a program reads);
    ``default`` converts what ``json`` cannot (as in ``json.dumps``).
    """
    text = json.dumps(data, indent=indent, default=default) + "\n"
    write_text_atomic(path, text, overwrite=overwrite, durable=durable)


def check_writable(path: str | Path, *, what: str) -> None:
    """Raise ``ConfigError`` (where=``what``) unless a file can be written at ``path``.

    Checked before any work, so a command that would write its result at the
    end refuses at once: the parent directory must exist and accept a new file
    (a probe file is created there with ``O_EXCL`` and removed at once, so
    nothing is left behind), and ``path`` itself must not be a directory. This
    catches a missing directory, a path under ``/proc`` or ``/sys``, a
    read-only directory or file system, and a directory given as the file.
    """
    target = Path(path)
    where = f"{what} {target}"
    if str(path) == "" or target.name in ("", ".", ".."):
        raise ConfigError.single(
            where, "this is not a file name", "give a path to a file, e.g. out/plan.json"
        )
    if target.is_dir():
        raise ConfigError.single(
            where,
            "this is a directory, not a file",
            f"name a file inside it, e.g. {target / 'out.json'}",
        )
    parent = target.parent
    if not parent.exists():
        raise ConfigError.single(
            where,
            f"the directory {parent} does not exist",
            f"create it first (mkdir -p {parent}), or write somewhere else",
        )
    if not parent.is_dir():
        raise ConfigError.single(
            where, f"{parent} is not a directory", "write the file into an existing directory"
        )
    probe = parent / f".{target.name[:64]}.{os.getpid()}.{secrets.token_hex(4)}.probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError.single(
            where,
            f"a file cannot be created in {parent}: {reason}",
            "write to a directory you can write to",
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
