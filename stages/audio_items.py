"""The audio item stages hand each other: ``{"audio": mono samples, "sample_rate": int}``.

For runners (numpy is imported here; planning never imports this module).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def mono_audio(item: Any, taker: str) -> tuple[np.ndarray, int]:
    """(float32 samples, sample rate) of an audio item; ``ValueError`` naming what is
    wrong otherwise. ``taker`` names who takes it, e.g. ``"an asr stage"``."""
    if not isinstance(item, dict) or "audio" not in item or "sample_rate" not in item:
        raise ValueError(f"{taker} takes audio items {{'audio': samples, 'sample_rate': rate}}, "
                         f"got {type(item).__name__}")
    samples = np.asarray(item["audio"], dtype=np.float32)
    rate = item["sample_rate"]
    if samples.ndim != 1:
        raise ValueError(f"audio must be mono (one dimension), got shape {samples.shape}")
    if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
        raise ValueError(f"sample_rate must be a positive int, got {rate!r}")
    return samples, rate
