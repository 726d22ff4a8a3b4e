"""The tiny Omni checkpoints end to end on Ray: text in → the thinker's text, the talker's
codec codes and the audio out, through the Python API (Qwen2.5-Omni, its token2wav stage) and
``omni-edge run`` (Qwen3-Omni, its code2wav stage).

Thinker and talker run on the transformers backend in the CPU's device actor; the thinker's
hand-over reaches the talker through the runtime's ``all`` join in the driver (Ray's object
transport both ways). Compared with transformers' own ``generate()`` on the same weights,
computed in the same test (greedy, fp32): identical text and codes, the audio within the
exported graphs' gate tolerance (Qwen2.5-Omni's token2wav from the same seeded noise). A
request cancelled while the talker is generating frees every stage."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from exports import omni_tiny
from tests.helpers import REPO
from tests.helpers.omni_reference import reference, torch_threads
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROMPT = "Hello there"
TALKER_CODES = 600
"""The Qwen2.5 talker's min_tokens = max_tokens: long by construction, so a request cancelled
after its first code is cancelled mid-talker whatever the CPU's speed."""


@pytest.fixture(scope="module", autouse=True)
def tiny_checkpoints() -> None:
    omni_tiny.ensure_built()


def _config(tmp_path: Path, name: str, **talker_sampling: Any) -> Path:
    doc = yaml.safe_load((REPO / f"configs/examples/{name}.yaml").read_text())
    for stage in doc["stages"]:
        for key in (
            "model",
            "artifact",
            "dit",
            "vocoder",
        ):  # paths relative to the example's directory
            if key in stage:
                stage[key] = str((REPO / "configs/examples" / stage[key]).resolve())
        if stage["name"] == "talker":
            stage["sampling"].update(talker_sampling)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_qwen2_5_omni_through_the_python_api_matches_transformers_and_a_cancel_frees_every_stage(
    ray_cluster: Any, tmp_path: Path
) -> None:
    import numpy as np
    import ray

    from exports import qwen2_5_omni_token2wav
    from orchestrator.api import Pipeline
    from orchestrator.runtime.events import AudioChunk, OutputItem, StageEvent, TextDelta

    qwen2_5_omni_token2wav.ensure_built()  # bootstrap builds it; again if the checkpoint changed since
    config = _config(
        tmp_path, "qwen2_5-omni-tiny", min_tokens=TALKER_CODES, max_tokens=TALKER_CODES
    )
    pipeline = Pipeline.from_config(config, record=tmp_path / "runs", calibration=False)
    try:
        assert {s.name: s.backend for s in pipeline.plan.stages} == {
            "thinker": "transformers-cpu",
            "talker": "transformers-cpu",
            "token2wav": "ort-cpu",
        }

        async def whole() -> list[Any]:
            return [e async for e in pipeline.stream(PROMPT)]

        async def cancelled() -> float:
            stream = pipeline.stream(PROMPT, request_id="cancelled")
            async for event in stream:
                if isinstance(event, OutputItem) and event.stage == "talker":
                    break  # mid-talker: one code of 600
            await stream.aclose()
            left = time.perf_counter()
            while pipeline.runtime.admission.in_flight:
                assert time.perf_counter() - left < 10, (
                    "the request still held its slot 10 s after it was cancelled"
                )
                await asyncio.sleep(0.01)
            return time.perf_counter() - left

        def stopped() -> bool:
            """Every actor has ended the cancelled request's work (its talker's stream ends once
            the generation let go of the model), so the next request cannot find it busy."""
            actors = [d.actor for d in pipeline.runtime.devices.values()]
            return not any(ray.get([a.pending.remote("cancelled") for a in actors]))

        events = asyncio.run(whole())
        freed_s = asyncio.run(cancelled())
        wait_until(stopped, "the cancelled request's work stopped on every actor")
        after = asyncio.run(whole())
    finally:
        pipeline.close()
    assert pipeline.final_ledger is not None and not pipeline.final_ledger.get("held_bytes")
    # generate()'s own token2wav from the noise the stage draws (seed 0, the config's), 10 time points
    ref = reference(
        omni_tiny.QWEN2_5_OMNI_DIR,
        PROMPT,
        threads=torch_threads(pipeline.plan.to_json()["stages"]),
        thinker_max=24,
        talker_max=TALKER_CODES,
        talker_min=TALKER_CODES,
        token2wav_seed=0,
        token2wav_steps=10,
    )
    text = "".join(e.text for e in events if isinstance(e, TextDelta) and e.stage == "thinker")
    codes = [list(e.value) for e in events if isinstance(e, OutputItem) and e.stage == "talker"]
    assert text == ref.text and codes == ref.codes and len(codes) == TALKER_CODES
    # the audio: one 24 kHz item of 2 mel frames a code, 240 samples a frame, within the graphs' gate
    (audio,) = [e for e in events if isinstance(e, AudioChunk) and e.stage == "token2wav"]
    assert audio.sample_rate == 24000 and audio.audio.shape[-1] == TALKER_CODES * 2 * 240 == len(
        ref.waveform
    )
    got, want = np.asarray(audio.audio, dtype=np.float32).reshape(-1), ref.waveform
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert float(np.abs(want).max()) > 0 and rel <= 1e-3, rel
    print(f"token2wav on Ray vs generate(): {len(got)} samples, rel L2 {rel:.2e}")
    done = {e.stage: e.stats for e in events if isinstance(e, StageEvent) and e.kind == "done"}
    # the hand-over crossed Ray: one item per thinker step, [tokens, 64] float32, joined whole
    assert done["talker"]["hidden_states"] == {
        "steps": len(ref.tokens),
        "tokens": len(ref.prompt_ids) + len(ref.tokens) - 1,
        "width": 64,
        "dtype": "float32",
        "layer": -1,
    }
    assert done["talker"]["join"]["received"] == {
        "thinker.hidden_states": len(ref.tokens),
        "thinker.text": 1,
    }
    assert (
        done["thinker"]["edges_out"]["talker"]["items"] == len(ref.tokens) + 1
    )  # + the text, whole
    # after the cancel: the next request ran every stage, and its talker did not wait for the cancelled one
    stats = {e.stage: e.stats for e in after if isinstance(e, StageEvent) and e.kind == "done"}
    assert set(stats) == {"thinker", "talker", "token2wav"}
    assert stats["talker"]["waited_for_previous"] is False
    assert stats["talker"]["aborted_before"]["requests"] == 1
    assert stats["talker"]["aborted_before"]["last_tokens"] < TALKER_CODES
    assert [
        list(e.value) for e in after if isinstance(e, OutputItem) and e.stage == "talker"
    ] == ref.codes
    print(
        f"cancelled mid-talker after {stats['talker']['aborted_before']['last_tokens']} of {TALKER_CODES} codes; "
        f"slot free {freed_s * 1000:.0f} ms after the cancel"
    )


