"""The one place the verification code reads the environment, and its defaults.

Everything here is a plain function or constant; nothing is read at import
time, so a test that sets ``OMNI_EDGE_CACHE_DIR`` with ``monkeypatch.setenv``
sees its value on the next call.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from orchestrator.core.errors import ConfigError

log = logging.getLogger(__name__)

CACHE_ENV = "OMNI_EDGE_CACHE_DIR"
"""Root of everything omni-edge caches on this machine (evidence, graph stats,
EP compile caches). Default: the platform's cache directory (:func:`default_cache_root`)."""

PROBE_TIMEOUT_S = 60.0
"""A route probe starts an interpreter and imports numpy and onnxruntime: seconds
warm, longer for a cold Windows interpreter reached through WSL interop (figures
in docs/benchmarks.md). A minute is generous for both and still ends a hung one."""

OPEN_TIMEOUT_S = 900.0
"""Opening a session compiles the graph for the EP. VitisAI and the OpenVINO NPU
plugin compile for minutes on first use (AMD documents "can take minutes"); the
OpenVINO CPU plugin takes seconds (docs/benchmarks.md)."""

RUN_TIMEOUT_S = 300.0
"""One inference call: a TTS sentence takes a fraction of a second on a CPU
(docs/benchmarks.md); five minutes only ends a worker that is stuck."""


def cache_root() -> Path:
    """``$OMNI_EDGE_CACHE_DIR`` when set, else :func:`default_cache_root`."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else default_cache_root()


def default_cache_root(
    platform: str | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Path:
    """The platform's convention for a per-user cache, with ``omni-edge`` under it:

    * Linux and other POSIX systems: ``$XDG_CACHE_HOME/omni-edge`` when that is an
      absolute path (the XDG Base Directory spec says to ignore a relative one),
      else ``~/.cache/omni-edge``;
    * Windows: ``%LOCALAPPDATA%\\omni-edge\\cache`` (local, not roaming: caches
      are per machine), else ``~\\AppData\\Local\\omni-edge\\cache``;
    * macOS: ``~/Library/Caches/omni-edge``.

    The arguments default to this process's ``sys.platform``, environment and home.
    """
    platform = sys.platform if platform is None else platform
    env = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    if platform == "win32":
        local = env.get("LOCALAPPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "omni-edge" / "cache"
    if platform == "darwin":
        return home / "Library" / "Caches" / "omni-edge"
    xdg = env.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache") / "omni-edge"


def evidence_dir() -> Path:
    """Where gate evidence lives: one JSON file per evidence key."""
    return cache_root() / "evidence"


def graph_stats_dir() -> Path:
    """Where ``describe_graph`` memoises graph statistics, keyed by each file's
    size, mtime, ctime, inode and device."""
    return cache_root() / "graphs"


def gguf_headers_dir() -> Path:
    """Where ``stages.ar_decode.checkpoint.gguf_header`` memoises GGUF header facts, keyed by
    each file's size, mtime, ctime, inode and device."""
    return cache_root() / "gguf"


def ep_cache_dir(backend: str) -> Path:
    """Compile caches an EP may write (VitisAI's cache_dir, OpenVINO's blobs)."""
    return cache_root() / "ep-cache" / backend


def _unwritable(directory: Path) -> str | None:
    """Why no file can be written in ``directory`` (created if missing), or None.

    A probe file is created with ``O_EXCL`` and removed at once. This catches
    what stops root too: a regular file where a directory of the path should be,
    a read-only file system, /proc.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe.{os.getpid()}.{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as exc:
        return f"{exc.strerror or type(exc).__name__}{f' ({exc.filename})' if exc.filename else ''}"
    return None


def _fix(directory: Path) -> str:
    return (
        f"set {CACHE_ENV} to a directory you can write (now {cache_root()}), "
        f"or make {directory} a writable directory"
    )


def require_cache_dir(directory: Path, what: str) -> Path:
    """``directory`` (created), when the command cannot do its job without writing
    there; else a ``ConfigError`` naming the directory and the fix (exit 2)."""
    reason = _unwritable(directory)
    if reason is not None:
        raise ConfigError.single(
            str(directory),
            f"the omni-edge cache directory for {what} cannot be written: {reason}",
            _fix(directory),
        )
    return directory


_warned: set[str] = set()


def cache_write_failed(directory: Path, what: str, exc: OSError) -> None:
    """An optional cache could not be written: warn once per directory, then carry on
    without it (a cache costs speed, never correctness)."""
    key = str(directory)
    if key in _warned:
        log.debug("still cannot cache %s in %s: %s", what, directory, exc)
        return
    _warned.add(key)
    log.warning(
        "cannot cache %s in %s (%s); continuing without caching. To cache: %s",
        what,
        directory,
        exc.strerror or exc,
        _fix(directory),
    )
