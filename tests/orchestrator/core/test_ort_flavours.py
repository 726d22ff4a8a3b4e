"""One ONNX Runtime flavour per environment: two are refused by name, with the fix.

The distribution list is faked (a lookup from name to version), so the test
needs no second onnxruntime build installed; the last test checks this
environment's real metadata (the bootstrap installs exactly one).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from orchestrator.cli import main
from orchestrator.core import backends, packages
from orchestrator.core.errors import ConfigError
from orchestrator.core.ort_builds import (
    installed_ort_flavours,
    ort_build,
    ort_flavours,
    plugin_since,
    require_one_ort_flavour,
)
from tests.helpers import REPO


def fake(installed: dict[str, str]) -> Callable[[str], str | None]:
    """A distribution lookup: name → version, None when not installed."""
    return installed.get


def test_two_builds_are_both_found() -> None:
    found = installed_ort_flavours(
        fake({"onnxruntime": "1.32.0", "onnxruntime-directml": "1.24.4", "numpy": "2.3"})
    )
    assert found == [("onnxruntime", "1.32.0"), ("onnxruntime-directml", "1.24.4")]


def test_qnn_2_is_a_plugin_beside_onnxruntime_but_qnn_1_is_a_build() -> None:
    assert installed_ort_flavours(fake({"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0"})) == [
        ("onnxruntime", "1.32.0")
    ]
    require_one_ort_flavour(fake({"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0"}))  # no error
    assert (
        len(installed_ort_flavours(fake({"onnxruntime": "1.32.0", "onnxruntime-qnn": "1.24.4"})))
        == 2
    )


def test_one_build_or_none_is_fine() -> None:
    require_one_ort_flavour(fake({"onnxruntime-openvino": "1.24.1"}))
    require_one_ort_flavour(fake({}))


def test_two_builds_are_refused_naming_both_and_what_to_uninstall() -> None:
    with pytest.raises(ConfigError) as info:
        require_one_ort_flavour(fake({"onnxruntime": "1.32.0", "onnxruntime-openvino": "1.24.1"}))
    (problem,) = info.value.problems
    text = str(info.value)
    assert "onnxruntime==1.32.0" in text and "onnxruntime-openvino==1.24.1" in text
    assert "pip uninstall -y onnxruntime onnxruntime-openvino" in problem.fix
    assert "omni-edge[cpu]" in problem.fix and "omni-edge[openvino]" in problem.fix


def test_probe_exits_2_before_probing_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        packages,
        "installed_version",
        fake({"onnxruntime-gpu": "1.31.1", "onnxruntime-directml": "1.24.4"}),
    )
    started: list[object] = []
    monkeypatch.setattr("orchestrator.probe.probe_route", lambda *a, **k: started.append(a))
    assert main(["probe", "--json", "--no-default-routes"]) == 2
    err = capsys.readouterr().err
    assert "onnxruntime-directml==1.24.4" in err and "onnxruntime-gpu==1.31.1" in err
    assert "pip uninstall -y onnxruntime-directml onnxruntime-gpu" in err
    assert "Traceback" not in err and started == []


def test_this_environment_has_exactly_one_build() -> None:
    assert len(installed_ort_flavours()) == 1


def test_the_route_programs_builds_are_the_tables() -> None:
    """The route program is stdlib-only and keeps its own list of the builds: the same
    distributions as the backend table's (and the builds that bring no EP), the same
    plugin releases."""
    from orchestrator.ort import worker_probe

    assert set(worker_probe.ORT_DISTRIBUTIONS) == set(ort_flavours())
    assert len(worker_probe.ORT_DISTRIBUTIONS) == len(set(worker_probe.ORT_DISTRIBUTIONS))
    assert worker_probe.PLUGIN_SINCE == plugin_since() == {"onnxruntime-qnn": 2}


def test_each_rows_extra_installs_its_build() -> None:
    """A row's ``extra`` is pyproject.toml's extra that requires its distribution, and the
    refusal of two builds offers that extra's line."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    with_extra = [row for row in backends.rows() if row.extra]
    assert {row.extra for row in with_extra} == {"cpu", "directml", "openvino", "cuda", "qnn"}
    for row in with_extra:
        assert row.extra is not None and row.distribution is not None
        required = {canonicalize_name(Requirement(r).name) for r in extras[row.extra]}
        assert row.distribution in required, (row.backend, row.extra, required)
        assert f"pip install 'omni-edge[{row.extra}]'" in ort_flavours()[row.distribution]
    without = {
        row.backend: ort_flavours()[row.distribution]
        for row in backends.rows()
        if not row.extra and row.distribution
    }
    assert without == {"ort-vitisai": "the Ryzen AI software's installer (Windows)"}


def test_this_interpreters_build_is_what_the_route_program_says() -> None:
    from orchestrator.ort import worker_probe

    assert ort_build() == worker_probe.runtime_identity() != (None, None)


ROUTE_WITH_A_SECOND_BUILD = '''#!{python}
"""This environment's interpreter with a second onnxruntime build's metadata on its path."""
import site, sys
site.addsitedir({site!r})
exec(sys.argv[sys.argv.index("-c") + 1])
'''


@pytest.mark.ort
def test_a_route_with_two_builds_is_unreachable_naming_both(tmp_path: Path) -> None:
    """A real route worker, in an interpreter that sees a second build's dist-info (fake
    metadata, the real onnxruntime module): probe reports the route unreachable."""
    from orchestrator.core.profile import Route
    from orchestrator.ort.routes import probe_route
    from orchestrator.ort.worker_probe import runtime_identity

    site_dir = tmp_path / "site"
    info = site_dir / "onnxruntime_openvino-1.24.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: onnxruntime-openvino\nVersion: 1.24.1\n"
    )
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(ROUTE_WITH_A_SECOND_BUILD.format(python=sys.executable, site=str(site_dir)))
    python.chmod(0o755)
    report = probe_route(Route(name="ov", kind="interpreter", python=str(python)), timeout=60)
    dist, version = runtime_identity()
    assert not report.reachable
    assert f"{dist}=={version}" in report.reason and "onnxruntime-openvino==1.24.1" in report.reason
    assert report.remedy.startswith(f"{python} -m pip uninstall -y onnxruntime-openvino {dist}")
