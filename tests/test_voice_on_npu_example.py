"""configs/examples/voice-on-npu.yaml on the shipped WSL host-process profile: the thinker on
the RTX GPU through vLLM in WSL2, the voice's int8 graph on the XDNA NPU through the
Windows-side Ryzen AI interpreter — and the default pipeline, whose voice has only fp32,
where it was (the iGPU there, fp32 here).

The int8 voice is generated (``python -m exports.piper_voice build``, scripts/bootstrap.sh);
where this CPU measured it over the exporter's ceiling these tests skip as a capability the
machine lacks, and only then (tests/helpers/generated.py).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from exports.piper_voice import INT8_ARTIFACT_DIR
from orchestrator.cli import main
from stages.exported_graph.artifact import load_artifact
from stages.exported_graph.graph_stats import describe_graph
from tests.helpers import REPO
from tests.helpers.generated import int8_voice_skip

EXAMPLE = REPO / "configs/examples/voice-on-npu.yaml"
DEFAULT = REPO / "configs/voice-assistant.yaml"
HOSTPROC = REPO / "configs/profiles/strix-point-rtx5090-wsl-hostproc.json"
CPU_ONLY = REPO / "configs/profiles/cpu-only-linux.json"

needs_int8_voice = pytest.mark.skipif(int8_voice_skip() is not None, reason=str(int8_voice_skip()))
"""Skips as a capability only where this machine's build measured the int8 voice over the
exporter's ceiling, as missing where the build failed otherwise (tests/helpers/generated.py);
an artifact never built fails the test."""


@pytest.fixture(autouse=True)
def empty_evidence_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))


def _plan(config: Path, profile: Path) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", str(config), "--profile", str(profile), "--json"])
    return code, {s["name"]: s for s in json.loads(out.getvalue())["stages"]}


def _routes(profile: Path) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in json.loads(profile.read_text())["routes"]}


@needs_int8_voice
def test_the_thinker_on_the_gpu_and_the_voice_on_the_npu_through_the_host_process() -> None:
    code, stages = _plan(EXAMPLE, HOSTPROC)
    assert code == 0
    thinker, voice = stages["thinker"], stages["voice"]
    assert (thinker["device"], thinker["backend"], thinker["route"]) == (
        "gpu:0",
        "vllm-cuda",
        "this-process",
    )
    assert (voice["device"], voice["backend"], voice["route"]) == (
        "npu:0",
        "ort-vitisai",
        "windows-ryzen-ai",
    )
    assert voice["engine_kwargs"]["precision"] == "int8"
    assert voice["engine_kwargs"]["session"]["graph"].endswith(
        "piper-en-us-joe-medium-int8/int8.onnx"
    )
    route = _routes(HOSTPROC)["windows-ryzen-ai"]
    assert route["kind"] == "host-process" and route["python"].endswith("python.exe")
    # never verified here: the gates decide on the laptop
    assert voice["verification"]["status"] == "unverified"


def test_the_default_pipeline_keeps_its_fp32_voice() -> None:
    """The default's voice artifact has only fp32: on the host-process profile VitisAI cannot
    take it (the iGPU through DirectML does), and on a CPU machine it runs fp32 as before."""
    code, stages = _plan(DEFAULT, HOSTPROC)
    assert code == 0
    voice = stages["voice"]
    assert (voice["device"], voice["backend"], voice["route"]) == (
        "igpu:0",
        "ort-dml",
        "windows-directml",
    )
    assert voice["engine_kwargs"]["precision"] == "fp32"
    npu = [r for r in voice["refusals"] if r["device"] == "npu:0"]
    assert npu and "fp32" in npu[0]["message"] and "int8" in npu[0]["message"]
    _, here = _plan(DEFAULT, CPU_ONLY)
    assert (
        here["voice"]["device"] == "cpu" and here["voice"]["engine_kwargs"]["precision"] == "fp32"
    )
    assert "piper-en-us-joe-medium-int8" not in json.dumps(here)


@needs_int8_voice
def test_the_int8_voice_quantizes_the_decoder_only_and_keeps_fp32_tight() -> None:
    artifact = load_artifact(INT8_ARTIFACT_DIR)
    m = artifact.manifest
    assert list(m.precisions) == ["fp32", "int8"]
    # each precision judged by its own tolerance: fp32 at the format's default, int8 looser
    assert m.tolerance_for("fp32").rel_l2 == 1e-3
    assert m.tolerance_for("int8").rel_l2 > m.tolerance_for("fp32").rel_l2
    measured = m.metadata["export"]["precisions"]["int8"]["measured_on_cpu_ep"]
    assert measured["rel_l2"] <= 0.05 and measured["cosine"] >= 0.995  # the exporter's int8 ceiling
    hist = describe_graph(artifact.graph_path("int8"), use_cache=False).op_histogram
    assert hist.get("QuantizeLinear", 0) > 0 and hist.get("DequantizeLinear", 0) > 0
    assert "/dec/" in m.source.notes and "uint16" in m.source.notes
