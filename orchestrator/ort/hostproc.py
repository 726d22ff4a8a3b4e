"""Host-process routes: a Windows-side ``python.exe`` driven from inside WSL2.

On a laptop whose GPU is used by vLLM inside WSL2 and whose NPU and iGPU only
Windows drivers reach (VitisAI, DirectML), one pipeline uses both through a
*host-process* route: the profile names a Windows interpreter by its WSL path
(``/mnt/c/omni-edge/venv-directml/Scripts/python.exe``), WSL's interop starts
it like any Linux program, and the route worker (``worker.py``, sent over stdin)
speaks the same framed protocol over its stdin/stdout as any other route. What
differs is the file system: the Windows process cannot open ``/home/me/...``;
it opens ``\\\\wsl.localhost\\Ubuntu\\home\\me\\...`` (WSL's 9P share of the
distribution's files) or, for files on a Windows drive, ``C:\\...``. Every
path handed to it (the graph, an EP's ``cache_dir`` and ``config_file``) is
translated here.

:func:`windows_path` asks ``wslpath -w`` — WSL's own answer, which knows the
share's name on this Windows build (``\\\\wsl.localhost\\`` on Windows 11,
``\\\\wsl$\\`` on older builds) and a custom ``automount.root`` — and falls
back to :func:`translate` (the same rules, in Python) where there is no
``wslpath``; :func:`translate` is checked against recorded ``wslpath`` output
(tests/orchestrator/ort/wslpath_recorded.json).
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import shutil
import subprocess
from collections.abc import Mapping

HOST_PROCESS = "host-process"
DEFAULT_SHARE = "wsl.localhost"
"""The UNC server name under which Windows 11 serves WSL distributions' files."""
DEFAULT_AUTOMOUNT_ROOT = "/mnt/"
"""Where WSL mounts Windows drives (``[automount] root`` in /etc/wsl.conf)."""


class PathTranslationError(ValueError):
    """A path cannot be spelled for the Windows side (no wslpath and no distribution name)."""


def is_windows_interpreter(python: str | None) -> bool:
    """Whether ``python`` names a Windows executable (what a host-process route starts from WSL)."""
    return bool(python) and str(python).lower().endswith(".exe")


def route_kind_for(python: str, *, wsl: bool) -> str:
    """The route kind for an interpreter given on the command line: a Windows
    ``.exe`` from inside WSL2 crosses to the host (``host-process``); anything
    else is another interpreter on this OS."""
    return HOST_PROCESS if wsl and is_windows_interpreter(python) else "interpreter"


def translate(
    path: str,
    *,
    distro: str,
    share: str = DEFAULT_SHARE,
    automount_root: str = DEFAULT_AUTOMOUNT_ROOT,
) -> str:
    """``path`` (absolute, on the WSL side) as ``wslpath -w`` spells it, without running it.

    ``/mnt/c/Users/me`` → ``C:\\Users\\me`` (a drive under the automount root);
    ``/home/me/x.onnx`` → ``\\\\wsl.localhost\\<distro>\\home\\me\\x.onnx``;
    ``/`` → ``\\\\wsl.localhost\\<distro>\\``. The path is normalised (``..``,
    doubled slashes) but links are not resolved, as ``wslpath`` does not.
    """
    if not posixpath.isabs(path):
        raise PathTranslationError(f"{path!r} is not an absolute path")
    norm = posixpath.normpath(path)
    norm = "/" + norm.lstrip("/")  # normpath keeps a leading '//'
    root = "/" + automount_root.strip("/") + "/"
    m = re.match(re.escape(root) + r"([A-Za-z])(/.*)?$", norm)
    if m:
        rest = (m.group(2) or "/").replace("/", "\\")
        return f"{m.group(1).upper()}:{rest}"
    return f"\\\\{share}\\{distro}" + norm.replace("/", "\\")


@functools.lru_cache(maxsize=1024)
def _wslpath(exe: str, path: str) -> str:
    out = subprocess.run([exe, "-w", path], capture_output=True, text=True, check=True, timeout=10)
    return out.stdout.strip()


def windows_path(path: str, environ: Mapping[str, str] | None = None) -> str:
    """``path`` (a local path inside WSL2) as the Windows side must spell it.

    ``wslpath -w`` when it is on PATH (WSL installs it; its answers are
    remembered per path); else :func:`translate` with the distribution named by
    ``WSL_DISTRO_NAME`` (WSL sets it in every shell). Neither: a
    :class:`PathTranslationError` that says so.
    """
    env = os.environ if environ is None else environ
    absolute = os.path.abspath(path)
    # absolute PATH entries only: never a wslpath of the working directory (".", an empty entry)
    search = os.pathsep.join(e for e in env.get("PATH", "").split(os.pathsep) if os.path.isabs(e))
    exe = shutil.which("wslpath", path=search)
    if exe:
        try:
            return _wslpath(exe, absolute)
        except (OSError, subprocess.SubprocessError) as exc:
            raise PathTranslationError(f"wslpath -w {absolute} failed: {exc}") from None
    distro = env.get("WSL_DISTRO_NAME")
    if not distro:
        raise PathTranslationError(
            f"cannot spell {absolute} for a Windows process: there is no wslpath on PATH and "
            "WSL_DISTRO_NAME is not set (a host-process route runs from inside WSL2)"
        )
    return translate(absolute, distro=distro)


def launch_remedy(kind: str, python: str) -> str:
    """What to check when ``python`` could not be started at all."""
    if kind == HOST_PROCESS and is_windows_interpreter(python):
        return (
            f"a Windows python.exe starts from WSL2 only through WSL's interop: check that {python} exists "
            "(ls it) and that /proc/sys/fs/binfmt_misc/WSLInterop exists (else set [interop] enabled=true "
            "in /etc/wsl.conf and run wsl --shutdown from Windows)"
        )
    return "check routes[].python: it must be an interpreter this process can execute"
