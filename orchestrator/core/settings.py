"""The one place omni-edge reads its environment and the user's own settings, and their defaults.

Everything here is a plain function or constant; nothing is read at import
time, so a test that sets ``OMNI_EDGE_CACHE_DIR`` (or ``OMNI_EDGE_SETTINGS``) with
``monkeypatch.setenv`` sees its value on the next call.

**The user's settings file** (:func:`user_settings`) is the one input besides the
installed packages that may make omni-edge run code: which route interpreters it may
start (``routes_dir``, ``routes``) and the provider options only the user may give
(``provider_options``: a QNN ``backend_path`` names a library ONNX Runtime loads). It is
``$OMNI_EDGE_SETTINGS`` when set, else ``settings.yaml`` in the platform's per-user
configuration directory (:func:`default_config_root`) — never a file of the working
directory, a pipeline config or a profile (docs/reliability.md, "What omni-edge trusts").
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.validation import CONTROL_CHARACTERS, read_document

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


def find_program(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The program ``name`` (``nvidia-smi``, ``wslpath``) in an absolute directory of ``PATH``,
    or None. Unlike ``shutil.which`` on Windows (before Python 3.12) and a bare name handed to
    the OS, the working directory is never searched, nor a relative ``PATH`` entry (``.``, an
    empty one): a folder someone else made cannot put a program there."""
    env = os.environ if environ is None else environ
    exts = [""]
    if sys.platform == "win32":
        exts += [e for e in env.get("PATHEXT", ".COM;.EXE;.BAT;.CMD").split(";") if e]
    for entry in env.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        for ext in exts:
            candidate = os.path.join(entry, name + ext)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    return None


# ---- the user's own settings -------------------------------------------------------------

SETTINGS_ENV = "OMNI_EDGE_SETTINGS"
"""The user's settings file (YAML), instead of :func:`default_settings_path`."""

SETTINGS_NAME = "settings.yaml"

INSTALL_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding the ``orchestrator`` package: the repository's root for a checkout
installed in editable mode (as ``scripts/bootstrap.sh`` installs it)."""

ROUTES_DIR_NAME = ".venvs"
"""The route environments' directory next to the installation (``.venvs/openvino``, ...)."""

RESERVED_ROUTE_NAMES = ("this-process",)


def default_config_root(
    platform: str | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Path:
    """The platform's per-user configuration directory, with ``omni-edge`` under it:
    ``$XDG_CONFIG_HOME/omni-edge`` when that is an absolute path, else ``~/.config/omni-edge``
    (Linux and other POSIX systems); ``%APPDATA%\\omni-edge`` (Windows: settings roam with the
    user); ``~/Library/Application Support/omni-edge`` (macOS)."""
    platform = sys.platform if platform is None else platform
    env = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    if platform == "win32":
        roaming = env.get("APPDATA")
        return (Path(roaming) if roaming else home / "AppData" / "Roaming") / "omni-edge"
    if platform == "darwin":
        return home / "Library" / "Application Support" / "omni-edge"
    xdg = env.get("XDG_CONFIG_HOME", "")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else home / ".config") / "omni-edge"


def settings_path() -> Path:
    """``$OMNI_EDGE_SETTINGS`` when set, else ``settings.yaml`` in :func:`default_config_root`."""
    env = os.environ.get(SETTINGS_ENV)
    return Path(env).expanduser() if env else default_config_root() / SETTINGS_NAME


@dataclass(frozen=True)
class UserSettings:
    """What the user's settings file says (every path absolute; relative ones were read
    against the file's own directory). An absent file is the empty settings."""

    path: Path
    """The file these came from (it need not exist)."""
    routes_dir: Path | None = None
    """Where the route environments live (``openvino/``, ``ep-openvino/``), looked at before
    the ``.venvs`` next to the installation."""
    routes: dict[str, str] = field(default_factory=dict)
    """Route name → an interpreter omni-edge may start (probed with this machine, and run
    when a profile names it)."""
    provider_options: dict[str, dict[str, str]] = field(default_factory=dict)
    """Backend → provider options only the user may give (a library path); the backend table
    (``orchestrator.core.backends``) says which options these may be."""


SETTINGS_KEYS = ("routes_dir", "routes", "provider_options")

_settings_memo: dict[tuple[str, int, int], UserSettings] = {}


def user_settings() -> UserSettings:
    """The user's settings (:func:`settings_path`), read again whenever the file changes;
    ``ConfigError`` naming the file and the key when it cannot be used (exit 2)."""
    path = settings_path()
    try:
        st = path.stat()
    except FileNotFoundError:
        return UserSettings(path)
    except OSError as exc:
        raise ConfigError.single(
            str(path),
            f"the settings file cannot be read: {exc.strerror or exc}",
            f"make it readable, or point {SETTINGS_ENV} at another file",
        ) from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    found = _settings_memo.get(key)
    if found is None:
        found = _read_settings(path)
        _settings_memo.clear()
        _settings_memo[key] = found
    return found


