"""Writing files so that nothing is ever half-written, lost, or left behind.

Every file omni-edge writes — plans, profiles, run records, gate evidence, the
measurement store, the memos of graph statistics, GGUF headers and route
probes — goes through :func:`write_bytes_atomic`: the bytes go to a temporary
file in the target's directory (``.NAME.<pid>.<hex>.tmp``, created with
``O_EXCL`` and ``O_NOFOLLOW``, so a name planted there — a symlink — is never
written through), which is then renamed over the target (or, with
``overwrite=False``, linked to it, so an existing file is never replaced). A
reader sees the old file or the new one, never a torn one, and two writers of
the same memo leave one whole file.

Durable by default (SQLite's and git's discipline): the temporary file is
fsynced before the rename and the directory after it (and every directory the
write created, in its parent), so what a user keeps survives a power loss, not
only a crash of this process. ``durable=False`` is the switch for caches that
are cheap to rebuild (graph statistics, GGUF headers, route probes): they are
still atomic, only not flushed to the disk. ``bench/durable_writes.py``
measures what the flushes cost.

A writer holds an exclusive ``flock`` on its temporary file while it writes, and
the file's name carries its process id: :func:`remove_orphans` removes only the
temporary files whose writer is gone (the process does not exist here, and
nothing holds the lock) — what a SIGKILL or a power loss leaves behind — when a
store is next opened.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
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


def temp_name(target: str | Path, kind: str = "tmp") -> Path:
    """A fresh temporary name beside ``target`` for this process: ``.NAME.<pid>.<hex>.KIND``
    (what :func:`remove_orphans` recognises, and whose writer it can tell is gone)."""
    t = Path(target)
    return t.parent / f".{t.name}.{os.getpid()}.{secrets.token_hex(4)}.{kind}"


def open_exclusive(path: Path, *, readable: bool = False) -> int:
    """A new file at ``path`` for writing (``readable``: and reading; ``O_EXCL``: never one
    that exists; ``O_NOFOLLOW``: never through a symlink), with the mode ``open(path, "w")``
    would give it, and this process's ``flock`` on it (held until the descriptor is closed:
    the writer is alive)."""
    flags = (os.O_RDWR if readable else os.O_WRONLY) | os.O_CREAT | os.O_EXCL
    flags |= getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, 0o666)
    if fcntl is not None:
        # a file system without flock: the process id in the name still names the writer
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def fsync_directory(directory: str | Path) -> None:
    """Flush ``directory``'s entries (a rename, a new name) to the disk. Where a directory
    cannot be opened or synced (Windows; a file system that refuses it), a no-op."""
    if os.name == "nt":  # pragma: no cover - Windows has no directory fsync
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. a directory one may write but not read
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EROFS):
            raise
    finally:
        os.close(fd)


def fsync_tree(directory: str | Path) -> None:
    """Flush every file under ``directory`` and every directory's entries, deepest first (an
    exported artifact before it is renamed into place). Symlinks are not followed."""
    for root, _dirs, files in os.walk(directory, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(root)


def make_directories(directory: str | Path, *, durable: bool = True) -> None:
    """``mkdir -p directory``; ``durable``: each directory it creates is fsynced into its parent."""
    d = Path(directory)
    missing = []
    while not os.path.lexists(d) and d.parent != d:
        missing.append(d)
        d = d.parent
    for new in reversed(missing):
        try:
            new.mkdir()
        except FileExistsError:  # made meanwhile by another writer
            if not new.is_dir():
                raise
            continue
        if durable:
            fsync_directory(new.parent)


def write_bytes_atomic(
    path: str | Path, data: bytes, *, overwrite: bool = True, durable: bool = True
) -> None:
    """Write ``data`` to ``path`` atomically, creating the parent directory.

    ``overwrite=False``: raise ``FileExistsError`` when ``path`` exists, even if
    it appears between any check of the caller's and this write (the last step
    is a hard link, which fails on an existing name; on a file system without
    hard links, a check and a rename). ``durable`` (the default): the data is
    fsynced before it is renamed into place and the directory after, so the
    file survives a power loss; ``durable=False`` for caches that are cheap to
    rebuild.

    The file gets the mode a plain ``open(path, "w")`` would give it (the umask
    applies), not ``tempfile``'s owner-only 0600.
    """
    target = Path(path)
    directory = target.parent
    make_directories(directory, durable=durable)
    tmp = temp_name(target)
    fd = open_exclusive(tmp)
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
    if durable:
        fsync_directory(directory)


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


def keep_aside(path: str | Path, tag: str) -> Path:
    """Move ``path`` aside to ``NAME.TAG-<time>`` in its directory (``-2``, ``-3``, … when that
    name is taken: nothing is ever replaced), durably; returns the new path. ``OSError``
    when it cannot be moved."""
    p = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        aside = p.with_name(f"{p.name}.{tag}-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            os.link(p, aside)
        except FileExistsError:
            continue
        except OSError:  # no hard links here (or not allowed): check, then rename
            if os.path.lexists(aside):
                continue
            os.rename(p, aside)
        else:
            p.unlink()
        fsync_directory(p.parent)
        return aside
    raise FileExistsError(f"{p}: no free name to keep it aside as")


def write_text_atomic(
    path: str | Path, text: str, *, overwrite: bool = True, durable: bool = True
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
    durable: bool = True,
) -> None:
    """:func:`write_bytes_atomic` for a JSON document (with a final newline).

    ``indent=None`` writes it compact (memos that only a program reads);
    ``default`` converts what ``json`` cannot (as in ``json.dumps``).
    """
    text = json.dumps(data, indent=indent, default=default) + "\n"
    write_text_atomic(path, text, overwrite=overwrite, durable=durable)


ORPHAN_NAME = re.compile(
    r"^\.(?P<name>.+)\.(?P<pid>[0-9]+)\.[0-9a-f]{8}\.(?P<kind>tmp|partial|export)$"
)
"""A temporary name of :func:`temp_name`: ``.NAME.<pid>.<hex>.KIND`` (``tmp``: an atomic write;
``partial``: a WAV being streamed; ``export``: an artifact directory being built)."""


def remove_orphans(directory: str | Path, *, name: str | None = None) -> list[Path]:
    """Remove what writers that are gone left in ``directory``: the temporary files (and export
    directories) named by :func:`temp_name` whose process no longer exists on this machine and
    which no process holds locked (a writer in another PID namespace still holds its
    ``flock``). ``name``: only those of that target (in a directory a user owns, nothing
    else is touched). Returns what was removed; never raises. POSIX only: elsewhere a
    process id cannot be checked without side effects, and nothing is removed."""
    if os.name == "nt" or fcntl is None:  # pragma: no cover - Windows
        return []
    try:
        listing = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for entry in sorted(listing):
        m = ORPHAN_NAME.match(entry)
        if m is None or (name is not None and m["name"] != name):
            continue
        path = Path(directory) / entry
        if not writer_gone(path):
            continue
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def writer_gone(path: Path) -> bool:
    """Whether the writer of the temporary ``path`` (a :func:`temp_name`) is gone: its process
    does not exist here and nothing holds the file locked. False for any other name."""
    m = ORPHAN_NAME.match(path.name)
    return m is not None and not _alive(int(m["pid"])) and not _held(path)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists here (another user's counts; so does a zombie)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, and belongs to someone else
        return True
    return True


def _held(path: Path) -> bool:
    """Whether a process holds ``path`` locked (its writer is alive), or it is not ours to judge
    (a symlink: omni-edge never makes one there)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock on this file system: the process id decides
        return False
    finally:
        os.close(fd)
    return False


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
