"""The audio forms the project writes and serves (orchestrator.runtime.audio)."""

from __future__ import annotations

import wave

import numpy as np
import pytest

from orchestrator.runtime.audio import (
    OPENAI_PCM_RATE,
    WavStreamWriter,
    pcm16_bytes,
    read_wav,
    resample,
    wav_header,
)


def _tone(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_pcm16_clips_and_is_little_endian() -> None:
    data = pcm16_bytes(np.array([0.0, 1.0, -1.0, 2.0, -3.0], dtype=np.float32))
    assert np.frombuffer(data, dtype="<i2").tolist() == [0, 32767, -32767, 32767, -32767]


def test_wav_header_known_and_streaming_lengths() -> None:
    known = wav_header(22050, 1000)
    assert len(known) == 44 and known[:4] == b"RIFF" and known[8:16] == b"WAVEfmt "
    assert (
        int.from_bytes(known[4:8], "little") == 1036
        and int.from_bytes(known[40:44], "little") == 1000
    )
    assert int.from_bytes(known[24:28], "little") == 22050
    streaming = wav_header(24000)
    assert streaming[4:8] == b"\xff\xff\xff\xff" and streaming[40:44] == b"\xff\xff\xff\xff"


def test_resample_keeps_duration_and_pitch() -> None:
    tone = _tone(1.0, 22050)
    out = resample(tone, 22050, OPENAI_PCM_RATE)
    assert out.dtype == np.float32 and abs(out.size - OPENAI_PCM_RATE) <= 2
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * OPENAI_PCM_RATE / out.size - 440.0) < 2.0
    assert (
        resample(tone, 22050, 22050) is not None and resample(tone, 22050, 22050).size == tone.size
    )


def test_stream_writer_is_a_valid_wav_after_every_chunk(tmp_path) -> None:
    target = tmp_path / "reply.wav"
    with WavStreamWriter(target, 22050) as w:
        for i in range(3):
            w.write(_tone(0.1, 22050))
            with wave.open(str(w.partial), "rb") as r:  # readable mid-stream, sizes current
                assert r.getnframes() == 2205 * (i + 1) and r.getframerate() == 22050
        assert not target.exists()  # the target appears only when complete
    audio, rate = read_wav(target)
    assert rate == 22050 and audio.size == 3 * 2205
    assert not w.partial.exists()


def test_stream_writer_leaves_nothing_on_failure(tmp_path) -> None:
    target = tmp_path / "reply.wav"
    with pytest.raises(RuntimeError), WavStreamWriter(target, 16000) as w:
        w.write(_tone(0.1, 16000))
        raise RuntimeError("the stage died")
    assert not target.exists() and not w.partial.exists()
    assert list(tmp_path.iterdir()) == []


def test_stream_writer_refuses_a_bad_rate(tmp_path) -> None:
    with pytest.raises(ValueError, match="sample rate"):
        WavStreamWriter(tmp_path / "x.wav", 0)
