"""The asr runner hears what the Piper voice said: one transcript per audio item, in order,
whatever the sample rate (soxr to 16 kHz), through the project's session host (CPU EP, this
process) — and, through Ray, a one-stage pipeline takes an audio request.

The speech is built here (the project's own voice, noise 0), so the bound is a property of
the input: WER ≤ 0.35 leaves room for another CPU's near-tie tokens, never exact words.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr
import yaml

from exports.whisper_asr import word_error_rate
from orchestrator.config import parse_config
from orchestrator.core.errors import BadRequest, StageFailed
from orchestrator.planner import plan_pipeline
from stages.base import StageRunner
from stages.registry import get_kind
from tests.helpers.graphs import REPO
from tests.helpers.speech import speak
from tests.stages.asr.test_kind import PROFILE, asr_stage, profile

pytestmark = [pytest.mark.slow, pytest.mark.ort]

SENTENCES = (
    "Please turn off the lights in the kitchen before you go to bed.",
    "The weather is nice today, so we will walk to the park after lunch.",
)
WER_BOUND = 0.35


async def _items(*values: Any) -> AsyncIterator[Any]:
    for v in values:
        yield v


def _transcripts(runner: StageRunner, *items: Any) -> list[Any]:
    async def main() -> list[Any]:
        return [x async for x in runner.stream("r1", _items(*items))]

    return asyncio.run(main())


@pytest.fixture(scope="module")
def runner(
    whisper_graphs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StageRunner]:
    base = tmp_path_factory.mktemp("asr")
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs)]}, where="t.yaml", base_dir=base
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    r = get_kind("asr").runner(plan.stage("asr"), config.stage("asr"))
    r.load()
    yield r
    r.close()


def test_each_audio_item_yields_its_transcript_in_order_at_any_rate(runner: StageRunner) -> None:
    """Two sentences (22 050 Hz as Piper speaks, and the second resampled to 44 100 Hz) and
    an empty item: three transcripts, the empty one empty."""
    (first, rate), (second, _) = speak(SENTENCES[0]), speak(SENTENCES[1])
    assert rate == 22050
    doubled = soxr.resample(second, rate, 44100).astype(np.float32)
    heard = _transcripts(
        runner,
        {"audio": first, "sample_rate": rate},
        {"audio": np.zeros(0, dtype=np.float32), "sample_rate": 16000},
        {"audio": doubled, "sample_rate": 44100},
    )
    assert len(heard) == 3 and all(isinstance(t, str) for t in heard)
    assert word_error_rate(SENTENCES[0], heard[0]) <= WER_BOUND, heard[0]
    assert heard[1] == ""
    assert word_error_rate(SENTENCES[1], heard[2]) <= WER_BOUND, heard[2]
    assert heard[2].startswith(" ") and not heard[0].startswith(
        " "
    )  # deltas: joined, they read as one text


def test_a_window_stops_at_max_new_tokens(whisper_graphs: dict[str, Path], tmp_path: Path) -> None:
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs, max_new_tokens=3)]},
        where="t.yaml",
        base_dir=tmp_path,
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    r = get_kind("asr").runner(plan.stage("asr"), config.stage("asr"))
    r.load()
    try:
        audio, rate = speak(SENTENCES[0])
        (heard,) = _transcripts(r, {"audio": audio, "sample_rate": rate})
    finally:
        r.close()
    assert 1 <= len(heard.split()) <= 3, heard  # three tokens: at most three words


@pytest.mark.parametrize(
    ("item", "why"),
    [
        ("hello", "takes audio items"),
        ({"audio": np.zeros((2, 100), dtype=np.float32), "sample_rate": 16000}, "must be mono"),
        (
            {"audio": np.zeros(100, dtype=np.float32), "sample_rate": 0},
            "sample_rate: 0 Hz: outside the 8000-192000 Hz",
        ),
    ],
)
def test_a_bad_item_fails_the_request_naming_the_stage(
    runner: StageRunner, item: Any, why: str
) -> None:
    with pytest.raises(StageFailed) as err:
        _transcripts(runner, item)
    assert err.value.stage == "asr" and err.value.device == "cpu"
    assert why in str(err.value)


@pytest.mark.ray
def test_a_one_stage_pipeline_transcribes_an_audio_request(
    whisper_graphs: dict[str, Path],
    ray_cluster: Any,
    tmp_path: Path,
) -> None:
    """Through Ray, as ``omni-edge run`` would: plan, verify the decoder's gate, start, one request."""
    import json

    from orchestrator.api import Pipeline

    config = tmp_path / "asr.yaml"
    config.write_text(yaml.safe_dump({"name": "asr-only", "stages": [asr_stage(whisper_graphs)]}))
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    audio, rate = speak(SENTENCES[0])
    with Pipeline.from_config(config, profile=prof, record=None) as pipeline:
        stage = pipeline.plan.stage("asr")
        assert stage.verification is not None and stage.verification.status == "verified"
        with pytest.raises(BadRequest, match="takes audio, got text"):
            pipeline.run("hello", record=False)
        result = pipeline.run({"audio": audio, "sample_rate": rate}, record=False)
    assert word_error_rate(SENTENCES[0], result.text) <= WER_BOUND, result.text


