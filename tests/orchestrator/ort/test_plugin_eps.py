"""Plugin EPs (ONNX Runtime >= 1.22): the route worker registers the plugin packages
installed in its interpreter, reports ``get_ep_devices()``, and opens sessions on a
plugin EP's device through ``add_provider_for_devices``.

Hardware that cannot exist here (a Snapdragon's Hexagon NPU through onnxruntime-qnn
2.x, a Ryzen AI NPU through the VitisAI EP) is driven through the real code path —
worker probe → route report → profile devices and backends → plan → session open on
the selected device — with ``onnxruntime`` replaced by a stand-in that answers from
the device lists in ``ep_devices/*.json`` (written for the tests, not captured; each
file says so), and the plugin package by a stand-in package on ``sys.path``.
The real OpenVINO plugin package is tried at the end, where one is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import parse_config
from orchestrator.core.backends import backend, plugin_wire, session_spec
from orchestrator.core.profile import (
    THIS_PROCESS,
    Device,
    HardwareProfile,
    Host,
    Route,
    parse_profile,
)
from orchestrator.core.units import GiB
from orchestrator.ort import worker, worker_probe
from orchestrator.ort.routes import (
    probe_refusal,
    probe_route,
    report_from_probe,
    resolve,
    static_refusal,
)
from orchestrator.ort.sessions import ResolvedRoute, with_plugins
from orchestrator.planner import plan_pipeline
from orchestrator.probe import _with_backends, ep_discovered_devices
from tests.helpers import REPO
from tests.helpers.skips import skip_capability, skip_missing

DATA = Path(__file__).parent / "ep_devices"
HERE = ResolvedRoute(THIS_PROCESS, THIS_PROCESS, None)


# ---- a stand-in onnxruntime answering from a recorded device list ---------------------


class _DeviceType:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"OrtHardwareDeviceType.{self.name}"


def _ep_device(rec: dict[str, Any]) -> types.SimpleNamespace:
    hw = types.SimpleNamespace(
        type=_DeviceType(rec["device_type"]),
        vendor=rec["vendor"],
        vendor_id=rec["vendor_id"],
        device_id=rec["device_id"],
        metadata=dict(rec["device_metadata"]),
    )
    return types.SimpleNamespace(
        ep_name=rec["ep_name"],
        ep_vendor=rec["ep_vendor"],
        device=hw,
        ep_metadata=dict(rec["ep_metadata"]),
        ep_options={},
    )


def fake_ort(recording: dict[str, Any], *, expose: bool = True) -> types.ModuleType:
    """``onnxruntime`` as the recording describes it; registering a library that exists
    adds the recorded devices of the plugin EPs (none with ``expose=False``)."""
    ort: Any = types.ModuleType("onnxruntime")
    devices = [_ep_device(r) for r in recording["before_registration"]]
    ort.__version__ = recording["onnxruntime"]
    ort.registered = {}
    ort.sessions = []

    def register_execution_provider_library(name: str, path: str) -> None:
        if not os.path.isfile(path):
            raise RuntimeError(f"cannot load {path}")
        ort.registered[name] = path
        if expose:
            for recs in recording["registered"].values():
                devices.extend(_ep_device(r) for r in recs)

    def get_available_providers() -> list[str]:
        # as onnxruntime 1.32 answers: a registered plugin's EP is listed beside the built-in ones
        plugged = [ep for ep in recording["registered"] if ort.registered and expose]
        return [*recording["built_in_providers"], *plugged]

    class SessionOptions:
        def __init__(self) -> None:
            self.log_severity_level = 3
            self.config: dict[str, str] = {}
            self.for_devices: list[tuple[list[Any], dict[str, str]]] = []

        def add_session_config_entry(self, key: str, value: str) -> None:
            self.config[key] = value

        def add_provider_for_devices(self, eps: list[Any], options: dict[str, str]) -> None:
            assert len({d.ep_name for d in eps}) == 1, "all devices must be of one EP"
            self.for_devices.append((list(eps), dict(options)))

    class InferenceSession:
        def __init__(
            self,
            graph: str,
            sess_options: SessionOptions | None = None,
            providers: list[str] | None = None,
            provider_options: list[dict[str, str]] | None = None,
        ) -> None:
            self.graph, self.options = graph, sess_options
            if providers is None:
                assert sess_options is not None and sess_options.for_devices, "no EP was given"
                providers = [sess_options.for_devices[0][0][0].ep_name, "CPUExecutionProvider"]
            else:
                # as onnxruntime 1.32 does: a plugin EP named in providers= is dropped without a word
                providers = [p for p in providers if p in recording["built_in_providers"]] or [
                    "CPUExecutionProvider"
                ]
            self.providers = providers
            ort.sessions.append(self)

        def get_providers(self) -> list[str]:
            return list(self.providers)

        def get_provider_options(self) -> dict[str, dict[str, str]]:
            """As the OpenVINO plugin answers it: a plugin EP reports the options it was given."""
            given = (
                dict(self.options.for_devices[0][1])
                if self.options and self.options.for_devices
                else {}
            )
            return {self.providers[0]: given, "CPUExecutionProvider": {}}

        def get_inputs(self) -> list[Any]:
            return []

        def get_outputs(self) -> list[Any]:
            return []

        def get_provider_graph_assignment_info(self) -> list[Any]:
            node = types.SimpleNamespace(op_type="Conv", name="conv0")
            return [types.SimpleNamespace(ep_name=self.providers[0], get_nodes=lambda: [node])]

    ort.get_available_providers = get_available_providers
    ort.get_ep_devices = lambda: list(devices)
    ort.register_execution_provider_library = register_execution_provider_library
    ort.SessionOptions = SessionOptions
    ort.InferenceSession = InferenceSession
    return ort


def install_fake_openvino_plugin(site: Path, version: str = "1.8.1") -> Path:
    """A stand-in ``onnxruntime-ep-openvino`` distribution: its module, library file and dist-info."""
    pkg = site / "onnxruntime_ep_openvino"
    pkg.mkdir(parents=True)
    (pkg / "libonnxruntime_providers_openvino_plugin.so").write_bytes(b"")
    (pkg / "__init__.py").write_text(
        "import os\n"
        "def get_library_path():\n"
        "    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'libonnxruntime_providers_openvino_plugin.so')\n"
    )
    info = site / f"onnxruntime_ep_openvino-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: onnxruntime-ep-openvino\nVersion: {version}\n"
    )
    return pkg


def install_fake_qnn(site: Path, version: str = "2.5.0") -> Path:
    """A stand-in ``onnxruntime-qnn`` distribution: its module, library files and dist-info."""
    pkg = site / "onnxruntime_qnn"
    pkg.mkdir(parents=True)
    for name in ("onnxruntime_providers_qnn.dll", "QnnHtp.dll"):
        (pkg / name).write_bytes(b"")
    (pkg / "__init__.py").write_text(
        "import os\n"
        "_HERE = os.path.dirname(os.path.abspath(__file__))\n"
        "def get_library_path():\n    return os.path.join(_HERE, 'onnxruntime_providers_qnn.dll')\n"
        "def get_qnn_htp_path():\n    return os.path.join(_HERE, 'QnnHtp.dll')\n"
    )
    info = site / f"onnxruntime_qnn-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: onnxruntime-qnn\nVersion: {version}\n"
    )
    return pkg


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Use a recording: (name, expose, qnn version) → the stand-in onnxruntime, in this process."""

    def use(name: str, *, expose: bool = True, qnn_version: str | None = None) -> types.ModuleType:
        recording = json.loads((DATA / name).read_text())
        ort = fake_ort(recording, expose=expose)
        monkeypatch.setitem(sys.modules, "onnxruntime", ort)
        monkeypatch.setattr(worker_probe, "_registered", {})
        if qnn_version:
            install_fake_qnn(tmp_path / "site", qnn_version)
            monkeypatch.syspath_prepend(str(tmp_path / "site"))
            monkeypatch.delitem(sys.modules, "onnxruntime_qnn", raising=False)
        return ort

    yield use
    sys.modules.pop("onnxruntime_qnn", None)


