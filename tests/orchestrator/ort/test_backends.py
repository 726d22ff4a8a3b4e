"""DirectML, VitisAI, QNN, OpenVINO and CUDA placements, up to the options they would pass.

No such device is here: the recorded profiles in configs/profiles stand in for
the machines (only the device is mocked; the planner, the backend table and the
evidence lookup are the real ones).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config import parse_config
from orchestrator.core.backends import keyed_options
from orchestrator.core.errors import RefusalCode
from orchestrator.core.profile import HardwareProfile, load_profile
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.placement import placement_for
from stages.exported_graph.kind import ExportedGraphConfig, ExportedGraphKind
from tests.helpers.graphs import REPO, K, N, write_artifact

PROFILES = REPO / "configs" / "profiles"


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    """The tiny full graph with an fp32 and an int8 file (the same bytes: options only)."""
    d = write_artifact(tmp_path / "tiny", "full", name="tiny")
    shutil.copy(d / "fp32.onnx", d / "int8.onnx")
    doc = yaml.safe_load((d / "manifest.yaml").read_text())
    doc["precisions"]["int8"] = "int8.onnx"
    (d / "manifest.yaml").write_text(yaml.safe_dump(doc))
    return d


def kwargs_for(
    profile: HardwareProfile, artifact: Path, device_id: str, backend: str, **stage: Any
) -> dict[str, Any]:
    kind = ExportedGraphKind()
    cfg = ExportedGraphConfig(
        name="s", kind="exported_graph", devices=[device_id], artifact=str(artifact), **stage
    )
    device = profile.device(device_id)
    assert device is not None
    info = kind.describe(cfg)
    assert kind.check(cfg, info, device, backend) == []
    reservations = kind.reservations(cfg, info, device, backend, device.pool)
    return kind.engine_kwargs(cfg, info, device, backend, reservations, 0)


def test_directml_on_the_radeon_igpu_turns_memory_patterns_off_and_runs_sequentially(
    artifact: Path,
) -> None:
    profile = load_profile(PROFILES / "strix-point-rtx5090-windows.json")
    kw = kwargs_for(profile, artifact, "igpu:0", "ort-dml", precision=["fp32"])
    session = kw["session"]
    assert session["providers"] == ["DmlExecutionProvider", "CPUExecutionProvider"]
    assert session["provider_options"][0] == {
        "device_filter": "gpu",
        "performance_preference": "minimum_power",
    }
    assert session["session_options"] == {
        "enable_mem_pattern": False,
        "execution_mode": "sequential",
    }
    # the discrete RTX through DirectML asks for the high-performance adapter instead
    kw = kwargs_for(profile, artifact, "gpu:0", "ort-dml", precision=["fp32"])
    assert kw["session"]["provider_options"][0]["performance_preference"] == "high_performance"


def test_vitisai_on_the_xdna_npu_gets_a_digest_keyed_compile_cache(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "c"))
    profile = load_profile(PROFILES / "strix-point-rtx5090-windows.json")
    kw = kwargs_for(profile, artifact, "npu:0", "ort-vitisai", precision=["int8", "fp32"])
    assert kw["precision"] == "int8"
    opts = kw["session"]["provider_options"][0]
    assert kw["session"]["providers"] == ["VitisAIExecutionProvider", "CPUExecutionProvider"]
    assert opts["cache_dir"] == str(tmp_path / "c" / "ep-cache" / "ort-vitisai")
    assert (
        opts["cache_key"].startswith("tiny-int8-")
        and len(opts["cache_key"]) == len("tiny-int8-") + 12
    )
    assert (
        opts["enable_cache_file_io_in_mem"] == "0"
    )  # so vitisai_ep_report.json lands in cache_dir
    # a config_file from the user's own settings is passed through (a pipeline config may not
    # name one: tests/orchestrator/ort/test_option_rules.py)
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        "provider_options: {ort-vitisai: {config_file: C:/RyzenAI/vaip_config.json}}"
    )
    monkeypatch.setenv("OMNI_EDGE_SETTINGS", str(settings))
    kw = kwargs_for(profile, artifact, "npu:0", "ort-vitisai", precision=["int8"])
    assert kw["session"]["provider_options"][0]["config_file"] == "C:/RyzenAI/vaip_config.json"


def test_vitisai_refuses_an_fp32_only_artifact_as_no_exported_graph(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "fp32only", "full", name="fp32only")
    profile = load_profile(PROFILES / "strix-point-rtx5090-windows.json")
    kind = ExportedGraphKind()
    cfg = ExportedGraphConfig(
        name="s", kind="exported_graph", devices=["npu:0"], artifact=str(d), precision=["fp32"]
    )
    npu = profile.device("npu:0")
    assert npu is not None
    (refusal,) = kind.check(cfg, kind.describe(cfg), npu, "ort-vitisai")
    assert refusal.code == RefusalCode.NO_EXPORTED_GRAPH
    assert "fp32only has fp32 graph(s)" in refusal.message
    assert "ort-vitisai on npu:0 (npu) runs int8, bf16" in refusal.message
    assert "no fp32 datapath" in refusal.message
    assert "export a int8 or bf16 graph" in refusal.remedy


def test_qnn_on_the_snapdragon_htp_names_its_backend_library(artifact: Path) -> None:
    profile = load_profile(PROFILES / "snapdragon-x-elite-32gb.json")
    kw = kwargs_for(profile, artifact, "npu:0", "ort-qnn", precision=["int8"])
    opts = kw["session"]["provider_options"][0]
    assert kw["session"]["providers"][0] == "QNNExecutionProvider"
    assert opts["backend_path"] == "QnnHtp.dll"
    assert "enable_htp_fp16_precision" not in opts
    fp32 = kwargs_for(profile, artifact, "npu:0", "ort-qnn", precision=["fp32"])
    assert fp32["session"]["provider_options"][0]["enable_htp_fp16_precision"] == "1"


def test_openvino_device_type_follows_the_device_kind(artifact: Path) -> None:
    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    by_device = {
        d: kwargs_for(profile, artifact, d, "ort-openvino")["session"]["provider_options"][0][
            "device_type"
        ]
        for d in ("cpu", "igpu:0", "npu:0")
    }
    assert by_device == {"cpu": "CPU", "igpu:0": "GPU", "npu:0": "NPU"}


@pytest.mark.parametrize(
    ("device", "precision", "hint"),
    [
        (
            "cpu",
            "fp32",
            {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}},
        ),  # unasked: bf16 on a CPU with AMX-BF16
        (
            "cpu",
            "int8",
            {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}},
        ),  # what the QDQ graph leaves in fp32
        (
            "igpu:0",
            "fp32",
            {"GPU": {"INFERENCE_PRECISION_HINT": "f32"}},
        ),  # unasked: the GPU plugin's f16
        (
            "npu:0",
            "fp32",
            {"NPU": {"INFERENCE_PRECISION_HINT": "f16"}},
        ),  # the NPU's only precision, by name
        ("npu:0", "int8", {"NPU": {"INFERENCE_PRECISION_HINT": "f16"}}),
    ],
)
def test_every_openvino_session_asks_for_the_planned_precision(
    artifact: Path,
    device: str,
    precision: str,
    hint: dict[str, Any],
) -> None:
    """OpenVINO picks an inference precision per device when told none; the plan's
    precision is a promise, so the session's load_config names it (both the built-in
    and the plugin EP read load_config; the plugin ignores the `precision` option)."""
    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    kw = kwargs_for(profile, artifact, device, "ort-openvino", precision=[precision])
    assert kw["precision"] == precision
    options = kw["session"]["provider_options"][0]
    assert json.loads(options["load_config"]) == hint
    assert "precision" not in options  # the deprecated option the plugin EP ignores


def test_a_users_load_config_keeps_its_properties_and_gains_the_precision(artifact: Path) -> None:
    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    own = {
        "ort-openvino": {
            "load_config": '{"CPU": {"NUM_STREAMS": "1"}, "GPU": {"CACHE_MODE": "OPTIMIZE_SPEED"}}'
        }
    }
    kw = kwargs_for(
        profile, artifact, "cpu", "ort-openvino", precision=["fp32"], provider_options=own
    )
    assert json.loads(kw["session"]["provider_options"][0]["load_config"]) == {
        "CPU": {"NUM_STREAMS": "1", "INFERENCE_PRECISION_HINT": "f32"},
        "GPU": {"CACHE_MODE": "OPTIMIZE_SPEED"},
    }
    # a hint the user wrote is theirs, and the plan shows it
    mine = {"ort-openvino": {"load_config": '{"CPU": {"INFERENCE_PRECISION_HINT": "bf16"}}'}}
    kw = kwargs_for(
        profile, artifact, "cpu", "ort-openvino", precision=["fp32"], provider_options=mine
    )
    assert json.loads(kw["session"]["provider_options"][0]["load_config"]) == {
        "CPU": {"INFERENCE_PRECISION_HINT": "bf16"}
    }


def test_a_load_config_that_is_no_json_object_is_refused_naming_it(artifact: Path) -> None:
    from orchestrator.core.errors import ConfigError

    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    with pytest.raises(ConfigError) as err:
        kwargs_for(
            profile,
            artifact,
            "cpu",
            "ort-openvino",
            precision=["fp32"],
            provider_options={"ort-openvino": {"load_config": "ov_config.json"}},
        )
    text = str(err.value)
    assert "provider_options.ort-openvino.load_config" in text and "not a JSON object" in text
    assert '{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}' in text


def test_cuda_names_its_device_and_reserves_on_the_gpus_own_vram(artifact: Path) -> None:
    profile = load_profile(PROFILES / "strix-point-rtx5090-windows.json")
    kw = kwargs_for(profile, artifact, "gpu:0", "ort-cuda")
    assert kw["session"]["providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert kw["session"]["provider_options"][0] == {"device_id": "0"}
    kind = ExportedGraphKind()
    cfg = ExportedGraphConfig(
        name="s", kind="exported_graph", devices=["gpu:0"], artifact=str(artifact)
    )
    gpu = profile.device("gpu:0")
    assert gpu is not None
    info = kind.describe(cfg)
    rs = {r.purpose: r for r in kind.reservations(cfg, info, gpu, "ort-cuda", gpu.pool)}
    assert {r.pool for r in rs.values()} == {"vram:gpu:0"}
    assert (
        rs["weights"].evidence == "D"
        and rs["weights"].bytes
        == info.details["precisions"]["fp32"]["initializer_bytes"]
        == (K * N + N) * 4
    )
    assert {rs[p].evidence for p in ("activations", "ep_workspace", "load_transient")} == {"E"}
    assert rs["load_transient"].lifetime == "load" and rs["activations"].lifetime == "request"


def test_target_only_drops_the_cpu_ep_and_sets_the_no_fallback_key(artifact: Path) -> None:
    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    kw = kwargs_for(profile, artifact, "npu:0", "ort-openvino", target_only=True)
    assert kw["session"]["providers"] == ["OpenVINOExecutionProvider"]
    assert kw["session"]["session_config"] == {"session.disable_cpu_ep_fallback": "1"}
    assert kw["target_only"] is True


def test_cache_locations_are_not_part_of_the_evidence_key(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.core.backends import SessionSpec

    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "a"))
    a = SessionSpec.from_dict(kwargs_for(profile, artifact, "npu:0", "ort-openvino")["session"])
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "b"))
    b = SessionSpec.from_dict(kwargs_for(profile, artifact, "npu:0", "ort-openvino")["session"])
    assert a.provider_options != b.provider_options
    assert keyed_options("ort-openvino", a) == keyed_options("ort-openvino", b)


def _config(artifact: Path, devices: list[str], tmp_path: Path) -> Any:
    doc = {
        "name": "p",
        "stages": [
            {
                "name": "voice",
                "kind": "exported_graph",
                "artifact": str(artifact),
                "devices": devices,
                "backends": ["ort-openvino"],
                "final_output": True,
            }
        ],
    }
    return parse_config(doc, where="test.yaml", base_dir=tmp_path)


def test_the_planner_reads_evidence_and_refuses_on_failed_evidence(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plan-time: unverified without evidence; verified (M) with passing evidence;
    refused with the recorded counts when the evidence says the EP declined."""
    from orchestrator.planner import plan_pipeline

    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    config = _config(artifact, ["npu:0", "igpu:0"], tmp_path)
    plan = plan_pipeline(config, profile, runtime=False)
    voice = plan.stage("voice")
    assert (voice.device, voice.verification.status) == ("npu:0", "unverified")  # type: ignore[union-attr]

    kind = ExportedGraphKind()
    stage = config.stage("voice")
    info = kind.describe(stage)
    npu, igpu = profile.device("npu:0"), profile.device("igpu:0")
    assert npu is not None and igpu is not None
    route = profile.route("this-process")
    assert route is not None
    store = EvidenceStore()

    def record(taken: int, total: int) -> dict[str, Any]:
        return {
            "ep": "OpenVINOExecutionProvider",
            "precision": "fp32",
            "coverage": {
                "ep": "OpenVINOExecutionProvider",
                "taken": taken,
                "total": total,
                "fraction": taken / total,
                "partitions": 1 if taken else 0,
                "by_ep": {},
                "fallback_op_types": {"Gemm": total - taken},
                "source": "ort_assignment_info",
            },
            "numeric": {
                "reference": "CPU EP, fp32 graph",
                "outputs": {
                    "y": {"shape_match": True, "rel_l2": 1e-6, "max_abs": 1e-6, "cosine": 1.0}
                },
                "error": None,
            },
            "suspicious": False,
        }

    npu_gate = kind.gate_spec(stage, info, npu, "ort-openvino")
    igpu_gate = kind.gate_spec(stage, info, igpu, "ort-openvino")
    assert npu_gate is not None and igpu_gate is not None
    npu_key = placement_for(npu_gate, route).key
    igpu_key = placement_for(igpu_gate, route).key
    assert npu_key is not None and igpu_key is not None and npu_key != igpu_key
    store.save(npu_key, record(0, 2))
    store.save(igpu_key, record(2, 2))

    plan = plan_pipeline(config, profile, runtime=False)
    voice = plan.stage("voice")
    assert voice.device == "igpu:0"
    assert voice.verification.status == "verified" and voice.verification.evidence.startswith("M ")  # type: ignore[union-attr]
    (refusal,) = [r for r in voice.refusals if r.device == "npu:0"]
    assert refusal.code == RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH
    assert "took 0 of 2 nodes (0.0%)" in refusal.message and "Gemm×2" in refusal.message


