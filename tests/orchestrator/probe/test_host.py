"""`omni-edge probe` and orchestrator.probe: this machine as a profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

import orchestrator.probe
from orchestrator.cli import main
from orchestrator.commands.probe import parse_route_arg
from orchestrator.core.profile import Route, load_profile, parse_profile
from orchestrator.ort.routes import RouteReport, probe_route
from orchestrator.probe import host, probe_profile
from tests.helpers import REPO
from tests.helpers.skips import needs_path

OPENVINO_PY = REPO / ".venvs" / "openvino" / "bin" / "python"
GiB = 2**30


# ---- parsers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("max\n", None),
        ("9223372036854771712\n", None),  # cgroup v1 "no limit"
        ("8589934592\n", 8 * GiB),
        ("", None),
        ("garbage", None),
        ("0", None),
    ],
)
def test_parse_cgroup_limit(text, expected):
    assert host.parse_cgroup_limit(text) == expected


def test_cgroup_limit_skips_max_and_reads_the_next_file(tmp_path):
    v2 = tmp_path / "memory.max"
    v1 = tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text("4294967296\n")
    assert host.cgroup_memory_limit([tmp_path / "absent", v2, v1]) == 4 * GiB
    v1.write_text("9223372036854771712\n")
    assert host.cgroup_memory_limit([v2, v1]) is None


@pytest.mark.parametrize(
    ("quota", "period", "expected"),
    [
        ("max 100000\n", None, None),  # cgroup v2, no limit
        ("150000 100000\n", None, 1.5),  # v2: one and a half CPUs
        ("200000 100000", None, 2.0),
        ("-1\n", "100000\n", None),  # v1, no limit
        ("50000\n", "100000\n", 0.5),  # v1: half a CPU
        ("garbage", None, None),
        ("0 100000", None, None),
    ],
)
def test_parse_cpu_quota(quota, period, expected):
    assert host.parse_cpu_quota(quota, period) == expected


@pytest.mark.parametrize(
    ("affinity", "quota", "expected"),
    [
        (8, None, 8),
        (8, 2.0, 2),
        (8, 1.5, 1),
        (8, 0.5, 1),
        (2, 16.0, 2),
        (0, None, 1),
    ],
)
def test_usable_cpus_is_the_affinity_capped_by_the_quota_rounded_down(affinity, quota, expected):
    assert host.usable_cpus(affinity, quota) == expected


def test_cpu_quota_skips_an_unlimited_v2_file_and_reads_v1(tmp_path):
    v2 = tmp_path / "cpu.max"
    quota, period = tmp_path / "cpu.cfs_quota_us", tmp_path / "cpu.cfs_period_us"
    v2.write_text("max 100000\n")
    quota.write_text("300000\n")
    period.write_text("100000\n")
    assert host.cgroup_cpu_quota([(tmp_path / "absent", None), (v2, None), (quota, period)]) == 3.0


def test_this_host_records_the_cpus_this_process_may_use():
    cores = host.this_host().cpu_cores
    assert cores is not None and 1 <= cores <= len(os.sched_getaffinity(0))


def test_wsl_is_recognised_from_proc_version():
    assert host.is_wsl("Linux version 5.15.167.4-microsoft-standard-WSL2 (root@...)")
    assert host.is_wsl("Linux version 4.4.0-19041-Microsoft")
    assert not host.is_wsl("Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)")


def test_cpuinfo_name_and_isa():
    text = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
        "flags\t\t: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 amx_tile amx_bf16 amx_int8\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu\n"
    )
    name, isa = host.parse_cpuinfo(text)
    assert name == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"} <= set(isa)
    assert "fpu" not in isa


def test_cpuinfo_aarch64_features():
    name, isa = host.parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd asimddp i8mm bf16 sve\n")
    assert name == "" and isa == ["bf16", "dotprod", "i8mm", "neon", "sve"]


def test_route_argument():
    assert parse_route_arg("ov=.venvs/openvino/bin/python") == (
        "ov",
        ".venvs/openvino/bin/python",
    )
    with pytest.raises(ValueError, match="NAME=PYTHON"):
        parse_route_arg("just-a-path")


# ---- interpreters: asked through orchestrator.ort.routes.probe_route ------------------------
# (a hung, crashing or missing interpreter: tests/orchestrator/ort/test_routes.py)


def test_a_cached_probe_is_reused_until_the_interpreter_changes(tmp_path, monkeypatch):
    from orchestrator.ort import routes

    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir()
    python.write_text("")
    asked = []

    def fake_probe(resolved, timeout):
        asked.append(resolved.python)
        return RouteReport(
            resolved.name,
            resolved.kind,
            resolved.python,
            True,
            ort_version="1.0",
            providers=("CPUExecutionProvider",),
            python_version="3.11.7",
        )

    monkeypatch.setattr(routes, "_probe", fake_probe)
    route = Route(name="v", kind="interpreter", python=str(python))
    first = probe_route(route, cached=True)
    again = probe_route(route.model_copy(update={"name": "renamed"}), cached=True)
    assert len(asked) == 1 and again.name == "renamed" and again.providers == first.providers
    probe_route(route)  # without cached: asked again (and remembered)
    assert len(asked) == 2
    st = site.stat()  # installing a package changes site-packages' mtime
    os.utime(site, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    probe_route(route, cached=True)
    assert len(asked) == 3
    # a plan-time evidence lookup names the build the last probe saw
    monkeypatch.setattr(routes, "_dist_info_identity", lambda python: None)
    assert routes.runtime_identity(route) == "onnxruntime==1.0"


# ---- the probe on this machine -----------------------------------------------------------
# ---- the probe on this machine -----------------------------------------------------------


@pytest.fixture(scope="module")
def here():
    """One probe of this machine (each costs a cold `import onnxruntime` in a subprocess)."""
    return probe_profile(use_default_routes=False)


def test_probe_returns_a_valid_profile_with_cpu(here):
    assert here.devices[0].id == "cpu" and here.devices[0].kind == "cpu"
    again = parse_profile(json.loads(here.model_dump_json()), where="round-trip")
    assert again == here


def test_probe_ram_matches_psutil(here):
    vm = psutil.virtual_memory()
    assert here.host.ram_total_bytes == vm.total
    assert 0 < here.host.ram_available_bytes <= here.host.ram_total_bytes
    assert abs(here.host.ram_available_bytes - vm.available) < 0.25 * vm.total
    # a limit, where this machine has one, is below its RAM (both cases: the test below)
    assert here.host.ram_limit_bytes is None or here.host.ram_limit_bytes < vm.total
    assert here.host_ram_capacity <= here.host.ram_available_bytes


@pytest.mark.parametrize(("share", "kept"), [(0.5, True), (1.0, False), (2.0, False)])
def test_a_cgroup_limit_is_kept_only_below_physical_ram(
    monkeypatch: pytest.MonkeyPatch, share: float, kept: bool
) -> None:
    total = psutil.virtual_memory().total
    monkeypatch.setattr(host, "cgroup_memory_limit", lambda: int(total * share))
    limit = host.this_host().ram_limit_bytes
    assert limit == (int(total * share) if kept else None)


def test_probe_this_process_route_lists_what_onnxruntime_offers(here):
    r = here.route("this-process")
    assert r.reachable
    try:
        import importlib.util

        has_ort = importlib.util.find_spec("onnxruntime") is not None
    except ValueError:
        has_ort = False
    # with onnxruntime its CPU EP and the ort-cpu backend, without it neither
    assert ("CPUExecutionProvider" in (r.providers or ())) is has_ort, r.providers
    assert ("ort-cpu" in here.device("cpu").backends) is has_ort


def test_extra_route_eps_become_backend_routes(monkeypatch):
    def fake_probe(route, **kw):
        if route.name == "fake-ov":
            return RouteReport(
                route.name,
                route.kind,
                route.python,
                True,
                ort_version="9.9",
                providers=("OpenVINOExecutionProvider", "CPUExecutionProvider"),
                python_version="3.11.7",
            )
        return RouteReport(
            route.name,
            route.kind,
            None,
            True,
            ort_version="1.0",
            providers=("CPUExecutionProvider",),
            python_version="3.11.7",
        )

    monkeypatch.setattr(orchestrator.probe, "probe_route", fake_probe)
    p = probe_profile(
        [Route(name="fake-ov", kind="interpreter", python="/opt/ov/bin/python")],
        use_default_routes=False,
    )
    cpu = p.device("cpu")
    assert cpu.backends[:2] == ["ort-cpu", "ort-openvino"]
    assert cpu.route_for("ort-openvino") == "fake-ov" and cpu.route_for("ort-cpu") == "this-process"
    r = p.route("fake-ov")
    assert (
        r.reachable
        and r.ort_version == "9.9"
        and r.providers == ["OpenVINOExecutionProvider", "CPUExecutionProvider"]
    )


def test_extra_route_that_does_not_exist_is_unreachable_with_remedy():
    p = probe_profile(
        [Route(name="ghost", kind="interpreter", python="/nonexistent/bin/python")],
        use_default_routes=False,
    )
    r = p.route("ghost")
    assert r.reachable is False
    assert "does not exist" in r.reason and "python -m venv /nonexistent" in r.remedy
    assert all(d.route_for(b) != "ghost" for d in p.devices for b in d.backends)


@pytest.mark.openvino
@needs_path(OPENVINO_PY, "the OpenVINO route: scripts/bootstrap.sh creates .venvs/openvino")
def test_openvino_venv_drives_the_cpu():
    p = probe_profile(
        [Route(name="openvino-venv", kind="interpreter", python=str(OPENVINO_PY))],
        use_default_routes=False,
    )
    r = p.route("openvino-venv")
    assert r.reachable and "OpenVINOExecutionProvider" in r.providers
    assert p.device("cpu").route_for("ort-openvino") == "openvino-venv"


def test_probe_imports_nothing_heavy():
    code = (
        "import sys, orchestrator.probe as p, orchestrator.commands.probe\n"
        "p.probe_profile(use_default_routes=False)\n"
        "print(sorted(m for m in ('onnxruntime', 'torch', 'vllm', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ---- the command ------------------------------------------------------------------------------


def test_cli_json_parses_as_a_profile(capsys):
    assert main(["probe", "--json", "--no-default-routes"]) == 0
    data = json.loads(capsys.readouterr().out)
    p = parse_profile(data, where="stdout")
    assert p.format == "omni-edge.profile/1" and p.device("cpu") is not None


def test_cli_table_names_devices_pools_and_routes(capsys):
    assert main(["probe", "--no-default-routes"]) == 0
    out = capsys.readouterr().out
    for word in ("devices", "pools", "host_ram", "routes", "this-process"):
        assert word in out


def test_cli_save_writes_a_loadable_profile_atomically(tmp_path, capsys):
    target = tmp_path / "me.json"
    assert main(["probe", "--no-default-routes", "--save", str(target)]) == 0
    assert load_profile(target).device("cpu") is not None
    assert f"saved to {target}" in capsys.readouterr().out
    assert os.listdir(tmp_path) == ["me.json"]  # no temporary file left behind


def test_cli_save_refuses_to_overwrite_without_force(tmp_path, capsys):
    target = tmp_path / "mine.json"
    target.write_text("precious\n")
    assert main(["probe", "--no-default-routes", "--save", str(target)]) == 2
    err = capsys.readouterr().err
    assert str(target) in err and "already exists" in err and "--force" in err
    assert target.read_text() == "precious\n"
    assert os.listdir(tmp_path) == ["mine.json"]


def test_cli_save_force_replaces(tmp_path):
    target = tmp_path / "mine.json"
    target.write_text("old\n")
    assert main(["probe", "--no-default-routes", "--save", str(target), "--force", "--json"]) == 0
    assert load_profile(target).device("cpu") is not None


def test_cli_bad_route_argument_exits_2(capsys):
    assert main(["probe", "--route", "no-equals-sign"]) == 2
    assert "NAME=PYTHON" in capsys.readouterr().err
