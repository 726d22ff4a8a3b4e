"""The user's own settings (``orchestrator.core.settings``): where the file is, what it may say, and
which interpreters omni-edge may start because of it — the one input besides the installed
packages that may make omni-edge run code (docs/reliability.md, "What omni-edge trusts")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from orchestrator.core import settings
from orchestrator.core.errors import ConfigError
from orchestrator.probe import default_routes


@pytest.fixture
def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "conf" / "settings.yaml"
    path.parent.mkdir()
    monkeypatch.setenv(settings.SETTINGS_ENV, str(path))
    return path


def fake_python(path: Path) -> Path:
    """An executable file where a venv's interpreter would be (never run by these tests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("platform", "environ", "expected"),
    [
        ("linux", {}, "/home/u/.config/omni-edge"),
        ("linux", {"XDG_CONFIG_HOME": "/x/conf"}, "/x/conf/omni-edge"),
        ("linux", {"XDG_CONFIG_HOME": "relative"}, "/home/u/.config/omni-edge"),
        ("darwin", {}, "/home/u/Library/Application Support/omni-edge"),
        ("win32", {"APPDATA": "/roam"}, "/roam/omni-edge"),
        ("win32", {}, "/home/u/AppData/Roaming/omni-edge"),
    ],
)
def test_the_settings_file_lives_in_the_platforms_config_directory(
    platform: str, environ: dict[str, str], expected: str
) -> None:
    root = settings.default_config_root(platform, environ, Path("/home/u"))
    assert root == Path(expected)


def test_without_a_settings_file_nothing_is_configured(settings_file: Path) -> None:
    found = settings.user_settings()
    assert (found.path, found.routes_dir, found.routes, found.provider_options) == (
        settings_file,
        None,
        {},
        {},
    )


def test_settings_paths_are_read_against_the_files_own_directory(settings_file: Path) -> None:
    settings_file.write_text(
        "routes_dir: venvs\n"
        "routes: {npu-env: envs/npu/bin/python}\n"
        "provider_options: {ort-qnn: {backend_path: /opt/qnn/libQnnHtp.so}}\n"
    )
    found = settings.user_settings()
    assert found.routes_dir == settings_file.parent / "venvs"
    assert found.routes == {
        "npu-env": str(settings_file.parent / "envs" / "npu" / "bin" / "python")
    }
    assert found.provider_options == {"ort-qnn": {"backend_path": "/opt/qnn/libQnnHtp.so"}}
    assert settings.route_dirs() == [
        settings_file.parent / "venvs",
        settings.INSTALL_ROOT / ".venvs",
    ]


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("[1, 2]", "", "holds a list, not a mapping"),
        ("route: {a: /x}", ": route", "is not a setting omni-edge reads"),
        ("routes: [/x/python]", ": routes", "is not a mapping of name: interpreter"),
        ("routes: {this-process: /x/python}", ": routes.this-process", "cannot name a route"),
        ("routes: {a: 3}", ": routes.a", "3 is not a path"),
        ('routes: {"a\\x1b[2J": /x/python}', ": routes.a\x1b[2J", "cannot name a route"),
        (
            "provider_options: {ort-qnn: backend_path}",
            ": provider_options.ort-qnn",
            "option: value",
        ),
    ],
)
def test_a_settings_file_that_cannot_be_used_is_named_with_the_key_and_the_fix(
    settings_file: Path, text: str, where: str, what: str
) -> None:
    settings_file.write_text(text)
    with pytest.raises(ConfigError) as err:
        settings.user_settings()
    (problem,) = err.value.problems
    assert problem.where == f"{settings_file}{where}"
    assert what in problem.what
    assert "routes_dir" in problem.fix and "reliability.md" in problem.fix


def test_interpreters_of_this_environment_route_directories_and_settings_may_be_started(
    settings_file: Path, tmp_path: Path
) -> None:
    here = Path(sys.executable)
    assert settings.untrusted_interpreter(str(here)) is None
    assert settings.untrusted_interpreter(str(here.with_name("python3"))) is None
    installed = settings.INSTALL_ROOT / ".venvs" / "openvino" / "bin" / "python"
    assert settings.untrusted_interpreter(str(installed)) is None  # it need not exist to be trusted

    elsewhere = tmp_path / "downloaded" / ".venvs" / "openvino" / "bin" / "python"
    why = settings.untrusted_interpreter(str(elsewhere))
    assert why is not None and str(elsewhere) in why and str(settings_file) in why
    # '..' cannot climb out of a trusted directory into an untrusted one
    climbing = settings.INSTALL_ROOT / ".venvs" / ".." / ".." / "evil" / "python"
    assert settings.untrusted_interpreter(str(climbing)) is not None

    settings_file.write_text(f"routes: {{mine: {elsewhere}}}\nroutes_dir: {tmp_path / 'envs'}\n")
    assert settings.untrusted_interpreter(str(elsewhere)) is None
    assert settings.untrusted_interpreter(str(tmp_path / "envs" / "x" / "bin" / "python")) is None


def test_route_environments_are_found_next_to_the_installation_or_where_configured_never_in_the_cwd(
    settings_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder someone else made, holding .venvs/openvino/bin/python, is the working directory:
    its interpreter is not a route. The user's routes_dir and routes are."""
    folder = tmp_path / "cloned"
    fake_python(folder / ".venvs" / "openvino" / "bin" / "python")
    fake_python(folder / ".venvs" / "ep-openvino" / "bin" / "python")
    monkeypatch.chdir(folder)
    found = {r.name: r.python for r in default_routes()}
    assert all(not str(p).startswith(str(folder)) for p in found.values()), found
    installed = settings.INSTALL_ROOT / ".venvs" / "openvino" / "bin" / "python"
    if installed.exists():  # the repository's own route (scripts/bootstrap.sh makes it)
        assert found["openvino-venv"] == str(installed)

    mine = fake_python(tmp_path / "envs" / "openvino" / "bin" / "python")
    npu = fake_python(tmp_path / "npu" / "bin" / "python")
    settings_file.write_text(f"routes_dir: {tmp_path / 'envs'}\nroutes: {{npu-env: {npu}}}\n")
    routes = {r.name: (r.kind, r.python) for r in default_routes()}
    assert routes["openvino-venv"] == ("interpreter", str(mine))  # the configured one comes first
    assert routes["npu-env"] == ("interpreter", str(npu))


def test_programs_are_looked_up_in_absolute_path_entries_only(tmp_path: Path) -> None:
    here = tmp_path / "cwd"
    fake_python(here / "nvidia-smi")
    real = fake_python(tmp_path / "bin" / "nvidia-smi")
    cwd = os.getcwd()
    try:
        os.chdir(here)
        assert settings.find_program("nvidia-smi", {"PATH": f".{os.pathsep}"}) is None
        found = settings.find_program("nvidia-smi", {"PATH": f".{os.pathsep}{real.parent}"})
        assert found == str(real)
    finally:
        os.chdir(cwd)
