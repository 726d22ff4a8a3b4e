"""What one request to ``omni-edge serve`` may carry: :class:`ServerLimits` and each cap's flag.

A module of its own, importing nothing outside the standard library and the bottom
layer, because the CLI's parser reads the defaults (``serve``'s and ``chat``'s
``--max-*`` flags) on a core install, where the server's packages are absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.core.units import MiB


@dataclass(frozen=True)
class ServerLimits:
    """What one request may carry; each cap is an ``omni-edge serve`` flag (``FLAGS``)
    and is named, with its value, in the 413/400 that refuses a request over it."""

    max_body_bytes: int = 32 * MiB
    """A request body: room for ``max_audio_bytes`` in base64 (4/3 of it, 26.7 MiB) and text."""
    max_messages: int = 512
    """Messages per chat request: a long conversation is a few hundred turns."""
    max_content_chars: int = 262_144
    """Characters of text in all of a request's messages: 8× a 32k-token context at ~4
    characters a token; anything longer is tokenized only to be refused by the context check."""
    max_speech_chars: int = 4096
    """``/v1/audio/speech`` ``input``: OpenAI's own limit for that endpoint."""
    max_audio_bytes: int = 20 * MiB
    """A recording's WAV bytes (``input_audio``): OpenAI's audio uploads stop at 25 MB;
    20 MiB is 11 minutes of 16 kHz mono 16-bit audio."""
    max_audio_seconds: float = 600.0
    """A recording's duration: a spoken question is seconds long; ten minutes is generous."""
    max_tensor_bytes: int = 16 * MiB
    """A request's arrays (``input_tensor`` parts, their ``.npy`` bytes together): room in the
    body's 32 MiB for their base64 (21.3 MiB); a 1024×1024 RGB float32 image is 12 MiB."""

    def __post_init__(self) -> None:
        for name in FLAGS:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not value > 0
                or not math.isfinite(value)
            ):
                raise ValueError(f"ServerLimits.{name} must be a positive number, got {value!r}")


FLAGS = {
    "max_body_bytes": "--max-body-mib",
    "max_messages": "--max-messages",
    "max_content_chars": "--max-content-chars",
    "max_speech_chars": "--max-speech-chars",
    "max_audio_bytes": "--max-audio-mib",
    "max_audio_seconds": "--max-audio-seconds",
    "max_tensor_bytes": "--max-tensor-mib",
}
"""Each limit's ``omni-edge serve`` flag, as the 400 that names it says."""