def test_every_config_field_of_the_kind_has_a_description() -> None:
    from pydantic import BaseModel

    from stages.exported_graph.artifact import (
        ExportManifest,
        Reference,
        Source,
        TensorSpec,
        Tolerance,
    )
    from stages.exported_graph.kind import ToleranceOverride

    missing = []
    for model in (
        ExportedGraphConfig,
        ToleranceOverride,
        ExportManifest,
        Source,
        TensorSpec,
        Reference,
        Tolerance,
    ):
        assert issubclass(model, BaseModel)
        missing += [
            f"{model.__name__}.{n}" for n, f in model.model_fields.items() if not f.description
        ]
    assert missing == []


# ---- the table is the one vocabulary ------------------------------------------------------


def test_the_profile_the_stage_kind_and_the_probe_take_their_backend_names_from_the_table() -> None:
    from typing import get_args

    from orchestrator.core.backends import BACKENDS, EP_BACKENDS, OrtBackendName
    from orchestrator.core.engines import backend_names as engine_backend_names
    from orchestrator.core.profile import backend_vocabulary

    assert tuple(BACKENDS) == get_args(OrtBackendName)
    assert set(backend_vocabulary()) == set(engine_backend_names()) | set(BACKENDS)
    assert ExportedGraphKind.backends == tuple(BACKENDS)
    assert {row.ep: name for name, row in BACKENDS.items()} == EP_BACKENDS