def _read_settings(path: Path) -> UserSettings:
    data = read_document(path)
    if data is None:
        return UserSettings(path)
    where = str(path)
    fix_shape = (
        "write a mapping with routes_dir (a directory), routes (name: interpreter) and "
        "provider_options (backend: {option: value}); docs/reliability.md#what-omni-edge-trusts"
    )
    if not isinstance(data, dict):
        raise ConfigError.single(where, f"holds a {type(data).__name__}, not a mapping", fix_shape)
    problems = [
        Problem(f"{where}: {k}", "is not a setting omni-edge reads", fix_shape)
        for k in data
        if k not in SETTINGS_KEYS
    ]
    base = path.parent

    def absolute(value: Any, at: str) -> Path | None:
        if not isinstance(value, str) or not value.strip():
            problems.append(Problem(f"{where}: {at}", f"{value!r} is not a path", fix_shape))
            return None
        p = Path(value).expanduser()
        return Path(os.path.normpath(p if p.is_absolute() else base / p))

    routes_dir = None
    if data.get("routes_dir") is not None:
        routes_dir = absolute(data["routes_dir"], "routes_dir")
    routes: dict[str, str] = {}
    raw_routes = data.get("routes") or {}
    if not isinstance(raw_routes, dict):
        problems.append(
            Problem(f"{where}: routes", "is not a mapping of name: interpreter", fix_shape)
        )
        raw_routes = {}
    for name, python in raw_routes.items():
        at = f"routes.{name}"
        if (
            not isinstance(name, str)
            or not name
            or name in RESERVED_ROUTE_NAMES
            or len(name) > 64
            or CONTROL_CHARACTERS.search(name)
        ):
            problems.append(
                Problem(
                    f"{where}: {at}",
                    f"{name!r} cannot name a route (this-process is omni-edge's own; at most 64 "
                    "printable characters)",
                    f"name it e.g. npu-env; {fix_shape}",
                )
            )
            continue
        found = absolute(python, at)
        if found is not None:
            routes[name] = str(found)
    options: dict[str, dict[str, str]] = {}
    raw_options = data.get("provider_options") or {}
    if not isinstance(raw_options, dict):
        problems.append(Problem(f"{where}: provider_options", "is not a mapping", fix_shape))
        raw_options = {}
    for backend_name, given in raw_options.items():
        if not isinstance(given, dict) or not all(
            isinstance(v, (str, int, float, bool)) for v in given.values()
        ):
            problems.append(
                Problem(
                    f"{where}: provider_options.{backend_name}",
                    "is not a mapping of option: value",
                    fix_shape,
                )
            )
            continue
        options[str(backend_name)] = {
            str(k): ("1" if v is True else "0" if v is False else str(v)) for k, v in given.items()
        }
    if problems:
        raise ConfigError(problems)
    return UserSettings(path, routes_dir, routes, options)


def route_dirs() -> list[Path]:
    """Where route environments are looked for, in order: the user's ``routes_dir``, then
    the ``.venvs`` next to the installation. Never the working directory."""
    configured = user_settings().routes_dir
    return [*([configured] if configured else []), INSTALL_ROOT / ROUTES_DIR_NAME]


def _norm(path: str | Path) -> str:
    return os.path.normcase(os.path.normpath(os.path.abspath(path)))


def untrusted_interpreter(python: str) -> str | None:
    """Why omni-edge will not start ``python``, or None when it may: this interpreter's own
    directory (the environment omni-edge runs in), a route environment's directory
    (:func:`route_dirs`), or an interpreter the user's settings name under ``routes``.
    Paths are compared after ``normpath``, links not followed: a venv's ``bin/python`` is
    a link to its base interpreter, and where the link lives decides its site-packages."""
    here = _norm(python)
    if os.path.dirname(here) == os.path.dirname(_norm(sys.executable)):
        return None
    settings = user_settings()
    if here in {_norm(p) for p in settings.routes.values()}:
        return None
    for root in route_dirs():
        base = _norm(root)
        if here.startswith(base.rstrip(os.sep) + os.sep):
            return None
    return (
        f"{python} is not an interpreter omni-edge was told to run: it is not in this environment, "
        f"not under a route directory ({', '.join(str(d) for d in route_dirs())}) and not among "
        f"the routes of your settings ({settings.path})"
    )


def trust_fix(name: str, python: str) -> str:
    """How the user makes ``python`` an interpreter omni-edge may start."""
    return (
        f"if you trust {python}, name it in your settings file {settings_path()} "
        f"(routes: {{{name}: {python}}}; or set {SETTINGS_ENV}), or probe this machine instead "
        "(omni-edge probe --save FILE) and use that profile"
    )
