"""Provider options reach ONNX Runtime only through each backend row's allow-list
(``orchestrator.core.option_rules``): a pipeline config cannot name a library to load (QNN's
``backend_path``), make OpenVINO write compiled blobs outside omni-edge's cache (``cache_dir``,
``load_config``'s ``CACHE_DIR``) or pass an option or property nobody declared. The user's own
settings file may give a library path. Refusals are exit 2 when the config is read:
where → what → how to fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.core import backends
from tests.helpers.graphs import OV_PYTHON, write_artifact

PROFILES = Path(__file__).resolve().parents[3] / "configs" / "profiles"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's cache and (absent) settings file."""
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMNI_EDGE_SETTINGS", str(tmp_path / "settings.yaml"))
    return tmp_path


def config(
    folder: Path, artifact: Path, backend: str, device: str, options: dict[str, Any]
) -> Path:
    """A downloaded pipeline config whose one stage passes ``options`` to ``backend``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pipeline.yaml"
    stage = {
        "name": "net",
        "kind": "exported_graph",
        "artifact": str(artifact),
        "devices": [device],
        "backends": [backend],
        "final_output": True,
        "provider_options": {backend: options},
    }
    path.write_text(yaml.safe_dump({"name": "downloaded", "stages": [stage]}))
    return path


def refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2, args
    return capsys.readouterr().err.replace("\n", " ")


@pytest.mark.parametrize(
    ("backend", "device", "options", "what", "fix"),
    [
        (
            "ort-qnn",
            "npu:0",
            {"backend_path": "evil/libQnnHtp.so"},
            "ort-qnn.backend_path names a file QNNExecutionProvider loads (native code, or what "
            "chooses it): a pipeline config cannot choose one",
            "set provider_options: {ort-qnn: {backend_path: PATH}} in your settings file",
        ),
        (
            "ort-vitisai",
            "npu:0",
            {"xclbin": "evil.xclbin"},
            "ort-vitisai.xclbin names a file VitisAIExecutionProvider loads",
            "in your settings file",
        ),
        (
            "ort-openvino",
            "igpu:0",
            {"cache_dir": "/tmp/elsewhere"},
            "ort-openvino.cache_dir: '/tmp/elsewhere' is outside omni-edge's cache",
            "leave it out (compiled blobs go to",
        ),
        (
            "ort-openvino",
            "igpu:0",
            {"cache_dir": "../../../elsewhere"},
            "ort-openvino.cache_dir: '../../../elsewhere' is outside omni-edge's cache",
            "leave it out",
        ),
        (
            "ort-openvino",
            "igpu:0",
            {"load_config": json.dumps({"GPU": {"CACHE_DIR": "/tmp/elsewhere"}})},
            "ort-openvino.load_config: GPU.CACHE_DIR '/tmp/elsewhere' is outside omni-edge's cache",
            "leave it out",
        ),
        (
            "ort-openvino",
            "igpu:0",
            {"load_config": json.dumps({"GPU": {"CONFIG_FILE": "kernels.xml"}})},
            "ort-openvino.load_config: GPU.CONFIG_FILE is not an OpenVINO property omni-edge passes",
            "INFERENCE_PRECISION_HINT",
        ),
        (
            "ort-dml",
            "igpu:0",
            {"enable_dynamic_graph_fusion": "1"},
            "ort-dml.enable_dynamic_graph_fusion is not an option omni-edge passes to DmlExecutionProvider",
            "use one of device_filter, device_id, performance_preference",
        ),
    ],
)
def test_a_config_option_outside_the_rows_allow_list_is_refused_naming_it(
    home: Path,
    capsys: pytest.CaptureFixture[str],
    backend: str,
    device: str,
    options: dict[str, Any],
    what: str,
    fix: str,
) -> None:
    artifact = write_artifact(home / "art", "full")
    cfg = config(home / "downloaded", artifact, backend, device, options)
    profile = PROFILES / (
        "lunar-lake-32gb.json"
        if backend in ("ort-openvino", "ort-dml")
        else "snapdragon-x-elite-32gb.json"
    )
    if backend == "ort-vitisai":
        profile = PROFILES / "strix-point-rtx5090-windows.json"
    err = refused(["plan", str(cfg), "--profile", str(profile)], capsys)
    assert f"{cfg}: stages[0].provider_options" in err, err
    assert what in err, err
    assert "how to fix:" in err and fix in err, err


def test_options_the_row_declares_pass_a_cache_dir_inside_the_cache_too(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    artifact = write_artifact(home / "art", "full")
    inside = str(home / "cache" / "ep-cache" / "mine")
    given = {
        "cache_dir": inside,
        "num_of_threads": 2,
        "load_config": json.dumps({"GPU": {"CACHE_MODE": "OPTIMIZE_SPEED"}}),
    }
    cfg = config(home / "downloaded", artifact, "ort-openvino", "igpu:0", given)
    assert (
        main(["plan", str(cfg), "--profile", str(PROFILES / "lunar-lake-32gb.json"), "--json"]) == 0
    )
    (stage,) = json.loads(capsys.readouterr().out)["stages"]
    options = stage["engine_kwargs"]["session"]["provider_options"][0]
    assert (options["cache_dir"], options["num_of_threads"]) == (inside, "2")
    assert json.loads(options["load_config"])["GPU"]["CACHE_MODE"] == "OPTIMIZE_SPEED"


def test_a_library_path_comes_from_the_users_settings_and_a_typo_there_is_named(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    artifact = write_artifact(home / "art", "full")
    cfg = config(
        home / "downloaded", artifact, "ort-qnn", "npu:0", {"htp_performance_mode": "burst"}
    )
    snapdragon = PROFILES / "snapdragon-x-elite-32gb.json"
    settings = home / "settings.yaml"
    settings.write_text(r"provider_options: {ort-qnn: {backend_path: 'C:\Qualcomm\QnnHtp.dll'}}")
    assert main(["plan", str(cfg), "--profile", str(snapdragon), "--json"]) == 0
    (stage,) = json.loads(capsys.readouterr().out)["stages"]
    options = stage["engine_kwargs"]["session"]["provider_options"][0]
    assert options["backend_path"] == r"C:\Qualcomm\QnnHtp.dll"
    assert options["htp_performance_mode"] == "burst"  # the config's own value option

    settings.write_text("provider_options: {ort-qnn: {backend_pth: x.dll}}")
    err = refused(["plan", str(cfg), "--profile", str(snapdragon)], capsys)
    assert f"{settings}: provider_options.ort-qnn.backend_pth: is not an option" in err, err
    assert "how to fix: use one of backend_path" in err


def test_every_rows_table_options_are_among_its_declared_ones() -> None:
    for name, row in backends.BACKENDS.items():
        for per_device in row.provider_options.values():
            assert set(per_device) <= set(row.options), name
        for extra in row.precision_options.values():
            assert set(extra) <= set(row.options), name
    assert {"backend_path", "config_file", "xclbin", "cache_dir"} <= backends.PATH_OPTIONS


@pytest.mark.ort
@pytest.mark.skipif(not OV_PYTHON.exists(), reason=f"the OpenVINO route is missing: {OV_PYTHON}")
def test_verify_writes_no_openvino_blob_where_a_config_says(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenVINO writes a compiled blob into its cache_dir (on the CPU too): a config's
    cache_dir outside omni-edge's cache is refused before any session opens, and nothing is
    written there."""
    artifact = write_artifact(home / "art", "full")
    elsewhere = home / "elsewhere"
    elsewhere.mkdir()
    cfg = config(
        home / "downloaded", artifact, "ort-openvino", "cpu", {"cache_dir": str(elsewhere)}
    )
    profile = home / "profile.json"
    profile.write_text(
        json.dumps(
            {
                "format": "omni-edge.profile/1",
                "name": "this machine",
                "host": {"os": "linux", "ram_total_bytes": 2**34, "ram_available_bytes": 2**33},
                "devices": [
                    {
                        "id": "cpu",
                        "kind": "cpu",
                        "name": "c",
                        "backends": ["ort-openvino"],
                        "backend_routes": {"ort-openvino": "openvino"},
                    }
                ],
                "routes": [
                    {"name": "this-process"},
                    {"name": "openvino", "kind": "interpreter", "python": str(OV_PYTHON)},
                ],
            }
        )
    )
    err = refused(["verify", str(cfg), "--profile", str(profile)], capsys)
    assert "ort-openvino.cache_dir" in err and "outside omni-edge's cache" in err
    assert list(elsewhere.iterdir()) == []
