"""A new execution provider is one row of the backend table.

The Acme EP below exists only here: one ``OrtBackend`` row, added with
``backends.register`` as an EP that lives outside this repository would be, and
nothing else. No Acme NPU can run here, but everything before a session opens can:
a recorded profile lists its backend, the probe offers it on the devices a route's
EP list and ``get_ep_devices()`` show, the planner places an exported graph on it
with the row's memory (its workspace and what it keeps per new shape), provider
options, precisions and CPU threads, a config's options are held to the row's
allow-list, a second onnxruntime build beside it is refused with the row's install
line, and its own coverage report is read where the row says and counted as the row
says. And no module outside the table names an EP: the scan at the end.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import parse_config
from orchestrator.core import backends
from orchestrator.core.backends import (
    CoverageReport,
    CpuThreads,
    OrtBackend,
    PrecisionRule,
    ShapeMemory,
)
from orchestrator.core.errors import ConfigError
from orchestrator.core.ort_builds import (
    installed_ort_flavours,
    ort_flavours,
    require_one_ort_flavour,
)
from orchestrator.core.profile import HardwareProfile, parse_profile
from orchestrator.core.units import GiB, MiB
from orchestrator.ort.routes import RouteReport
from orchestrator.ort.sessions import with_plugins
from orchestrator.ort.worker import check_spec, ep_report
from orchestrator.planner import plan_pipeline
from orchestrator.probe import _with_backends, default_route_candidates, ep_discovered_devices
from orchestrator.verify.gates import coverage_from_report, judge
from stages.exported_graph.artifact import Tolerance
from stages.exported_graph.kind import ExportedGraphKind
from stages.registry import get_kind
from tests.helpers import REPO

ACME_PER_SHAPE = 5 * MiB
ACME_SHAPES = 8

ROW = OrtBackend(
    backend="ort-acme",
    ep="AcmeExecutionProvider",
    install="pip install onnxruntime-acme (Acme's build of onnxruntime)",
    distribution="onnxruntime-acme",
    build_install="pip install onnxruntime-acme",
    drives={"npu": ("acme",), "cpu": ()},
    provider_options={
        "npu": {"device_type": "NPU", "cache_dir": "{cache_dir}", "cache_key": "{cache_key}"},
        "cpu": {"device_type": "CPU"},
    },
    options={
        "device_type": "value",
        "acme_threads": "value",
        "cache_dir": "cache_dir",
        "cache_key": "value",
        "firmware": "user_file",
    },
    precisions=(
        PrecisionRule("fp32", True, "the Acme NPU runs fp32 at half rate"),
        PrecisionRule("int8", False, "the Acme NPU has no int8 datapath"),
    ),
    workspace_fixed=96 * MiB,
    workspace_weight_copies=2.0,
    workspace_reason="the Acme runtime keeps two packed copies of the weights",
    coverage_report=CoverageReport(file="acme_report.json", accelerators=("ACME_NPU",)),
    shape_memory=ShapeMemory(
        per_item=ACME_PER_SHAPE,
        per_item_name="ACME_PER_SHAPE",
        items=ACME_SHAPES,
        items_name="ACME_SHAPES",
        who="Acme",
    ),
    cpu_threads=CpuThreads(option="acme_threads", when=("device_type", "CPU")),
    route_venvs=(("acme-venv", "acme"),),
)

VOICE = REPO / "exports/piper-en-us-joe-medium"


@pytest.fixture
def acme() -> Iterator[OrtBackend]:
    backends.register(ROW)
    try:
        yield ROW
    finally:
        backends.unregister("ort-acme")


def _profile() -> HardwareProfile:
    return parse_profile(
        {
            "format": "omni-edge.profile/1",
            "name": "a laptop with an Acme NPU",
            "host": {"os": "linux", "ram_total_bytes": 32 * GiB, "ram_available_bytes": 16 * GiB},
            "devices": [
                {"id": "cpu", "kind": "cpu", "name": "CPU", "backends": ["ort-acme", "ort-cpu"]},
                {
                    "id": "npu:0",
                    "kind": "npu",
                    "vendor": "acme",
                    "name": "Acme NPU",
                    "backends": ["ort-acme"],
                },
            ],
            "routes": [{"name": "this-process"}],
        }
    )


def _voice(devices: list[str], **extra: Any) -> Any:
    return parse_config(
        {
            "name": "acme-voice",
            "stages": [
                {
                    "name": "voice",
                    "kind": "exported_graph",
                    "artifact": str(VOICE),
                    "devices": devices,
                    "backends": ["ort-acme"],
                    "final_output": True,
                    "final_output_type": "audio",
                    **extra,
                }
            ],
        },
        where="acme-voice.yaml",
        base_dir=REPO,
    )


def test_a_recorded_profile_lists_the_backend_only_while_the_row_is_there() -> None:
    with pytest.raises(ConfigError, match="ort-acme"):
        _profile()
    backends.register(ROW)
    try:
        assert [d.backends for d in _profile().devices] == [["ort-acme", "ort-cpu"], ["ort-acme"]]
        assert "ort-acme" in ExportedGraphKind.backends
        assert "ort-acme" in get_kind("vad").backends and "ort-acme" in get_kind("asr").backends
    finally:
        backends.unregister("ort-acme")
    assert "ort-acme" not in ExportedGraphKind.backends
    assert "AcmeExecutionProvider" not in backends.EP_BACKENDS
    with pytest.raises(ConfigError, match="ort-acme"):
        _profile()


def test_a_second_row_by_the_same_name_or_ep_is_refused(acme: OrtBackend) -> None:
    with pytest.raises(ValueError, match="backend 'ort-acme' is already the table's"):
        backends.register(acme)
    with pytest.raises(ValueError, match="EP 'CPUExecutionProvider' is already the table's"):
        backends.register(OrtBackend("ort-mine", "CPUExecutionProvider", "", {"cpu": ()}, {}, ()))
    with pytest.raises(ValueError, match="built-in"):
        backends.unregister("ort-cpu")


def test_the_probe_offers_it_where_a_route_lists_the_ep(acme: OrtBackend) -> None:
    assert ("acme-venv", Path("acme/bin/python")) in default_route_candidates()
    report = RouteReport(
        name="acme-venv",
        kind="interpreter",
        python="/opt/acme/bin/python",
        reachable=True,
        providers=("AcmeExecutionProvider", "CPUExecutionProvider"),
        ep_devices=(
            {
                "ep_name": "AcmeExecutionProvider",
                "device_type": "NPU",
                "vendor": "Acme Corporation",
                "vendor_id": 0xACE,
                "device_id": 1,
            },
        ),
    )
    (npu,) = ep_discovered_devices([report], [])
    assert (npu.id, npu.kind, npu.vendor) == ("npu:0", "npu", "acme")
    offered = _with_backends(npu, [report])
    assert offered.backends == ["ort-acme"]
    assert offered.backend_routes == {"ort-acme": "acme-venv"}


def test_the_planner_places_a_graph_on_it_with_the_rows_memory_and_options(
    acme: OrtBackend, private_cache: Path
) -> None:
    plan = plan_pipeline(_voice(["npu:0"]), _profile(), plan_threads=False)
    (stage,) = plan.stages
    assert (stage.device, stage.backend) == ("npu:0", "ort-acme")
    held = {r.purpose: r for r in stage.reservations}
    weights = held["weights"].bytes
    assert held["ep_workspace"].bytes == 96 * MiB + 2 * weights
    assert held["ep_workspace"].note == (
        "AcmeExecutionProvider: the Acme runtime keeps two packed copies of the weights"
    )
    # the voice's output length comes from sampled durations: the row's per-shape memory
    assert held["shape_memory"].bytes == ACME_PER_SHAPE * ACME_SHAPES == 40 * MiB
    assert "Acme keeps memory per new shape" in held["shape_memory"].note
    assert "(ACME_PER_SHAPE, measured) x 8 items (ACME_SHAPES)" in held["shape_memory"].note
    # planned unverified: `omni-edge verify` measures the gates in the route that has the EP
    assert stage.verification is not None and stage.verification.status == "unverified"
    session = stage.engine_kwargs["session"]
    assert session["providers"] == ["AcmeExecutionProvider", "CPUExecutionProvider"]
    options = session["provider_options"][0]
    assert options["device_type"] == "NPU"
    assert options["cache_dir"] == str(backends.ep_cache_dir("ort-acme"))
    assert options["cache_key"].startswith("piper-en-us-joe-medium-fp32-")


def test_its_precision_rules_and_option_allow_list_hold(
    acme: OrtBackend, private_cache: Path
) -> None:
    plan = plan_pipeline(_voice(["npu:0"], precision=["int8"]), _profile(), plan_threads=False)
    (stage,) = plan.stages
    assert not plan.admitted and not stage.admitted
    assert any(
        "ort-acme on npu:0 (npu) runs fp32 — int8: the Acme NPU has no int8 datapath" in r.message
        for r in stage.refusals
    )
    _voice(["npu:0"], provider_options={"ort-acme": {"device_type": "NPU"}})  # declared: given
    with pytest.raises(ConfigError) as refused:
        _voice(["npu:0"], provider_options={"ort-acme": {"firmware": "/tmp/x.bin"}})
    (problem,) = refused.value.problems
    assert problem.what.startswith("ort-acme.firmware names a file AcmeExecutionProvider loads")
    assert "{ort-acme: {firmware: PATH}} in your settings file" in problem.fix
    with pytest.raises(ConfigError, match="is not an option"):
        _voice(["npu:0"], provider_options={"ort-acme": {"turbo": "1"}})


def test_its_own_cpu_threads_are_set_where_it_runs_on_the_cpu(
    acme: OrtBackend, private_cache: Path
) -> None:
    spec = backends.session_spec(
        "ort-acme",
        graph="g.onnx",
        device_kind="cpu",
        device_id="cpu",
        precision="fp32",
        cache_key="k",
    ).to_dict()
    out = backends.with_cpu_threads(spec, 3)
    assert out["provider_options"][0]["acme_threads"] == "3"
    npu = backends.session_spec(
        "ort-acme",
        graph="g.onnx",
        device_kind="npu",
        device_id="npu:0",
        precision="fp32",
        cache_key="k",
    ).to_dict()
    assert "acme_threads" not in backends.with_cpu_threads(npu, 3)["provider_options"][0]


def test_its_build_is_one_of_the_builds_an_environment_may_hold_once(acme: OrtBackend) -> None:
    assert ort_flavours()["onnxruntime-acme"] == "pip install onnxruntime-acme"
    two = {"onnxruntime": "1.24.1", "onnxruntime-acme": "1.0.2"}
    assert installed_ort_flavours(two.get) == [
        ("onnxruntime", "1.24.1"),
        ("onnxruntime-acme", "1.0.2"),
    ]
    with pytest.raises(ConfigError) as refused:
        require_one_ort_flavour(two.get)
    (problem,) = refused.value.problems
    assert "pip uninstall -y onnxruntime onnxruntime-acme" in problem.fix
    assert "pip install onnxruntime-acme" in problem.fix


def test_its_own_coverage_report_is_read_where_the_row_says_and_counted_as_it_says(
    acme: OrtBackend, tmp_path: Path
) -> None:
    (tmp_path / "voice-fp32-k").mkdir()
    report = {
        "deviceStat": [
            {"name": "all", "nodeNum": 10},
            {"name": "ACME_NPU", "nodeNum": 6},
            {"name": "CPU", "nodeNum": 4},
        ],
        "nodeStat": [{"opType": "Softmax", "device": "CPU"}] * 4,
    }
    (tmp_path / "voice-fp32-k" / "acme_report.json").write_text(json.dumps(report))
    spec = backends.session_spec(
        "ort-acme",
        graph="g.onnx",
        device_kind="npu",
        device_id="npu:0",
        precision="fp32",
        cache_key="voice-fp32-k",
        cache_dir=str(tmp_path),
    ).to_dict()
    sent = with_plugins(spec)
    assert sent["report"] == {"file": "acme_report.json", "env": ""}
    summary = ep_report(check_spec(sent))
    assert summary is not None and summary["cpu_op_types"] == {"Softmax": 4}
    cov = coverage_from_report(summary, None, "AcmeExecutionProvider")
    assert (cov["ep"], cov["taken"], cov["total"]) == ("AcmeExecutionProvider", 6, 10)
    assert cov["source"].startswith("acme_report (")
    verdict = judge(
        {
            "ep": "AcmeExecutionProvider",
            "precision": "fp32",
            "coverage": cov,
            "numeric": {"outputs": {}},
        },
        artifact_name="voice",
        device_id="npu:0",
        min_coverage=0.9,
        tolerance=Tolerance(),
    )
    (refusal,) = verdict.refusals
    assert refusal.code == "execution_provider_declined_graph"
    assert "AcmeExecutionProvider took 6 of 10 nodes (60.0%)" in refusal.message


# ---- no module outside the table names an EP ---------------------------------------------

TABLE_MODULES = {
    "orchestrator/core/backends.py",
    "orchestrator/core/ep_rows.py",
    "orchestrator/core/option_rules.py",
}
"""The EP vocabulary: the table, what a row holds, and the provider-option rules behind the
rows' allow-lists (OpenVINO's ``load_config`` properties among them)."""
ROUTE_COPY = {
    ("orchestrator/ort/worker_probe.py", "ORT_DISTRIBUTIONS"),
    ("orchestrator/ort/worker_probe.py", "PLUGIN_SINCE"),
}
"""The route program's stdlib-only copy of the builds (held equal to the table's by
``test_ort_flavours.py``)."""
USER_TEXT = ("description", "help")
"""Keyword arguments whose strings are text for a user (a field's description, a flag's help):
an example there (``e.g. [ort-openvino, ort-cpu]``) is no branch."""


def _ep_names() -> tuple[list[str], list[str]]:
    """(names a string may not hold, vendor words an identifier may not hold)."""
    names: list[str] = []
    for row in backends.rows():
        names += [row.backend, row.ep, *(p.package for p in row.plugins)]
        names += (
            [row.distribution] if row.distribution and row.distribution != "onnxruntime" else []
        )
        names += [row.coverage_report.file] if row.coverage_report else []
        names += (
            [row.coverage_report.env] if row.coverage_report and row.coverage_report.env else []
        )
        names += [d for _, d in row.route_venvs]
    words = [
        row.backend.removeprefix("ort-")
        for row in backends.rows()
        if row.backend.removeprefix("ort-") not in ("cpu", "cuda")  # device and engine words
    ]
    return names, [*words, "directml"]


def _strings_and_names(path: Path, rel: str) -> list[tuple[int, str]]:
    """Every string constant (f-strings' parts included) and every identifier of ``path``,
    but docstrings (a module's, a class's, a function's and an assignment's), user text
    (:data:`USER_TEXT`) and the route program's copy of the builds."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for i, stmt in enumerate(body):
                if (
                    isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                    and (i == 0 or isinstance(body[i - 1], ast.Assign | ast.AnnAssign))
                ):
                    skipped.add(id(stmt.value))
        if isinstance(node, ast.keyword) and node.arg in USER_TEXT:
            skipped |= {id(n) for n in ast.walk(node.value)}
        if (
            isinstance(node, ast.Assign)
            and (rel, getattr(node.targets[0], "id", None)) in ROUTE_COPY
        ):
            skipped |= {id(n) for n in ast.walk(node)}
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.arg):
            out.append((node.lineno, node.arg))
    return out


