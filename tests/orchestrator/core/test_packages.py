"""orchestrator.core.packages: one meaning of package:// for checkpoints, artifacts and hooks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.packages import (
    is_package_location,
    resolve_package_location,
    split_package_location,
)


def test_a_location_has_a_package_and_a_path() -> None:
    assert split_package_location("package://a.b/dir/file.onnx") == ("a.b", "dir/file.onnx")
    assert is_package_location("package://a/b") and not is_package_location("models/a.onnx")
    for bad in ("package://just-a-package", "package:///file", "models/a.onnx"):
        with pytest.raises(ValueError, match="package://<importable_package>/<path>"):
            split_package_location(bad)
    with pytest.raises(ConfigError):
        resolve_package_location("package://nopath")


def test_a_dotted_package_resolves_without_importing_it_or_its_parent() -> None:
    code = (
        "import sys; from orchestrator.core.packages import resolve_package_location as r; "
        "p = r('package://xml.dom/minidom.py'); "
        "print(p.is_file(), p.is_absolute(), 'xml' in sys.modules, 'xml.dom' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "True", "False", "False"]


def test_a_missing_file_is_the_callers_to_report_and_a_module_is_not_a_package() -> None:
    missing = resolve_package_location("package://email/no_such_file.bin")
    assert missing.name == "no_such_file.bin" and not missing.exists()
    with pytest.raises(ConfigError) as exc:
        resolve_package_location("package://textwrap/x")
    assert "'textwrap' is a module, not a package" in str(exc.value.problems[0].what)
