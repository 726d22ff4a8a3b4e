"""The default pipeline's TTS artifact: espeak-ng phonemes → ids, and real audio on ort-cpu."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exports import piper_voice
from orchestrator.config import load_config
from orchestrator.planner import plan_pipeline
from stages.exported_graph.artifact import load_artifact
from stages.exported_graph.kind import ExportedGraphConfig, ExportedGraphKind
from tests.helpers.graphs import REPO, machine_profile

ARTIFACT = REPO / "exports" / "piper-en-us-joe-medium"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))


def test_phonemes_keep_clause_punctuation_like_piper() -> None:
    assert piper_voice.phonemize("Hello, world.") == "həlˈoʊ, wˈɜːld."


def test_preprocess_maps_phonemes_through_the_voice_id_map() -> None:
    id_map = piper_voice.voice_config()["phoneme_id_map"]
    feeds = piper_voice.preprocess("Hello, world.")
    ids = feeds["input"][0].tolist()
    assert feeds["input"].dtype == np.int64 and feeds["input"].shape == (1, len(ids))
    assert feeds["input_lengths"].tolist() == [len(ids)]
    # BOS, pad, then phoneme/pad pairs, then EOS
    assert ids[:2] == id_map["^"] + id_map["_"] and ids[-1:] == id_map["$"]
    assert ids[1:-1:2] == [id_map["_"][0]] * len(ids[1:-1:2])
    assert ids[2] == id_map["h"][0] and ids[4] == id_map["ə"][0]
    assert id_map[","][0] in ids and id_map["."][0] in ids
    # default scales come from the voice's json: noise_scale, length_scale, noise_w
    assert feeds["scales"].tolist() == pytest.approx([0.667, 1.0, 0.8])


def test_deterministic_switch_zeroes_the_noise_only(monkeypatch) -> None:
    monkeypatch.setenv(piper_voice.DETERMINISTIC_ENV, "1")
    assert piper_voice.preprocess("Hello, world.")["scales"].tolist() == [0.0, 1.0, 0.0]


def test_the_shipped_artifact_matches_its_graph_and_its_reference_is_deterministic() -> None:
    art = load_artifact(ARTIFACT)
    assert art.graph_path("fp32").name == "en_US-joe-medium.onnx"
    info = ExportedGraphKind().describe(
        ExportedGraphConfig(
            name="voice", kind="exported_graph", devices=["cpu"], artifact=str(ARTIFACT)
        )
    )
    g = info.details["precisions"]["fp32"]
    assert g["node_count"] == 2755 and g["initializer_bytes"] == 62_602_544
    ref = art.reference_inputs()
    assert ref["scales"].tolist() == [0.0, 1.0, 0.0]  # noise off: the output is deterministic
    assert (
        ref["input"][0].tolist()
        == piper_voice.preprocess(piper_voice.REFERENCE_TEXT)["input"][0].tolist()
    )


async def _items(*values: Any) -> AsyncIterator[Any]:
    for v in values:
        yield v


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [x async for x in stream]


@pytest.mark.ort
def test_the_voice_synthesizes_non_silent_audio_on_ort_cpu() -> None:
    config = load_config(REPO / "configs" / "voice-assistant.yaml")
    # the default pipeline's voice stage, alone and pinned to the CPU EP in this interpreter
    voice = config.stage("voice").model_copy(
        update={"backends": ["ort-cpu"], "inputs": ["request"]}
    )
    config = config.model_copy(update={"stages": [voice]})
    plan = plan_pipeline(config, machine_profile(), runtime=False)
    stage_plan = plan.stage("voice")
    assert (stage_plan.device, stage_plan.backend, stage_plan.route) == (
        "cpu",
        "ort-cpu",
        "this-process",
    )
    runner = ExportedGraphKind().runner(stage_plan, voice)
    runner.load()
    try:
        (out,) = asyncio.run(_collect(runner.stream("r", _items("Hello from the voice stage."))))
    finally:
        runner.close()
    audio, rate = out["audio"], out["sample_rate"]
    assert rate == 22050 and audio.dtype == np.float32 and audio.ndim == 1
    seconds = audio.size / rate
    assert 0.8 < seconds < 5.0
    rms = float(np.sqrt(np.mean(audio**2)))
    assert rms > 0.01, f"silent: rms {rms}"
    assert np.max(np.abs(audio)) < 1.5


def test_the_first_phonemizations_racing_in_threads_all_succeed() -> None:
    """Requests arrive at once on a threaded actor: the engine is built once, not once
    per thread (a second espeak_Initialize undid the first's voice: 'no voice en-us')."""
    import subprocess
    import sys

    script = (
        "import threading\n"
        "from exports import piper_voice\n"
        "errors = []\n"
        "def one(i):\n"
        "    try:\n"
        "        assert piper_voice.phonemize(f'Number {i}.')\n"
        "    except Exception as exc:\n"
        "        errors.append(repr(exc))\n"
        "ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(len(errors), errors[:1])\n"
    )
    for _ in range(3):  # a fresh process each time: the race is on first use
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout
        assert out.startswith("0 "), out