def test_each_row_gives_options_only_for_the_devices_it_drives() -> None:
    from orchestrator.core.backends import BACKENDS

    for name, row in BACKENDS.items():
        assert row.drives, name
        assert set(row.provider_options) <= {"*", *row.drives}, name
        for rule in row.precisions:
            assert set(rule.device_kinds) <= set(row.drives), (name, rule)


def test_devices_map_to_backends_through_the_table() -> None:
    from orchestrator.core.backends import backends_for_device

    eps = [
        "OpenVINOExecutionProvider",
        "VitisAIExecutionProvider",
        "CUDAExecutionProvider",
        "DmlExecutionProvider",
        "CPUExecutionProvider",
        "SomeoneElsesExecutionProvider",
    ]
    assert backends_for_device("cpu", "amd", eps) == ["ort-openvino", "ort-cpu"]
    assert backends_for_device("npu", "intel", eps) == ["ort-openvino", "ort-dml"]
    assert backends_for_device("npu", "amd", eps) == ["ort-vitisai", "ort-dml"]
    assert backends_for_device("gpu", "nvidia", eps) == ["ort-cuda", "ort-dml"]
    assert backends_for_device("igpu", "amd", eps) == ["ort-dml"]


@pytest.mark.parametrize("profile_path", sorted(PROFILES.glob("*.json")), ids=lambda p: p.stem)
def test_recorded_profiles_list_only_backends_the_table_says_drive_the_device(
    profile_path: Path,
) -> None:
    from orchestrator.core.backends import BACKENDS

    profile = load_profile(profile_path)
    wrong = [
        (d.id, b)
        for d in profile.devices
        for b in d.backends
        if b in BACKENDS and not BACKENDS[b].drives_device(d.kind, d.vendor)
    ]
    assert wrong == []
