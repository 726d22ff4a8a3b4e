"""The audio item stages hand each other: ``{"audio": mono samples, "sample_rate": int}``.

For runners (numpy is imported here; planning never imports this module).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import soxr

from stages.payloads import sample_rate_problem

RESAMPLE_BLOCK_SAMPLES = 1 << 16
"""Source samples resampled at a time: 4 s at 16 kHz, 0.3 s at 192 kHz. Memory stays a
few blocks however long the recording, and a cancelled request stops within one block."""


class Cancelled(Exception):
    """Work in a thread stopped because its request was cancelled (``cancel`` was set)."""


def mono_audio(item: Any, taker: str) -> tuple[np.ndarray, int]:
    """(float32 samples, sample rate) of an audio item; ``ValueError`` naming what is
    wrong otherwise. ``taker`` names who takes it, e.g. ``"an asr stage"``."""
    if not isinstance(item, dict) or "audio" not in item or "sample_rate" not in item:
        raise ValueError(
            f"{taker} takes audio items {{'audio': samples, 'sample_rate': rate}}, "
            f"got {type(item).__name__}"
        )
    samples = np.asarray(item["audio"], dtype=np.float32)
    rate = item["sample_rate"]
    if samples.ndim != 1:
        raise ValueError(f"audio must be mono (one dimension), got shape {samples.shape}")
    problem = sample_rate_problem(rate)
    if problem is not None:
        raise ValueError(f"sample_rate: {problem}")
    return samples, rate


def resample_blocks(
    samples: np.ndarray, from_rate: int, to_rate: int, cancel: threading.Event | None = None
) -> Iterator[np.ndarray]:
    """``samples`` at ``from_rate`` as ``to_rate``, block by block (soxr's streaming
    resampler, so the blocks join without seams; its high quality, as ``soxr.resample``).
    Between blocks a set ``cancel`` raises ``Cancelled``: the thread this runs in stops
    with its request instead of finishing work nobody waits for."""
    a = np.asarray(samples, dtype=np.float32).reshape(-1)
    if from_rate == to_rate:
        yield a
        return
    stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality="HQ")
    for start in range(0, max(a.size, 1), RESAMPLE_BLOCK_SAMPLES):
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"cancelled after {start} of {a.size} samples")
        end = start + RESAMPLE_BLOCK_SAMPLES
        yield stream.resample_chunk(a[start:end], last=end >= a.size)


def resample(
    samples: np.ndarray, from_rate: int, to_rate: int, cancel: threading.Event | None = None
) -> np.ndarray:
    """The whole of :func:`resample_blocks`, joined (the output is bounded by the input's
    length and the rate range, ``stages.payloads.MAX_SAMPLE_RATE``)."""
    blocks = list(resample_blocks(samples, from_rate, to_rate, cancel))
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks).astype(np.float32, copy=False)
