"""What a request yields while it runs, and what it comes to at the end.

``Pipeline.stream()`` yields, in arrival order:

* :class:`TextDelta` — text from a final-output text stage, as decoded;
* :class:`AudioChunk` — audio from a final-output audio stage (one per
  speakable chunk, in order), float32 mono in [-1, 1];
* :class:`OutputItem` — any other final output;
* :class:`StageEvent` — a stage's first output (``first_output``) and its end
  (``done``, with its figures), for every stage.

``t`` is seconds since the request was submitted, on the caller's clock.
:class:`Result` is what ``Pipeline.run()`` returns: the joined text and audio
and per-stage figures; ``Result.save_wav(path)`` writes the audio as a WAV.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from orchestrator.core.documents import JsonObject
from orchestrator.runtime.audio import write_wav
from stages.payloads import Item


@dataclass(frozen=True)
class TextDelta:
    stage: str
    text: str
    request_id: str
    t: float


@dataclass(frozen=True)
class AudioChunk:
    stage: str
    audio: np.ndarray
    """float32, mono, [-1, 1]; read-only when it came from Ray's object store."""
    sample_rate: int
    index: int
    request_id: str
    t: float

    @property
    def seconds(self) -> float:
        return float(self.audio.shape[-1]) / self.sample_rate if self.sample_rate else 0.0


@dataclass(frozen=True)
class OutputItem:
    stage: str
    value: Item
    request_id: str
    t: float


@dataclass(frozen=True)
class StageEvent:
    stage: str
    kind: Literal["first_output", "done"]
    request_id: str
    t: float
    stats: dict[str, object] = field(default_factory=dict)
    """For ``done``: items, time to first output, duration, throughput and the
    stage's own figures (tokens and decode rate for a decode stage, seconds of
    audio and real-time factor for a TTS stage)."""


Event = TextDelta | AudioChunk | OutputItem | StageEvent


@dataclass
class Result:
    """One request, complete."""

    request_id: str
    prompt: str
    text: str
    audio: np.ndarray | None
    sample_rate: int | None
    stages: dict[str, dict[str, object]]
    """stage → figures from its ``done`` event."""
    time_to_first_token_s: float | None
    time_to_first_audio_s: float | None
    total_s: float
    chunks: list[str] = field(default_factory=list)
    """The speakable chunks the text was cut into, in order."""
    outputs: dict[str, list[Item]] = field(default_factory=dict)
    """stage → the items it yielded that are neither text nor audio (``OutputItem``: a graph's
    arrays, an Omni talker's codes), in order."""

    @property
    def audio_seconds(self) -> float:
        if self.audio is None or not self.sample_rate:
            return 0.0
        return float(self.audio.shape[-1]) / self.sample_rate

    def save_wav(self, path: str | Path) -> Path:
        """Write the audio as a 16-bit PCM mono WAV at its own sample rate; returns the path.

        Raises ``ValueError`` when the request produced no audio: a reply with
        nothing speakable in it (no letter or digit) reaches no TTS, and an
        empty file would pass for a recording."""
        if self.audio is None or not self.sample_rate:
            raise ValueError(
                f"request {self.request_id} produced no audio (reply text: {self.text!r}); nothing to write to {path}"
            )
        return write_wav(path, self.audio, self.sample_rate)

    def summary(self) -> JsonObject:
        """Plain data for the run record (no arrays)."""
        return {
            "request_id": self.request_id,
            "prompt": self.prompt,
            "text": self.text,
            "chunks": self.chunks,
            "audio_seconds": round(self.audio_seconds, 3),
            "sample_rate": self.sample_rate,
            "time_to_first_token_s": _r(self.time_to_first_token_s),
            "time_to_first_audio_s": _r(self.time_to_first_audio_s),
            "total_s": _r(self.total_s),
            "stages": self.stages,
        }


def collect(request_id: str, prompt: str, events: list[Event], total_s: float) -> Result:
    """Fold a request's events into a :class:`Result`."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    audio_events = [e for e in events if isinstance(e, AudioChunk)]
    audio = (
        np.concatenate([np.asarray(e.audio, dtype=np.float32).reshape(-1) for e in audio_events])
        if audio_events
        else None
    )
    rate = audio_events[0].sample_rate if audio_events else None
    stages = {e.stage: e.stats for e in events if isinstance(e, StageEvent) and e.kind == "done"}
    first_text = next((e.t for e in events if isinstance(e, TextDelta)), None)
    first_audio = audio_events[0].t if audio_events else None
    chunks = [str(c) for s in stages.values() for c in _list(s.get("chunks_in"))]
    outputs: dict[str, list[Item]] = {}
    for e in events:
        if isinstance(e, OutputItem):
            outputs.setdefault(e.stage, []).append(e.value)
    return Result(
        request_id,
        prompt,
        text,
        audio,
        rate,
        stages,
        first_text,
        first_audio,
        total_s,
        chunks,
        outputs,
    )


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
