"""A stand-in for a Windows ``python.exe`` reached from WSL2 through a host-process route.

There is no Windows here. A Linux interpreter stands in for ``python.exe``: a
script named ``python.exe`` that runs this environment's Python and, like
Windows, can open only Windows-spelled paths — a ``\\\\wsl.localhost\\<distro>\\...``
path (WSL's share of the Linux files) or a drive path; a raw ``/home/...`` path
fails there as it would on Windows. It logs how it was started and every graph
it was asked to open (as the route spelled it). Used by
tests/orchestrator/ort/test_host_process_route.py (sessions, verify, probe) and
tests/orchestrator/runtime/test_host_process_run.py (a pipeline run on Ray).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

from orchestrator.ort import worker_probe

DISTRO = "Ubuntu-Standin"

STANDIN = r'''#!{python}
"""Stands in for a Windows python.exe started from WSL2 (tests/helpers/hostproc.py)."""
import json, re, sys

LOG = {log!r}
SHARE = "\\\\wsl.localhost\\" + {distro!r} + "\\"


def linux(path):
    """Open what Windows could open: the WSL share or a drive; never a raw Linux path."""
    if path.startswith(SHARE):
        return "/" + path[len(SHARE):].replace("\\", "/")
    if re.match(r"^[A-Za-z]:\\", path):
        return "/mnt/" + path[0].lower() + "/" + path[3:].replace("\\", "/")
    raise FileNotFoundError(f"[WinError 3] The system cannot find the path specified: {{path!r}}")


with open(LOG, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:]}}) + "\n")
assert sys.argv[1:3] == ["-I", "-c"], sys.argv
n = int(sys.stdin.buffer.readline())
g = {{"__name__": "omni_edge_route_worker"}}
exec(compile(sys.stdin.buffer.read(n), "omni_edge_route_worker.py", "exec"), g)
original = g["Sessions"].open


def open_as_windows(self, spec, **kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({{"graph": spec["graph"], "provider_options": spec["provider_options"]}}) + "\n")
    options = [{{k: linux(v) if k in ("cache_dir", "config_file") else v for k, v in o.items()}}
               for o in spec["provider_options"]]
    return original(self, {{**spec, "graph": linux(spec["graph"]), "provider_options": options}}, **kw)


g["Sessions"].open = open_as_windows
g["main"]()
'''


def standin_python(tmp_path: Path) -> tuple[Path, Path]:
    """(the stand-in python.exe, its log), laid out as a Windows venv: ``Scripts\\python.exe``
    and ``Lib\\site-packages\\<build>.dist-info``, which is how the planner names a
    route's onnxruntime build without starting it (here: the build the stand-in runs)."""
    log = tmp_path / "standin.log"
    venv = tmp_path / "Windows" / "omni-edge" / "venv-directml"
    exe = venv / "Scripts" / "python.exe"
    exe.parent.mkdir(parents=True)
    dist, version = worker_probe.runtime_identity()
    assert dist and version
    (venv / "Lib" / "site-packages" / f"{dist.replace('-', '_')}-{version}.dist-info").mkdir(
        parents=True
    )
    exe.write_text(STANDIN.format(python=sys.executable, log=str(log), distro=DISTRO))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, log


def trust_standin(exe: Path, monkeypatch: Any) -> Path:
    """The user's settings file (``OMNI_EDGE_SETTINGS``, for this test) naming the stand-in as the
    route ``windows-standin``: what a user writes before omni-edge may start a host-process
    route's interpreter that a profile names (``verify``, ``run``)."""
    settings = exe.parent / "omni-edge-settings.yaml"
    settings.write_text(json.dumps({"routes": {"windows-standin": str(exe)}}))
    monkeypatch.setenv("OMNI_EDGE_SETTINGS", str(settings))
    return settings


def log_lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def standin_profile(path: Path, exe: Path) -> Path:
    """A WSL2 profile (written to ``path``) whose CPU runs ort-cpu through the stand-in
    host-process route ``windows-standin``."""
    path.write_text(
        json.dumps(
            {
                "format": "omni-edge.profile/1",
                "name": "WSL2 box with a stand-in Windows interpreter",
                "host": {
                    "os": "linux",
                    "wsl": True,
                    "ram_total_bytes": 2**34,
                    "ram_available_bytes": 2**33,
                },
                "devices": [
                    {
                        "id": "cpu",
                        "kind": "cpu",
                        "name": "test CPU",
                        "backends": ["ort-cpu"],
                        "backend_routes": {"ort-cpu": "windows-standin"},
                    }
                ],
                "routes": [
                    {"name": "this-process"},
                    {
                        "name": "windows-standin",
                        "kind": "host-process",
                        "python": str(exe),
                        "providers": ["CPUExecutionProvider"],
                    },
                ],
            }
        )
    )
    return path
