"""The vad kind plans its graph exactly as an exported_graph stage would (weights read from
the graph, its subgraphs included; the backend table's workspace; the same gate), refuses
bad settings and non-VAD artifacts where they are, and checks a request before any actor.
On OpenVINO the package's plain graph is a named refusal and the CPU EP is taken next; the
op18 graph, chosen deliberately, verifies there."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.cli import main
from orchestrator.config import parse_config
from orchestrator.core import backends as ort_backends
from orchestrator.core.errors import BadRequest, ConfigError, RefusalCode
from orchestrator.core.profile import HardwareProfile, parse_profile
from orchestrator.core.units import GiB
from orchestrator.planner import plan_pipeline
from stages.exported_graph.graph_stats import describe_graph
from stages.registry import get_kind, known_kinds
from stages.requests import as_request
from tests.helpers.graphs import OV_PYTHON, REPO

PLAIN = REPO / "exports" / "silero-vad"
OP18 = REPO / "exports" / "silero-vad-op18"
PROFILE: dict[str, Any] = {
    "format": "omni-edge.profile/1",
    "name": "test box",
    "host": {"os": "linux", "ram_total_bytes": 16 * GiB, "ram_available_bytes": 8 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "test CPU", "backends": ["ort-cpu"]}],
    "routes": [{"name": "this-process"}],
}

needs_silero = pytest.mark.skipif(
    importlib.util.find_spec("silero_vad") is None,
    reason="silero-vad is not installed (scripts/bootstrap.sh installs it with --no-deps)",
)


def profile() -> HardwareProfile:
    return parse_profile(PROFILE)


def vad_stage(artifact: Path = PLAIN, **extra: Any) -> dict[str, Any]:
    return {
        "name": "vad",
        "kind": "vad",
        "artifact": str(artifact),
        "devices": ["cpu"],
        "backends": ["ort-cpu"],
        "final_output": True,
        "final_output_type": "audio",
        **extra,
    }


def config_of(tmp_path: Path, **extra: Any) -> Any:
    return parse_config(
        {"name": "p", "stages": [vad_stage(**extra)]}, where="t.yaml", base_dir=tmp_path
    )


def test_vad_is_a_built_in_kind_that_takes_audio_and_yields_audio() -> None:
    kind = get_kind("vad")
    assert "vad" in known_kinds()
    assert (kind.consumes, kind.produces, kind.needs_gates) == (("audio",), ("audio",), True)


@needs_silero
def test_the_plan_holds_the_graphs_weights_its_subgraphs_included(tmp_path: Path) -> None:
    """silero_vad.onnx keeps its weights inside its If's branches: 2.18 MB, not the 8 bytes
    of the top-level graph."""
    config = config_of(tmp_path)
    plan = plan_pipeline(config, profile(), runtime=False)
    assert plan.admitted
    stage = plan.stage("vad")
    held = {r.purpose: r for r in stage.reservations}
    stats = describe_graph(Path(stage.engine_kwargs["session"]["graph"]))
    assert stats.path.endswith("silero_vad/data/silero_vad.onnx")
    assert held["weights"].bytes == stats.initializer_bytes
    assert 2_100_000 < stats.initializer_bytes < 2_300_000 and stats.subgraph_node_count > 0
    assert held["ep_workspace"].bytes == ort_backends.workspace_bytes(
        "ort-cpu", stats.initializer_bytes
    )
    assert held["load_transient"].bytes == stats.file_bytes
    assert sorted(held) == ["activations", "ep_workspace", "load_transient", "weights"]
    kwargs = stage.engine_kwargs
    assert kwargs["session"]["providers"] == ["CPUExecutionProvider"]
    assert kwargs["segments"] == {
        "threshold": 0.5,
        "neg_threshold": None,
        "min_speech_ms": 250,
        "min_silence_ms": 400,
        "speech_pad_ms": 100,
        "max_segment_s": 30.0,
        "no_speech": "refuse",
    }


@needs_silero
def test_its_gate_is_the_exported_graphs(tmp_path: Path) -> None:
    config = config_of(tmp_path, artifact=OP18)
    kind, stage = get_kind("vad"), config.stage("vad")
    device = profile().device("cpu")
    assert device is not None
    (gate,) = kind.gate_specs(stage, kind.describe(stage), device, "ort-cpu")
    assert (gate.stage, gate.artifact_name, gate.precision, gate.backend) == (
        "vad",
        "silero-vad-op18",
        "fp32",
        "ort-cpu",
    )
    assert gate.session["graph"].endswith("silero_vad_op18_ifless.onnx")


@pytest.mark.parametrize(
    ("extra", "where", "what"),
    [
        (
            {"speech_pad_ms": 500, "min_silence_ms": 400},
            "stages[0]",
            "speech_pad_ms (500) must not exceed min_silence_ms (400)",
        ),
        ({"threshold": 1.5}, "stages[0].threshold", "less than 1"),
        (
            {"neg_threshold": 0.6},
            "stages[0]",
            "neg_threshold (0.6) must not exceed threshold (0.5)",
        ),
        ({"min_silence_ms": 10}, "stages[0].min_silence_ms", "greater than or equal to 32"),
        ({"window": 512}, "stages[0].window", ""),
    ],
)
def test_bad_settings_are_refused_where_they_are(
    tmp_path: Path, extra: dict[str, Any], where: str, what: str
) -> None:
    with pytest.raises(ConfigError) as err:
        config_of(tmp_path, **extra)
    text = str(err.value)
    assert where in text and what in text, text


@needs_silero
def test_an_artifact_that_is_not_a_vad_is_refused_naming_what_it_lacks(tmp_path: Path) -> None:
    config = config_of(tmp_path, artifact=REPO / "exports" / "piper-en-us-joe-medium")
    with pytest.raises(ConfigError) as err:
        get_kind("vad").describe(config.stage("vad"))
    text = str(err.value)
    assert "metadata: chunk_samples, context_samples missing" in text  # the voice has a sample_rate
    assert "a vad stage feeds input, sr, state and reads output, stateN" in text


@pytest.mark.parametrize(
    ("prompt", "what"),
    [
        ("hello", "the stage takes audio, got text"),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            "the stage takes audio, got a chat request",
        ),
        (
            {"audio": np.zeros(10, np.float32), "sample_rate": 0},
            "0 Hz: outside the 8000-192000 Hz that is read",
        ),
        (
            {"audio": np.zeros((2, 10), np.float32), "sample_rate": 16000},
            "one channel of at least one sample",
        ),
        (
            {"audio": np.zeros(0, np.float32), "sample_rate": 16000},
            "one channel of at least one sample",
        ),
    ],
)
def test_a_request_that_is_not_one_audio_item_is_refused_before_any_actor(
    tmp_path: Path, prompt: Any, what: str
) -> None:
    config = config_of(tmp_path)
    with pytest.raises(BadRequest) as err:
        get_kind("vad").validate_request(None, config.stage("vad"), as_request(prompt))  # type: ignore[arg-type]
    assert what in str(err.value) and "(stage vad, kind vad)" in str(err.value)
    get_kind("vad").validate_request(
        None,
        config.stage("vad"),
        as_request({"audio": np.ones(5, np.float32), "sample_rate": 8000}),
    )  # type: ignore[arg-type]


# -- OpenVINO: the plain graph refused by name, the CPU EP next; op18 chosen deliberately ----
def _ov_config(tmp_path: Path, artifact: Path) -> tuple[Path, Path]:
    if not OV_PYTHON.exists():
        pytest.skip("no OpenVINO route")
    import yaml

    config = tmp_path / "vad.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "vad-only",
                "stages": [{**vad_stage(artifact), "backends": ["ort-openvino", "ort-cpu"]}],
            }
        )
    )
    prof = tmp_path / "profile.json"
    prof.write_text(
        json.dumps(
            {
                "format": "omni-edge.profile/1",
                "name": "test box",
                "host": {"os": "linux", "ram_total_bytes": 2**34, "ram_available_bytes": 2**33},
                "devices": [
                    {
                        "id": "cpu",
                        "kind": "cpu",
                        "name": "test CPU",
                        "backends": ["ort-openvino", "ort-cpu"],
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
    return config, prof


@needs_silero
@pytest.mark.openvino
@pytest.mark.ort
def test_on_openvino_the_plain_graph_is_a_named_refusal_and_the_cpu_ep_runs_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, prof = _ov_config(tmp_path, PLAIN)
    code = main(["verify", str(config), "--profile", str(prof), "--json"])
    doc = json.loads(capsys.readouterr().out)
    results = {r["backend"]: r for r in doc["results"]}
    ov = results["ort-openvino"]
    assert ov["status"] == "refused"
    (refusal,) = ov["refusals"]
    assert refusal["code"] == RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH
    assert "could not build a session for silero-vad [fp32] on cpu" in refusal["message"]
    assert "dynamic rank" in refusal["message"]
    assert "failed to compile" in refusal["remedy"] and "ort-cpu" in refusal["remedy"]
    assert results["ort-cpu"]["status"] == "passed"
    assert doc["plan"]["stages"]["vad"] == {
        "device": "cpu",
        "backend": "ort-cpu",
        "verification": "verified",
    }
    assert code == 3  # verify's contract: at least one placement was refused
    # the refusal is evidence the planner reads back: the next plan takes the CPU EP at once
    assert main(["plan", str(config), "--profile", str(prof), "--json"]) == 0
    stage = json.loads(capsys.readouterr().out)["stages"][0]
    assert (stage["backend"], stage["verification"]["status"]) == ("ort-cpu", "verified")
    assert RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH in json.dumps(stage)


@needs_silero
@pytest.mark.openvino
@pytest.mark.ort
def test_on_openvino_the_op18_graph_chosen_deliberately_verifies(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, prof = _ov_config(tmp_path, OP18)
    assert main(["verify", str(config), "--profile", str(prof), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["stages"]["vad"] == {
        "device": "cpu",
        "backend": "ort-openvino",
        "verification": "verified",
    }


def _example_plan(tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    prof = tmp_path / "profile.json"
    prof.write_text(
        json.dumps(
            {**PROFILE, "devices": [{**PROFILE["devices"][0], "backends": ["ort-cpu", "vllm-cpu"]}]}
        )
    )
    code = main(["plan", str(config), "--profile", str(prof), "--json"])
    return code, capsys.readouterr()


def test_the_example_pipeline_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """configs/examples/voice-chat.yaml plans on a CPU-only box (vad, asr, thinker, voice)
    when Whisper's graphs are built (without them: the test below)."""
    if not (REPO / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file():
        pytest.skip("Whisper's graphs are not built: python -m exports.whisper_asr build")
    code, captured = _example_plan(tmp_path, REPO / "configs/examples/voice-chat.yaml", capsys)
    assert code == 0, captured.err
    doc = json.loads(captured.out)
    assert [(s["name"], s["kind"], s["backend"]) for s in doc["stages"]] == [
        ("vad", "vad", "ort-cpu"),
        ("asr", "asr", "ort-cpu"),
        ("thinker", "ar_decode", "vllm-cpu"),
        ("voice", "exported_graph", "ort-cpu"),
    ]


def test_the_example_pipeline_without_whisper_graphs_exits_2_naming_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example as shipped, its Whisper graphs pointed at directories nothing built."""
    example = REPO / "configs/examples/voice-chat.yaml"
    text = example.read_text().replace(
        "../../exports/whisper-tiny-en-", f"{tmp_path / 'never-built'}/whisper-tiny-en-"
    )
    config = tmp_path / "voice-chat.yaml"
    config.write_text(text.replace("../../exports/", f"{REPO / 'exports'}/"))
    code, captured = _example_plan(tmp_path, config, capsys)
    assert code == 2, (code, captured.err)
    assert "python -m exports.whisper_asr build" in captured.err, captured.err
    assert "Traceback" not in captured.err


def test_the_plan_shows_the_end_of_turn_delay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The silence that ends a spoken turn (the vad stage's min_silence_ms: what a /v1/realtime
    session waits before it answers) is a line under the stages table."""
    config = tmp_path / "p.yaml"
    config.write_text(
        json.dumps(
            {"name": "p", "stages": [vad_stage(PLAIN, min_silence_ms=550, speech_pad_ms=80)]}
        )
    )
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    assert main(["plan", str(config), "--profile", str(prof)]) == 0
    out = capsys.readouterr().out
    assert "End of turn: 550 ms of silence (vad min_silence_ms)" in " ".join(out.split())