def test_qwen3_omni_through_omni_edge_run_matches_transformers(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Text, codes and audio: thinker → talker → the exported code2wav, chunked, against
    transformers' ``generate()`` (which runs the checkpoint's own code2wav on the same codes)."""
    import wave

    import numpy as np

    from exports import qwen3_omni_code2wav

    if not (qwen3_omni_code2wav.ARTIFACT_DIR / "manifest.yaml").is_file():  # bootstrap builds it
        assert qwen3_omni_code2wav.build() == 0
    config = REPO / "configs/examples/qwen3-omni-tiny.yaml"
    out_wav = tmp_path / "reply.wav"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            str(config),
            "--prompt",
            PROMPT,
            "--json",
            "--record",
            str(tmp_path / "run.json"),
            "--no-calibration",
            "--out",
            str(out_wav),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    stages = yaml.safe_load(config.read_text())["stages"]
    record = json.loads((tmp_path / "run.json").read_text())
    ref = reference(
        omni_tiny.QWEN3_OMNI_DIR,
        PROMPT,
        threads=torch_threads(record["plan"]["stages"]),
        thinker_max=stages[0]["sampling"]["max_tokens"],
        talker_max=stages[1]["sampling"]["max_tokens"],
    )
    assert out["texts"]["thinker"] == ref.text
    assert out["outputs"]["talker"] == ref.codes  # one frame per item: every codebook's code
    assert {len(frame) for frame in out["outputs"]["talker"]} == {omni_tiny.Q3_CODE_GROUPS}
    assert [s["backend"] for s in out["stages"]] == [
        "transformers-cpu",
        "transformers-cpu",
        "ort-cpu",
    ]
    # the audio: 16-bit PCM of code2wav's chunks, against transformers' float waveform — within the
    # artifact's gate tolerance plus half a 16-bit step of rounding
    with wave.open(str(out_wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32767
    want = np.clip(ref.waveform, -1, 1)
    assert pcm.shape == want.shape and len(pcm) > 0
    assert float(np.max(np.abs(pcm - want))) <= 1e-3 + 1 / 32767
    assert float(np.linalg.norm(pcm - want) / np.linalg.norm(want)) <= 1e-3
    assert record["output"]["outputs"]["talker"] == ref.codes
    talker = record["requests"][0]["stages"]["talker"]
    assert talker["hidden_states"]["width"] == 64 and talker["hidden_states"]["layer"] == 1
    assert f"talker: {len(ref.codes)} items (token_ids)" in proc.stderr
