"""Audio in the forms the project writes and serves: 16-bit PCM, mono.

* ``write_wav``/``read_wav``: a whole WAV file (stdlib ``wave``).
* ``WavStreamWriter``: a WAV written while audio is still being made — the file
  is a valid WAV after every ``write`` (header sizes rewritten), under a
  temporary name of its own next to the target (one per writer: two runs with
  the same ``--out`` never write into one file) that is fsynced and renamed on
  ``close``; a failure (``discard``, or leaving the ``with`` block by an
  exception) leaves no target. Two writers of one target: the last to close
  replaces the other's whole file (each knows the SHA-256 of what it wrote, and
  is told at ``close`` when another is still writing).
* ``pcm16_bytes``, ``wav_header``, ``resample``: the pieces an HTTP response
  streams (OpenAI's ``pcm`` audio is 24 kHz, 16-bit, mono, little-endian:
  ``OPENAI_PCM_RATE``).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import wave
from pathlib import Path
from types import TracebackType

import numpy as np
import soxr

from orchestrator.core.fileio import (
    ORPHAN_NAME,
    fsync_directory,
    make_directories,
    open_exclusive,
    remove_orphans,
    temp_name,
    write_bytes_atomic,
    writer_gone,
)

OPENAI_PCM_RATE = 24000
"""The sample rate of OpenAI's ``pcm``/``pcm16`` audio (16-bit mono little-endian)."""
WAV_HEADER_BYTES = 44
_UNKNOWN = 0xFFFFFFFF


def pcm16_bytes(audio: np.ndarray) -> bytes:
    """Float audio in [-1, 1] as 16-bit little-endian mono PCM; values outside are clipped."""
    a = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (a * 32767.0).astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """The 44-byte RIFF header of a 16-bit mono WAV holding ``data_bytes`` of PCM.
    ``None``: length unknown (both sizes 0xFFFFFFFF, the streaming form that
    browsers and ffmpeg read to the end of the stream)."""
    rate = int(sample_rate)
    data = _UNKNOWN if data_bytes is None else int(data_bytes)
    riff = _UNKNOWN if data_bytes is None else 36 + data
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``audio`` at ``from_rate`` converted to ``to_rate`` (float32; soxr's high quality).
    Each call is independent: resample whole chunks, not sample by sample."""
    a = np.asarray(audio, dtype=np.float32).reshape(-1)
    if int(from_rate) == int(to_rate) or a.size == 0:
        return a
    return np.asarray(
        soxr.resample(a, int(from_rate), int(to_rate), quality="HQ"), dtype=np.float32
    )


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> Path:
    """Write float audio in [-1, 1] as 16-bit mono PCM at ``sample_rate``, atomically and
    durably (``fileio.write_bytes_atomic``); values outside [-1, 1] are clipped. Returns the path."""
    p = Path(path)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm16_bytes(audio))
    write_bytes_atomic(p, buffer.getvalue())
    return p


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """(float32 samples in [-1, 1], sample rate) of a 16-bit mono WAV."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(
                f"{path}: expected 16-bit mono PCM, got {w.getsampwidth() * 8}-bit × {w.getnchannels()} channels"
            )
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return data.astype(np.float32) / 32767.0, w.getframerate()


def rms_dbfs(audio: np.ndarray) -> float:
    """Loudness as RMS in dBFS (-inf for digital silence)."""
    a = np.asarray(audio, dtype=np.float64).reshape(-1)
    if a.size == 0:
        return float("-inf")
    rms = float(np.sqrt(np.mean(a * a)))
    return 20.0 * float(np.log10(rms)) if rms > 0 else float("-inf")


class WavStreamWriter:
    """A 16-bit mono WAV at ``path``, written chunk by chunk (see the module docstring).

    The temporary file is ``.<name>.<pid>.<hex>.partial`` in the target's folder, made
    with ``O_EXCL`` and ``O_NOFOLLOW`` (never another writer's file, never through a
    planted symlink) and held locked while it is written, so the rename on ``close`` is
    atomic and a partial file whose writer was killed is removed by the next writer of
    that target (``fileio.remove_orphans``). ``samples``/``seconds``: what has been
    written so far; after ``close``, ``sha256`` and ``bytes`` of the file it put at
    ``path``, and ``others_writing``: the process ids of other writers of ``path``
    still writing then (the last to close replaces this file)."""

    def __init__(self, path: str | Path, sample_rate: int) -> None:
        self.path = Path(path)
        self.sample_rate = int(sample_rate)
        if self.sample_rate <= 0:
            raise ValueError(f"sample rate must be positive, got {sample_rate}")
        make_directories(self.path.parent)
        remove_orphans(self.path.parent, name=self.path.name)
        self.partial = temp_name(self.path, "partial")
        self._file = os.fdopen(open_exclusive(self.partial, readable=True), "w+b")
        self._file.write(wav_header(self.sample_rate, 0))
        self._file.flush()
        self.samples = 0
        self.sha256: str | None = None
        self.bytes = 0
        self.others_writing: list[int] = []

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate

    def write(self, audio: np.ndarray) -> None:
        """Append ``audio`` (float in [-1, 1]) and rewrite the header's sizes."""
        data = pcm16_bytes(audio)
        self._file.seek(0, os.SEEK_END)
        self._file.write(data)
        self.samples += len(data) // 2
        self._file.seek(0)
        self._file.write(wav_header(self.sample_rate, self.samples * 2))
        self._file.flush()

    def close(self) -> Path:
        """Finish the file and move it to ``path``, durably. Returns the path."""
        if not self._file.closed:
            f = self._file
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            digest = hashlib.sha256()
            while block := f.read(1 << 20):
                digest.update(block)
            self.sha256, self.bytes = digest.hexdigest(), f.tell()
            self.others_writing = self._others()
            try:
                os.replace(self.partial, self.path)
            finally:
                f.close()  # the lock goes with it: after the rename, never before
            fsync_directory(self.path.parent)
        return self.path

    def _others(self) -> list[int]:
        """The process ids of other writers of ``path`` whose partial file is there now."""
        pids = []
        for p in self.path.parent.glob(f".{self.path.name}.*.partial"):
            m = ORPHAN_NAME.match(p.name)
            if m and p != self.partial and m["name"] == self.path.name and not writer_gone(p):
                pids.append(int(m["pid"]))
        return sorted(set(pids))

    def discard(self) -> None:
        """Drop what was written: no file at ``path`` from this writer."""
        if not self._file.closed:
            self._file.close()
        self.partial.unlink(missing_ok=True)

    def __enter__(self) -> WavStreamWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()