def _cpu() -> Device:
    return Device(id="cpu", kind="cpu", name="test CPU", vendor="qualcomm", backends=["ort-cpu"])


def _profile(devices: list[Device], routes: list[Route]) -> HardwareProfile:
    host = Host(os="windows", ram_total_bytes=32 * GiB, ram_available_bytes=16 * GiB)
    profile = HardwareProfile(
        format="omni-edge.profile/1", name="recorded", host=host, devices=devices, routes=routes
    )
    return parse_profile(
        json.loads(profile.model_dump_json())
    )  # what probe --save writes reads back


def _voice_config(tmp_path: Path, devices: list[str], backends: list[str]) -> Any:
    doc = {
        "name": "voice",
        "stages": [
            {
                "name": "voice",
                "kind": "exported_graph",
                "artifact": str(REPO / "exports" / "piper-en-us-joe-medium"),
                "devices": devices,
                "backends": backends,
                "final_output": True,
                "final_output_type": "audio",
            }
        ],
    }
    return parse_config(doc, where=str(tmp_path / "voice.yaml"), base_dir=tmp_path)


# ---- the tests -------------------------------------------------------------------------


def test_a_qnn_npu_from_the_plugin_package_is_found_planned_and_opened_on_its_device(
    recorded, tmp_path: Path
) -> None:
    ort = recorded("snapdragon-x-elite-qnn.json", qnn_version="2.5.0")
    info = worker.Sessions().probe(plugins=plugin_wire())

    # the probe: the plugin registered, its devices listed, its EP offered
    (qnn,) = [p for p in info["plugin_eps"] if p["package"] == "onnxruntime-qnn"]
    assert (qnn["status"], qnn["version"], qnn["devices"]) == ("registered", "2.5.0", 2)
    assert qnn["library"].endswith("onnxruntime_providers_qnn.dll")
    assert ort.registered == {"onnxruntime-qnn": qnn["library"]}
    assert "QNNExecutionProvider" in info["providers"]
    assert (
        info["ort_distribution"] == "onnxruntime"
    )  # onnxruntime-qnn 2.x is a plugin, not the build
    npu_records = [d for d in info["ep_devices"] if d["device_type"] == "NPU"]
    assert [(d["ep_name"], d["vendor"]) for d in npu_records] == [
        ("QNNExecutionProvider", "Qualcomm")
    ]

    # the profile: the NPU is a device (probe could not see it otherwise), driven by ort-qnn
    report = report_from_probe(HERE, info)
    cpu = _cpu()
    found = ep_discovered_devices([report], [cpu])
    assert [(d.id, d.kind, d.vendor, d.name) for d in found] == [
        (
            "npu:0",
            "npu",
            "qualcomm",
            "Snapdragon(R) X Elite - X1E78100 - Qualcomm(R) Hexagon(TM) NPU",
        )
    ]
    assert (
        "get_ep_devices() in route 'this-process': QNNExecutionProvider on NPU" in found[0].source
    )
    npu = _with_backends(found[0], [report])
    assert npu.backends == ["ort-qnn"] and npu.route_for("ort-qnn") == THIS_PROCESS
    route = report.to_route()
    assert route.plugin_eps is not None and [p.package for p in route.plugin_eps] == [
        "onnxruntime-qnn"
    ]
    assert route.ep_devices is not None and any(d.device_type == "NPU" for d in route.ep_devices)
    profile = _profile([cpu, npu], [route])
    assert static_refusal(profile, npu, "ort-qnn") is None

    # the plan: the voice on the NPU with ort-qnn
    plan = plan_pipeline(_voice_config(tmp_path, ["npu:0", "cpu"], ["ort-qnn", "ort-cpu"]), profile)
    voice = plan.stage("voice")
    assert (voice.device, voice.backend, voice.route) == ("npu:0", "ort-qnn", THIS_PROCESS)

    # the session: the plugin EP added for the NPU device, with the package's own HTP backend
    opened = worker.Sessions().open(with_plugins(voice.engine_kwargs["session"]))
    assert opened["providers"][0] == "QNNExecutionProvider"
    assert opened["plugin"]["package"] == "onnxruntime-qnn"
    assert [d["device_type"] for d in opened["plugin"]["devices"]] == ["NPU"]
    assert opened["assignment"] == [{"ep": "QNNExecutionProvider", "nodes": [["Conv", "conv0"]]}]
    ((eps, options),) = ort.sessions[-1].options.for_devices
    assert [str(d.device.type) for d in eps] == ["OrtHardwareDeviceType.NPU"]
    assert options["backend_path"] == str(tmp_path / "site" / "onnxruntime_qnn" / "QnnHtp.dll")
    assert options["htp_performance_mode"] == "high_performance"

    # what `omni-edge probe` prints for it
    from rich.console import Console

    from orchestrator.commands.probe import profile_view

    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(profile_view(profile))
    text = console.export_text()
    assert "EP devices (onnxruntime.get_ep_devices())" in text and "plugin EPs" in text
    assert "QNN" in text and "NPU" in text and "registered, 2 devices" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_an_installed_plugin_that_exposes_no_device_is_named_in_the_refusal_and_the_open_error(
    recorded,
) -> None:
    """As the OpenVINO plugin behaves on this AMD machine: registered, no device."""
    recorded("snapdragon-x-elite-qnn.json", expose=False, qnn_version="2.5.0")
    info = worker.Sessions().probe(plugins=plugin_wire())
    assert "QNNExecutionProvider" not in info["providers"]
    report = report_from_probe(HERE, info)
    npu = Device(id="npu:0", kind="npu", name="Hexagon", vendor="qualcomm", backends=["ort-qnn"])
    refusal = probe_refusal(report, npu, "ort-qnn")
    assert refusal is not None and refusal.code == "device_unreachable_from_this_process"
    assert (
        "onnxruntime-qnn 2.5.0 is registered there but get_ep_devices() lists no QNNExecutionProvider "
        "device (it lists: CPUExecutionProvider on CPU (Qualcomm))"
    ) in refusal.message
    assert "pip install onnxruntime onnxruntime-qnn numpy" in refusal.remedy
    assert "omni-edge probe" in refusal.remedy
    # the same from the saved profile, without starting anything
    profile = _profile([_cpu(), npu], [report.to_route()])
    static = static_refusal(profile, npu, "ort-qnn")
    assert (
        static is not None and "is registered there but get_ep_devices() lists no" in static.message
    )
    spec = session_spec(
        "ort-qnn",
        graph="g.onnx",
        device_kind="npu",
        device_id="npu:0",
        precision="int8",
        cache_key="k",
    )
    with pytest.raises(
        worker_probe.ProviderUnavailable,
        match=r"no plugin gives it a device: onnxruntime-qnn 2.5.0 registered",
    ):
        worker.Sessions().open(with_plugins(spec.to_dict()))