@pytest.mark.openvino
def test_in_the_openvino_route_both_sessions_run_in_its_worker(
    whisper_graphs: dict[str, Path],
    tmp_path: Path,
) -> None:
    """Verified first (both gates, in the route), then run there: the sessions live in the
    route's worker process, and the sentence is still heard."""
    import os

    from orchestrator.verify.run import verify_pipeline
    from tests.helpers.graphs import OV_PYTHON, machine_profile

    if not OV_PYTHON.exists():
        pytest.skip("no OpenVINO route")
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs, backends=["ort-openvino"])]},
        where="t.yaml",
        base_dir=tmp_path,
    )
    prof = machine_profile()
    assert [r.status for r in verify_pipeline(config, prof).results] == ["passed", "passed"]
    stage = plan_pipeline(config, prof, runtime=False).stage("asr")
    assert (stage.backend, stage.route) == ("ort-openvino", "openvino")
    assert stage.verification is not None and stage.verification.status == "verified"
    r = get_kind("asr").runner(stage, config.stage("asr"))
    r.load()
    try:
        assert r._host.pid != os.getpid()
        assert [r.load_info[g]["providers"][0] for g in ("encoder", "decoder")] == [
            "OpenVINOExecutionProvider"
        ] * 2
        audio, rate = speak(SENTENCES[1])
        (heard,) = _transcripts(r, {"audio": audio, "sample_rate": rate})
    finally:
        r.close()
    assert word_error_rate(SENTENCES[1], heard) <= WER_BOUND, heard


@pytest.mark.ray
def test_the_voice_feeding_the_recogniser_round_trips_a_text(
    whisper_graphs: dict[str, Path],
    ray_cluster: Any,
    tmp_path: Path,
) -> None:
    """voice (Piper, text → audio per sentence) → asr (audio → text), through Ray: an audio edge
    between two stages. One transcript per audio item the voice yields, and the words come back.

    The voice runs with its shipped noise scales (the actors' environment is the cluster's), so
    the bound is the loose one; two sentences, 27 words: up to 9 may differ."""
    import json

    from orchestrator.api import Pipeline

    voice = {
        "name": "voice",
        "kind": "exported_graph",
        "artifact": str(REPO / "exports/piper-en-us-joe-medium"),
        "devices": ["cpu"],
        "backends": ["ort-cpu"],
        "precision": ["fp32"],
    }
    config = tmp_path / "round-trip.yaml"
    config.write_text(
        yaml.safe_dump(
            {"name": "round-trip", "stages": [voice, asr_stage(whisper_graphs, inputs=["voice"])]}
        )
    )
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    said = " ".join(SENTENCES)
    with Pipeline.from_config(config, profile=prof, record=None) as pipeline:
        result = pipeline.run(said, record=False)
    assert (
        result.stages["asr"]["items"] == result.stages["voice"]["items"] >= 1
    )  # a transcript per audio item
    assert word_error_rate(said, result.text) <= WER_BOUND, result.text


def test_a_cancelled_request_stops_the_transcribing_thread(runner: StageRunner) -> None:
    """``stream`` runs ``transcribe`` in a thread and sets the request's cancel flag when it
    ends early; the thread checks it between resampling blocks and between windows."""
    import threading

    from stages.audio_items import Cancelled

    said, rate = speak(SENTENCES[0])
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        runner.transcribe({"audio": said, "sample_rate": rate}, cancel)  # type: ignore[attr-defined]
    assert (
        word_error_rate(
            SENTENCES[0],
            runner.transcribe(
                {"audio": said, "sample_rate": rate},  # type: ignore[attr-defined]
                threading.Event(),
            ),
        )
        <= WER_BOUND
    )
