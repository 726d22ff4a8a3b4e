"""Each ONNX Runtime extra resolves on the platforms it is meant for, with binary wheels only.

What a Windows user gets from ``pip install "omni-edge[directml]"`` is checked
here on Linux, against the package index: the extra's requirements, with their
environment markers evaluated **for the target platform**, plus the core
dependencies, resolved by ``pip install --dry-run --only-binary=:all:
--platform TAG --python-version 3.11 --report``. The report must hold the
flavour's ONNX Runtime build and no other build of the ``onnxruntime`` module
(a plugin EP such as onnxruntime-qnn 2.x comes with plain onnxruntime).

Why the markers are evaluated here and not by pip: pip evaluates markers against
the interpreter running it, whatever ``--platform`` says (checked: ``pip install
--dry-run --platform win_amd64 "PKG[directml]"`` on Linux drops a requirement
marked ``sys_platform == 'win32'`` and resolves only the project). On the target
machine pip evaluates them for that machine, which is what this test reproduces.

Needs the package index: without it the test skips as missing, which fails it under
``--require-assets`` (scripts/test.sh; tests/helpers/skips.py). pip's own HTTP cache
keeps a re-run fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from orchestrator.core.ort_builds import ort_flavours, plugin_since
from tests.helpers import REPO
from tests.helpers.skips import skip_missing

ORT_FLAVOURS = ort_flavours()
PLUGIN_SINCE = plugin_since()

pytestmark = pytest.mark.index

PYTHON_VERSION = "3.11"
PLATFORM_TAGS = {
    # pip takes the tags literally: a manylinux_2_28 machine also takes older manylinux wheels
    "manylinux_2_28_x86_64": [
        "manylinux_2_28_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
    ],
}
PYTHON_FOR = {
    # PyYAML publishes win_arm64 wheels for CPython 3.12 and later only (pip index versions pyyaml
    # --platform win_arm64: none for 3.11, 6.0.4 for 3.12): on Windows on Arm, use Python >= 3.12.
    "win_arm64": "3.12",
}
ENVIRONMENTS = {
    # pip platform tag → the marker environment a CPython 3.11 there reports
    "win_amd64": {
        "sys_platform": "win32",
        "platform_system": "Windows",
        "os_name": "nt",
        "platform_machine": "AMD64",
    },
    "win_arm64": {
        "sys_platform": "win32",
        "platform_system": "Windows",
        "os_name": "nt",
        "platform_machine": "ARM64",
    },
    "manylinux_2_28_x86_64": {
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
    },
    "macosx_14_0_arm64": {
        "sys_platform": "darwin",
        "platform_system": "Darwin",
        "os_name": "posix",
        "platform_machine": "arm64",
    },
}
CASES = [
    # (extra, platform tag, the onnxruntime build expected, a plugin EP expected beside it)
    ("directml", "win_amd64", "onnxruntime-directml", None),
    ("cpu", "win_amd64", "onnxruntime", None),
    ("cpu", "manylinux_2_28_x86_64", "onnxruntime", None),
    ("cpu", "macosx_14_0_arm64", "onnxruntime", None),
    ("openvino", "win_amd64", "onnxruntime-openvino", None),
    ("openvino", "manylinux_2_28_x86_64", "onnxruntime-openvino", None),
    ("cuda", "manylinux_2_28_x86_64", "onnxruntime-gpu", None),
    ("cuda", "win_amd64", "onnxruntime-gpu", None),
    ("qnn", "win_arm64", "onnxruntime", "onnxruntime-qnn"),
    ("qnn", "win_amd64", "onnxruntime", "onnxruntime-qnn"),
]
NETWORK_TROUBLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "No route to host",
)


def requirements_for(extra: str, tag: str) -> list[str]:
    """The core dependencies and ``extra``'s, with markers evaluated for ``tag`` (as pip there would)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    python = PYTHON_FOR.get(tag, PYTHON_VERSION)
    env = {
        **ENVIRONMENTS[tag],
        "python_version": python,
        "python_full_version": f"{python}.9",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": extra,
    }
    out = []
    for text in [*project["dependencies"], *project["optional-dependencies"][extra]]:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            out.append(str(req))
    return out


def onnxruntime_builds(names: set[str]) -> set[str]:
    """The distributions among ``names`` that install the onnxruntime module (plugins not counted)."""
    return {n for n in names if n in ORT_FLAVOURS and n not in PLUGIN_SINCE}


def resolve(extra: str, tag: str, report: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            *(arg for t in PLATFORM_TAGS.get(tag, [tag]) for arg in ("--platform", t)),
            "--python-version",
            PYTHON_FOR.get(tag, PYTHON_VERSION),
            "--report",
            str(report),
            *requirements_for(extra, tag),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def resolutions(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], tuple[int, str, set[str]]]:
    """Every case resolved once, a few at a time (the index answers slower than pip works)."""
    tmp = tmp_path_factory.mktemp("reports")

    def one(
        case: tuple[str, str, str, str | None],
    ) -> tuple[tuple[str, str], tuple[int, str, set[str]]]:
        extra, tag = case[0], case[1]
        report = tmp / f"{extra}-{tag}.json"
        proc = resolve(extra, tag, report)
        names: set[str] = set()
        if proc.returncode == 0:
            names = {
                canonicalize_name(i["metadata"]["name"])
                for i in json.loads(report.read_text())["install"]
            }
        return (extra, tag), (proc.returncode, proc.stderr, names)

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = dict(pool.map(one, CASES))
    trouble = [
        err for code, err, _ in done.values() if code and any(s in err for s in NETWORK_TROUBLE)
    ]
    if trouble:
        message = f"the package index cannot be reached: {trouble[0].strip().splitlines()[-1]}"
        skip_missing(message)
    return done


@pytest.mark.parametrize(
    ("extra", "tag", "build", "plugin"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
def test_the_extra_resolves_to_its_onnxruntime_build_and_no_other(
    resolutions: dict[tuple[str, str], tuple[int, str, set[str]]],
    extra: str,
    tag: str,
    build: str,
    plugin: str | None,
) -> None:
    code, stderr, names = resolutions[(extra, tag)]
    assert code == 0, f"pip could not resolve omni-edge[{extra}] for {tag}:\n{stderr[-3000:]}"
    assert onnxruntime_builds(names) == {build}, (
        f"{extra} on {tag} resolved {sorted(onnxruntime_builds(names))}"
    )
    if plugin:
        assert plugin in names
    assert {"pydantic", "pyyaml", "psutil", "rich"} <= names  # the core came along


def test_markers_leave_a_flavour_out_where_it_has_no_wheels() -> None:
    assert not any(
        r.startswith("onnxruntime") for r in requirements_for("directml", "manylinux_2_28_x86_64")
    )
    assert not any(
        r.startswith("onnxruntime") for r in requirements_for("qnn", "macosx_14_0_arm64")
    )
    assert any(
        r.startswith("onnxruntime-directml") for r in requirements_for("directml", "win_amd64")
    )


def test_every_flavour_extra_is_checked() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    flavours = {
        name
        for name, reqs in extras.items()
        if any(canonicalize_name(Requirement(r).name) in ORT_FLAVOURS for r in reqs)
    }
    assert flavours == {c[0] for c in CASES}
