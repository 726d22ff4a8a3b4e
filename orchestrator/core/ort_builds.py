"""The ONNX Runtime builds: the distributions that install the ``onnxruntime`` module, which
of them this interpreter has, and the refusal of two in one environment.

Several builds share that one module, so only one may live in an environment: a second one
overwrites the first one's files, and which EPs remain depends on the order they were
installed in. The builds are the backend table's (each row's ``distribution``, installed as
its ``build_line`` says: ``orchestrator.core.backends``) and those that bring no EP of their
own (:data:`OTHER_BUILDS`). A distribution that became a plugin EP package at some major
version (a row's ``plugin_since``: ``onnxruntime-qnn`` 2.x installs beside the plain
``onnxruntime``) is a build only before it.

The route program (``orchestrator/ort/worker_probe.py``) must stay stdlib-only, so it keeps
its own list of these names (``ORT_DISTRIBUTIONS``, ``PLUGIN_SINCE``), which
``tests/orchestrator/core/test_ort_flavours.py`` holds equal to :func:`ort_flavours` and
:func:`plugin_since`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from orchestrator.core import backends, packages
from orchestrator.core.errors import ConfigError

OTHER_BUILDS: dict[str, str] = {
    "onnxruntime-training": "pip install onnxruntime-training",
    "ort-nightly": "pip install ort-nightly",
    "ort-nightly-gpu": "pip install ort-nightly-gpu",
    "ort-nightly-directml": "pip install ort-nightly-directml",
}
"""Builds that install the ``onnxruntime`` module without an EP the table lacks, and how each
is installed."""


def ort_flavours() -> dict[str, str]:
    """Every distribution that installs the ``onnxruntime`` module → how it is installed: the
    table's builds (by name), then :data:`OTHER_BUILDS`."""
    rows = sorted(
        (r for r in backends.rows() if r.distribution), key=lambda r: r.distribution or ""
    )
    table = {r.distribution: r.build_line or r.install for r in rows if r.distribution}
    return {**table, **OTHER_BUILDS}


def plugin_since() -> dict[str, int]:
    """The distributions that became plugin EP packages, and the major version they did at
    (the rows' ``plugin_since``)."""
    return {
        r.distribution: r.plugin_since
        for r in backends.rows()
        if r.distribution and r.plugin_since is not None
    }


def installed_ort_flavours(
    version_of: Callable[[str], str | None] | None = None,
) -> list[tuple[str, str]]:
    """``(distribution, version)`` of every installed ONNX Runtime build that provides
    the ``onnxruntime`` module (plugin EP packages are not counted), read from package
    metadata without importing anything. ``version_of`` looks one distribution up
    (None: not installed; default ``packages.installed_version``); tests pass a fake one."""
    lookup = version_of or packages.installed_version
    since = plugin_since()
    found = []
    for name in ort_flavours():
        version = lookup(name)
        if version is None:
            continue
        major = version.split(".", 1)[0]
        if name in since and major.isdigit() and int(major) >= since[name]:
            continue
        found.append((name, version))
    return found


def ort_build() -> tuple[str, str] | None:
    """``(distribution, version)`` of this interpreter's onnxruntime build (the first of
    :func:`installed_ort_flavours`: an environment holds one), or None without one."""
    found = installed_ort_flavours()
    return found[0] if found else None


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
    flavours = ort_flavours()
    names = [f"{n}=={v}" for n, v in found]
    raise ConfigError.single(
        f"this Python environment ({sys.prefix})",
        f"{len(found)} ONNX Runtime builds are installed: {', '.join(names)}. Each provides the same "
        "'onnxruntime' module, so the last one installed has overwritten the others' files and "
        "which execution providers work is an accident of install order",
        f"uninstall them all (pip uninstall -y {' '.join(n for n, _ in found)}), then install the "
        f"one whose EP you need: {' or '.join(flavours[n] for n, _ in found)}. One flavour per "
        "environment; another EP goes in a venv of its own, reached as an interpreter route (docs/install.md)",
    )
