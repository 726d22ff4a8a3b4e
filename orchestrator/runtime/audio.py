"""Writing and checking audio: stdlib ``wave``, 16-bit PCM, mono."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> Path:
    """Write float audio in [-1, 1] as 16-bit mono PCM at ``sample_rate``; values
    outside [-1, 1] are clipped. Returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    pcm = (np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0) * 32767.0).astype("<i2")
    with wave.open(str(p), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm.tobytes())
    return p


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """(float32 samples in [-1, 1], sample rate) of a 16-bit mono WAV."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono PCM, got {w.getsampwidth() * 8}-bit × {w.getnchannels()} channels")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return data.astype(np.float32) / 32767.0, w.getframerate()


def rms_dbfs(audio: np.ndarray) -> float:
    """Loudness as RMS in dBFS (-inf for digital silence)."""
    a = np.asarray(audio, dtype=np.float64).reshape(-1)
    if a.size == 0:
        return float("-inf")
    rms = float(np.sqrt(np.mean(a * a)))
    return 20.0 * float(np.log10(rms)) if rms > 0 else float("-inf")
