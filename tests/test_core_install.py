"""The core install builds every command, plans and probes; a command that needs an extra says so.

docs/install.md promises that ``pip install omni-edge`` (pydantic, PyYAML, psutil, rich)
"is enough to ``plan`` against a recorded profile", and that ``[ort,cpu]`` verifies
exported graphs. Two kinds of check hold it to that:

* **Fast, in every run**: this interpreter with every optional module of
  ``orchestrator.core.extras.OPTIONAL_MODULES`` hidden (an import hook that refuses them, in a
  child process), so the suite notices at once when the parser or the planning path
  starts importing one: every ``--help``, ``plan`` against a recorded profile and
  ``probe``, each importing none of them; ``run``, ``serve``, ``chat`` and ``export``
  refused with exit 2 naming the extra, no traceback.
* **Real environments** (``index``: installs from the package index; slow): the wheel
  built from this checkout installed into fresh venvs with the core alone, with
  ``[onnx]`` and with ``[ort,cpu]``, each run from a directory outside the repository.

The table of optional modules is checked against ``pyproject.toml``'s extras, so a new
dependency of an extra cannot be missing from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from orchestrator.cli import COMMANDS
from orchestrator.core.extras import OPTIONAL_MODULES
from tests.helpers import REPO
from tests.helpers.graphs import one_stage_cli_args, write_artifact
from tests.helpers.skips import skip_missing
from tests.test_install_resolution import NETWORK_TROUBLE

RECORDED_PROFILE = REPO / "configs/profiles/cpu-only-linux.json"
HEADERS_ONLY_CONFIG = REPO / "configs/examples/qwen3-4b.yaml"
"""A pipeline whose checkpoint is headers only (configs/models/qwen3-4b): it plans with
nothing but the core installed."""

HIDE = """
import importlib.abc, json, sys
HIDDEN = set(json.loads(sys.argv[1]))
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
sys.argv = ["omni-edge", *sys.argv[2:]]
from orchestrator.cli import main
try:
    code = main()
except SystemExit as exc:  # argparse's --help
    code = exc.code