def test_the_openvino_plugin_session_is_asked_for_the_planned_precision(
    recorded,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plugin EP ignores the `precision` option, and on a CPU with AMX-BF16 computes an
    fp32 graph in bf16 unless asked otherwise: the session it opens gets the plan's
    precision in load_config, and the route worker reports what the session holds.
    (The device list is the one captured on such a Xeon; the real plugin is tried below.)"""
    ort = recorded("intel-xeon-openvino-plugin.json")
    install_fake_openvino_plugin(tmp_path / "ov-site")
    monkeypatch.syspath_prepend(str(tmp_path / "ov-site"))
    monkeypatch.delitem(sys.modules, "onnxruntime_ep_openvino", raising=False)
    info = worker.Sessions().probe(plugins=plugin_wire())
    assert "OpenVINOExecutionProvider" in info["providers"]
    report = report_from_probe(HERE, info)
    cpu = _with_backends(
        Device(id="cpu", kind="cpu", name="Intel(R) Xeon(R) Processor", vendor="intel"), [report]
    )
    assert "ort-openvino" in cpu.backends
    plan = plan_pipeline(
        _voice_config(tmp_path, ["cpu"], ["ort-openvino"]), _profile([cpu], [report.to_route()])
    )
    voice = plan.stage("voice")
    assert (voice.device, voice.backend) == ("cpu", "ort-openvino")
    hint = {"fp32": "f32", "fp16": "f16", "int8": "f32"}[voice.engine_kwargs["precision"]]
    wanted = {"CPU": {"INFERENCE_PRECISION_HINT": hint}}
    assert (
        json.loads(voice.engine_kwargs["session"]["provider_options"][0]["load_config"]) == wanted
    )  # the plan shows it

    opened = worker.Sessions().open(with_plugins(voice.engine_kwargs["session"]))
    assert opened["plugin"]["package"] == "onnxruntime-ep-openvino"
    ((eps, options),) = ort.sessions[-1].options.for_devices
    assert [str(d.device.type) for d in eps] == ["OrtHardwareDeviceType.CPU"]
    assert (
        json.loads(options["load_config"]) == wanted and "device_type" not in options
    )  # the selection, not an option
    assert json.loads(opened["ep_options"]["reported"]["load_config"]) == wanted
    assert json.loads(opened["ep_options"]["given"]["load_config"]) == wanted
    sys.modules.pop("onnxruntime_ep_openvino", None)


def test_a_second_session_in_a_worker_that_registered_the_plugin_still_gets_the_plugin_ep(
    recorded,
) -> None:
    """Once a plugin library is registered (by the probe, or the first open) onnxruntime lists
    its EP among the available providers, but a session naming it in providers= runs on the
    CPU EP alone, silently: every open takes a plugin EP through its devices (the ASR opens
    two graphs in one worker; a probe precedes the opens in every route)."""
    ort = recorded("snapdragon-x-elite-qnn.json", qnn_version="2.5.0")
    sessions = worker.Sessions()
    sessions.probe(plugins=plugin_wire())  # registers the library
    assert "QNNExecutionProvider" in ort.get_available_providers()
    spec = with_plugins(
        session_spec(
            "ort-qnn",
            graph="g.onnx",
            device_kind="npu",
            device_id="npu:0",
            precision="int8",
            cache_key="k",
        ).to_dict()
    )
    first, second = sessions.open(spec), sessions.open(spec)
    for opened in (first, second):
        assert opened["providers"][0] == "QNNExecutionProvider"
        assert opened["plugin"] is not None and opened["plugin"]["package"] == "onnxruntime-qnn"
    assert [len(s.options.for_devices) for s in ort.sessions] == [1, 1]


def test_onnxruntime_qnn_1x_is_a_build_not_a_plugin(recorded) -> None:
    recorded("snapdragon-x-elite-qnn.json", qnn_version="1.24.4")
    (qnn,) = [
        p
        for p in worker.Sessions().probe(plugins=plugin_wire())["plugin_eps"]
        if p["package"] == "onnxruntime-qnn"
    ]
    assert qnn["status"] == "not a plugin"
    assert (
        qnn["error"]
        == "onnxruntime-qnn 1.24.4 is an onnxruntime build, not a plugin (plugins are >= 2)"
    )
    assert worker_probe.is_plugin_release(
        "onnxruntime-qnn", "2.5.0"
    ) and not worker_probe.is_plugin_release("onnxruntime-qnn", "1.24.4")


def test_a_ryzen_ai_npu_listed_by_the_built_in_vitisai_ep_becomes_a_device(recorded) -> None:
    recorded("ryzen-ai-vitisai.json")
    info = worker.Sessions().probe(plugins=plugin_wire())
    assert "VitisAIExecutionProvider" in info["providers"]  # built in, no plugin needed
    assert all(p["status"] == "not installed" for p in info["plugin_eps"])
    report = report_from_probe(HERE, info)
    cpu = Device(id="cpu", kind="cpu", name="Ryzen AI 9 HX 370", vendor="amd", backends=["ort-cpu"])
    (npu,) = ep_discovered_devices([report], [cpu])
    assert (npu.id, npu.vendor, npu.name) == ("npu:0", "amd", "NPU Compute Accelerator Device")
    assert "(vendor 0x1002, device 0x17f0)" in npu.source
    assert _with_backends(npu, [report]).backends == ["ort-vitisai"]
    # a probe that already found this NPU (Linux amdxdna) is not doubled
    known = Device(id="npu:0", kind="npu", name="AMD XDNA", vendor="amd")
    assert ep_discovered_devices([report], [cpu, known]) == []


def test_the_qnn_remedy_names_the_package_and_the_step_that_makes_the_ep_appear() -> None:
    install = backend("ort-qnn").install
    assert "pip install onnxruntime onnxruntime-qnn numpy" in install
    assert (
        "registers its library" in install
        and "omni-edge probe" in install
        and "QNNExecutionProvider NPU" in install
    )
    assert "onnxruntime-ep-openvino" in backend("ort-openvino").install


# ---- the real OpenVINO plugin package, where one is installed -------------------------------


def _openvino_plugin_python() -> str | None:
    """An interpreter with onnxruntime-ep-openvino: $OMNI_EDGE_EP_OPENVINO_PYTHON,
    .venvs/ep-openvino, or this one."""
    for candidate in (
        os.environ.get("OMNI_EDGE_EP_OPENVINO_PYTHON"),
        str(REPO / ".venvs/ep-openvino/bin/python"),
        sys.executable,
    ):
        if not candidate or not os.path.exists(candidate):
            continue
        done = subprocess.run(
            [candidate, "-c", "import onnxruntime_ep_openvino"], capture_output=True, timeout=60
        )
        if done.returncode == 0:
            return candidate
    return None


def test_the_openvino_plugin_package_registers_and_places_a_graph_where_it_exposes_a_device() -> (
    None
):
    """Both routes stay tested: .venvs/openvino (onnxruntime-openvino, the EP built in) in
    tests/orchestrator/verify, and this one (plain onnxruntime + the plugin package)."""
    python = _openvino_plugin_python()
    if python is None:
        why = (
            "onnxruntime-ep-openvino is not installed: set OMNI_EDGE_EP_OPENVINO_PYTHON or make "
            ".venvs/ep-openvino (scripts/bootstrap.sh does; docs/plugin-eps.md)"
        )
        skip_missing(why)
    route = Route(
        name="ep-openvino",
        kind=THIS_PROCESS if python == sys.executable else "interpreter",
        python=None if python == sys.executable else python,
    )
    report = probe_route(route, timeout=120)
    assert report.reachable, report.reason
    (plugin,) = [p for p in report.plugin_eps if p["package"] == "onnxruntime-ep-openvino"]
    assert plugin["status"] == "registered", plugin
    ov = [d for d in report.ep_devices if d["ep_name"] == "OpenVINOExecutionProvider"]
    if not ov:
        # A capability, not a missing asset: the package is installed and registered (asserted
        # above), and OpenVINO drives Intel's CPUs, GPUs and NPUs only. With any Intel device
        # here, no device is a failure.
        from orchestrator.probe.host import cpu_model, cpu_vendor

        name = cpu_model()[0]
        listed = "; ".join(
            f"{d['ep_name']} on {d['device_type']} {d['vendor']}" for d in report.ep_devices
        )
        intel = [d for d in report.ep_devices if "intel" in str(d["vendor"]).lower()]
        assert cpu_vendor(name) != "intel" and not intel, (
            f"onnxruntime-ep-openvino {plugin['version']} exposes no device on Intel hardware "
            f"({name}): get_ep_devices() lists only {listed}"
        )
        skip_capability(
            f"onnxruntime-ep-openvino {plugin['version']} exposes devices on Intel hardware only, "
            f"and this machine has none ({name}): get_ep_devices() lists only {listed} "
            "(docs/plugin-eps.md)"
        )
    # A device: verify a placement through it with the gates (coverage and numerics).
    from orchestrator.ort.sessions import open_sessions
    from orchestrator.verify.gates import judge, measure
    from stages.exported_graph.artifact import load_artifact

    assert "OpenVINOExecutionProvider" in report.providers
    artifact = load_artifact(REPO / "exports" / "silero-vad-op18")
    graph = str(artifact.resolve(artifact.manifest.precisions["fp32"]))
    kind = (
        "cpu" if any(d["device_type"] == "CPU" for d in ov) else str(ov[0]["device_type"]).lower()
    )
    spec = session_spec(
        "ort-openvino",
        graph=graph,
        device_kind=kind,
        device_id=kind,
        precision="fp32",
        cache_key="t",
    )
    sessions = open_sessions(resolve(route))
    try:
        record = measure(sessions, artifact, "fp32", spec, reference_graph=graph)
        # the session holds the planned precision (the plugin ignores the `precision` option and,
        # on a CPU with AMX-BF16, computes fp32 graphs in bf16 unless load_config says f32)
        opened = sessions.open(spec.to_dict())
        sessions.close(opened["handle"])
    finally:
        sessions.shutdown()
    hint = "f16" if kind == "npu" else "f32"
    assert opened["plugin"] is not None and opened["ep_options"]["reported"] is not None
    assert json.loads(opened["ep_options"]["reported"]["load_config"]) == {
        kind.upper(): {"INFERENCE_PRECISION_HINT": hint}
    }
    verdict = judge(
        record,
        artifact_name=artifact.manifest.name,
        device_id=kind,
        min_coverage=artifact.manifest.min_ep_coverage,
        tolerance=artifact.manifest.tolerance,
    )
    assert record["ep"] == "OpenVINOExecutionProvider"
    assert verdict.passed, verdict.refusals


def test_the_probe_of_this_interpreter_reports_its_ep_devices_and_omni_edge_probe_shows_them() -> (
    None
):
    """Real: this interpreter's onnxruntime lists at least the CPU EP on the CPU (>= 1.22)."""
    report = probe_route(Route(name=THIS_PROCESS), timeout=120)
    assert report.reachable, report.reason
    major, minor = (int(x) for x in (report.ort_version or "0.0").split(".")[:2])
    if (major, minor) < (1, 22):
        pytest.skip(f"onnxruntime {report.ort_version} has no get_ep_devices() (>= 1.22)")
    cpu = [d for d in report.ep_devices if d["ep_name"] == "CPUExecutionProvider"]
    assert cpu and cpu[0]["device_type"] == "CPU"
    route = report.to_route()
    assert route.ep_devices is not None and route.ep_devices[0].ep_name == "CPUExecutionProvider"
    assert route.plugin_eps is not None
    assert all(
        p.status != "not installed" for p in route.plugin_eps
    )  # only what is installed is kept
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "probe", "--json", "--no-default-routes"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (here,) = json.loads(done.stdout)["routes"]
    assert any(
        d["ep_name"] == "CPUExecutionProvider" and d["device_type"] == "CPU"
        for d in here["ep_devices"]
    )