def names_of_an_ep(root: Path = REPO) -> list[str]:
    """Where a module of ``root``'s ``orchestrator/`` and ``stages/`` outside the table names an
    EP (``path:line: text``): its backend name, EP, build or plugin package, report file or
    variable, route venv in a string, or its vendor's word in an identifier.
    ``scripts/structure_report.py`` counts the files a new EP touches with it."""
    names, words = _ep_names()
    found = []
    for path in sorted([*(root / "orchestrator").rglob("*.py"), *(root / "stages").rglob("*.py")]):
        rel = str(path.relative_to(root))
        if rel in TABLE_MODULES:
            continue
        for line, text in _strings_and_names(path, rel):
            if any(n in text for n in names) or (
                text.isidentifier() and any(w in text.lower() for w in words)
            ):
                found.append(f"{rel}:{line}: {text!r}")
    return found


def test_no_module_outside_the_table_names_an_execution_provider() -> None:
    assert names_of_an_ep() == []


def test_the_scan_sees_a_branch_on_an_ep(tmp_path: Path) -> None:
    """The scan above finds what it is for: a literal and an identifier that name an EP."""
    branch = tmp_path / "branch.py"
    branch.write_text(
        'OPENVINO_EXTRA = 1\n\n\ndef f(backend: str) -> int:\n    """ort-openvino in a docstring is fine."""\n'
        '    return OPENVINO_EXTRA if backend == "ort-openvino" else 0\n'
    )
    names, words = _ep_names()
    hits = [
        text
        for _, text in _strings_and_names(branch, "orchestrator/branch.py")
        if any(n in text for n in names)
        or (text.isidentifier() and any(w in text.lower() for w in words))
    ]
    assert hits.count("OPENVINO_EXTRA") == 2 and hits.count("ort-openvino") == 1