loaded = sorted(m for m in HIDDEN if m in sys.modules)
print("LOADED " + json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""
"""``omni-edge ARGS`` in a child interpreter where every optional module is absent; it prints
the optional modules it imported (there should be none) as its last line on stderr."""


def core_only(*args: str, cwd: Path | None = None) -> tuple[int, str, str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", HIDE, json.dumps(sorted(OPTIONAL_MODULES)), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    lines = proc.stderr.splitlines()
    assert lines and lines[-1].startswith("LOADED "), proc.stderr[-3000:]
    return proc.returncode, proc.stdout, "\n".join(lines[:-1]), json.loads(lines[-1][7:])


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_help_builds_without_an_optional_package(command: str) -> None:
    code, out, err, loaded = core_only(*([command] if command else []), "--help")
    assert code == 0, err
    assert "usage: omni-edge" in out
    assert loaded == []
    assert "Traceback" not in err


def test_plan_against_a_recorded_profile_imports_no_optional_package() -> None:
    code, out, err, loaded = core_only(
        "plan", str(HEADERS_ONLY_CONFIG), "--profile", str(RECORDED_PROFILE), "--json"
    )
    assert code == 0, err
    plan = json.loads(out)
    assert plan["stages"][0]["device"] == "cpu"
    assert loaded == []


def test_probe_without_onnxruntime_says_the_route_has_none() -> None:
    code, out, err, loaded = core_only("probe", "--json")
    assert code == 0, err
    this = next(r for r in json.loads(out)["routes"] if r["name"] == "this-process")
    # the route worker is another interpreter, which sees this venv's packages; what matters
    # here is that the command itself ran on the core alone and imported nothing optional
    assert this["reachable"] is True
    assert loaded == []


@pytest.mark.parametrize(
    ("args", "extra", "install"),
    [
        (["run", str(HEADERS_ONLY_CONFIG), "--prompt", "hi"], "'run'", "omni-edge[run,cpu]"),
        (["serve", str(HEADERS_ONLY_CONFIG)], "'run'", "omni-edge[run,cpu]"),
        (["chat", str(HEADERS_ONLY_CONFIG)], "'run'", "omni-edge[run,cpu]"),
        (["export", "--from", "onnx", "x.onnx", "-o", "out"], "'onnx'", "omni-edge[onnx]"),
    ],
    ids=["run", "serve", "chat", "export"],
)
def test_a_command_that_needs_an_extra_names_it(
    args: list[str], extra: str, install: str, tmp_path: Path
) -> None:
    code, _out, err, _ = core_only(*args, cwd=tmp_path)
    assert code == 2, err
    assert "Traceback" not in err
    assert f"omni-edge {args[0]}: needs the Python package" in err
    assert f"omni-edge's {extra} extra installs" in err
    assert f"how to fix: pip install '{install}'" in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_an_optional_package_missing_deeper_in_is_said_not_thrown() -> None:
    """The safety net behind ``needs``: a ModuleNotFoundError for an optional package
    that escapes a command is the same exit-2 error (``chat --url`` needs none up front)."""
    from orchestrator.core.extras import missing_package

    error = missing_package("chat", ModuleNotFoundError("No module named 'soxr'", name="soxr"))
    assert error is not None
    (problem,) = error.problems
    assert problem.where == "omni-edge chat"
    assert "'soxr'" in problem.what and "'run' extra" in problem.what
    assert problem.fix == "pip install 'omni-edge[run,cpu]'"
    assert missing_package("chat", ModuleNotFoundError("x", name="orchestrator.nope")) is None


def test_the_table_of_optional_modules_covers_every_extra() -> None:
    """Every requirement of the extras that commands need is a row of OPTIONAL_MODULES
    naming that extra (the ONNX Runtime flavours other than ``cpu`` install the same
    ``onnxruntime`` module; ``dev`` is for the tests)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    rows = {canonicalize_name(o.distribution): o for o in OPTIONAL_MODULES.values()}
    missing = []
    for extra in ("run", "onnx", "ort", "cpu", "gpu"):
        for line in extras[extra]:
            name = canonicalize_name(Requirement(line).name)
            if name not in rows or extra not in rows[name].extras:
                missing.append(f"{extra}: {name}")
    assert missing == []


# ---- real environments ---------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    """This environment without what points an interpreter at this checkout or this venv
    (the suite puts the repository on PYTHONPATH for Ray's workers, and its egg-info would
    make pip take omni-edge as installed already)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


def _pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_clean_env(),
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = _pip(
        Path(sys.executable),
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(REPO),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = out.glob("omni_edge-*.whl")
    return found


def _venv_with(wheel: Path, extras: str, root: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    python = root / "bin" / "python"
    spec = f"{wheel}[{extras}]" if extras else str(wheel)
    proc = _pip(python, "install", spec)
    if proc.returncode != 0:
        message = f"pip could not install {spec}: {proc.stderr.strip().splitlines()[-1:]}"
        if any(s in proc.stderr for s in NETWORK_TROUBLE):
            skip_missing(f"the package index cannot be reached: {message}")
        pytest.fail(message)
    return python


def _omni_edge(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = _clean_env()
    return subprocess.run(
        [str(python.parent / "omni-edge"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**env, "OMNI_EDGE_CACHE_DIR": str(cwd / "cache")},
    )


CORE_CASES = {
    "": [["run", "--prompt", "hi"], ["serve"]],
    "onnx": [["run", "--prompt", "hi"]],
    "ort,cpu": [["chat"]],
}


@pytest.mark.index
@pytest.mark.slow
@pytest.mark.parametrize("extras", list(CORE_CASES), ids=["core", "onnx", "ort-cpu"])
def test_an_installed_wheel_plans_probes_and_helps(
    wheel: Path, extras: str, tmp_path: Path
) -> None:
    python = _venv_with(wheel, extras, tmp_path / "venv")
    work = tmp_path / "elsewhere"
    work.mkdir()
    for args in (["--help"], *([c, "--help"] for c in COMMANDS)):
        proc = _omni_edge(python, *args, cwd=work)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    proc = _omni_edge(
        python, "plan", str(HEADERS_ONLY_CONFIG), "--profile", str(RECORDED_PROFILE), cwd=work
    )
    assert proc.returncode == 0, proc.stderr
    assert "thinker" in proc.stdout
    proc = _omni_edge(python, "probe", "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    routes = {r["name"]: r for r in json.loads(proc.stdout)["routes"]}
    assert (routes["this-process"]["providers"] is not None) == ("cpu" in extras)
    for command, *flags in CORE_CASES[extras]:
        proc = _omni_edge(python, command, str(HEADERS_ONLY_CONFIG), *flags, cwd=work)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert "how to fix: pip install 'omni-edge[run,cpu]'" in proc.stderr


@pytest.mark.index
@pytest.mark.slow
def test_an_installed_wheel_with_ort_cpu_verifies_an_exported_stage(
    wheel: Path, tmp_path: Path
) -> None:
    python = _venv_with(wheel, "ort,cpu", tmp_path / "venv")
    work = tmp_path / "elsewhere"
    work.mkdir()
    artifact = write_artifact(work / "relu", "relu")
    proc = _omni_edge(python, *one_stage_cli_args(work, artifact, "verify"), "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["results"]
    assert (row["stage"], row["backend"], row["status"]) == ("net", "ort-cpu", "passed")
    assert row["coverage"]["taken"] == row["coverage"]["total"] == 1
    assert row["numeric"]["outputs"]["y"]["shape_match"] is True
