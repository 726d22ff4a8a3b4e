"""scripts/bootstrap.ps1 (Windows) agrees with pyproject.toml and the recorded WSL profile.

PowerShell is not available here, so the script is not run: these checks read it.
They catch the drift that would break the laptop set-up silently — a flavour
whose package differs from its extra, or a venv path that is not the one the
profile's host-process route starts.
"""

from __future__ import annotations

import json
import re

import tomllib

from orchestrator.ort.hostproc import translate
from tests.helpers import REPO

PS1 = (REPO / "scripts/bootstrap.ps1").read_text()
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
PROFILE = json.loads((REPO / "configs/profiles/strix-point-rtx5090-wsl-hostproc.json").read_text())


def ps1_table(name: str) -> dict[str, str]:
    body = re.search(rf"\${name} = @\{{(.*?)\n\}}", PS1, re.S)
    assert body, f"${name} table not found in bootstrap.ps1"
    return dict(re.findall(r'^\s*(\w+)\s*=\s*"([^"]+)"', body.group(1), re.M))


def test_each_flavour_installs_what_its_extra_installs() -> None:
    packages = ps1_table("packages")
    assert set(packages) == {"directml", "cpu", "cuda", "openvino", "qnn"}
    for flavour, spec in packages.items():
        (requirement,) = EXTRAS[flavour]
        assert requirement.split(";")[0].strip() == spec, flavour


def test_the_flavours_offered_are_the_extras_and_vitisai() -> None:
    offered = re.search(r'ValidateSet\(("directml"[^)]*)\)', PS1)
    assert offered
    assert set(re.findall(r'"(\w+)"', offered.group(1))) == {*ps1_table("packages"), "vitisai"}


def test_the_venvs_it_makes_are_the_ones_the_wsl_profile_starts() -> None:
    prefix = re.search(r'\[string\]\$Prefix = "([^"]+)"', PS1)
    assert prefix
    routes = {r["name"]: r for r in PROFILE["routes"]}
    directml = translate(routes["windows-directml"]["python"], distro="unused")
    ryzen = translate(routes["windows-ryzen-ai"]["python"], distro="unused")
    assert (
        directml == prefix.group(1) + "\\venv-directml\\Scripts\\python.exe"
    )  # "venv-$Flavour", Scripts\python.exe
    assert (
        ryzen == prefix.group(1) + "\\ryzen-ai\\python.exe"
    )  # the junction -Flavour vitisai makes
