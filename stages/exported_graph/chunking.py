"""Chunked decoding for a frames → samples graph (a codec decoder such as Qwen3-Omni's
code2wav), as vLLM-Omni's ``async_chunk`` runs its code2wav stage.

An ``exported_graph`` stage with ``chunk:`` treats its input items as frames of
codes (an item is one frame ``[codebooks]``, or several ``[codebooks, n]``) and
calls its graph on windows of them rather than item by item: a window is a
chunk of new frames with up to ``left_context`` frames already decoded before
it, and of the window's waveform only the new samples are kept, so audio
starts after the first chunk, long before the producer (the talker) has ended.

Windows (:class:`FrameChunker`), vLLM-Omni's ``talker2code2wav_async_chunk``:
the first window takes ``first_frames`` frames (``initial_codec_chunk_frames``),
each later one ``frames`` (``codec_chunk_frames``) with ``min(left_context,
frames decoded so far)`` frames of left context (``codec_left_context_frames``);
the frames left when the input ends make a last, shorter window. With
``frames`` None the whole input is one window, once the input has ended
(vLLM-Omni without ``async_chunk``).

Samples kept (:func:`new_samples`), vLLM-Omni's ``chunked_decode_streaming``:
a causal decoder with transposed convolutions returns a fixed ``tail`` fewer
samples than ``frames × samples_per_frame`` (Qwen3-Omni's: 555), the end it has
no right context for. A window of ``ctx + n`` frames keeps samples
``[ctx × spf − tail, (ctx + n) × spf − tail)``: it re-decodes, with context, the
tail the window before could not, so the concatenated chunks are exactly as long
as the whole-sequence waveform — and equal to it wherever the left context
covers the decoder's receptive field.

Pure numpy; no session (the runner calls the graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ChunkInputError(ValueError):
    """An input item that is not frames of codes; the message says what it is."""


@dataclass(frozen=True)
class Window:
    """One call's frames: ``codes`` ``[codebooks, context + new]``, the first ``context`` already decoded."""

    codes: Any
    context: int
    new: int


class FrameChunker:
    """Frames in, windows out, for one request. ``add`` each item as it arrives,
    ``finish`` once the input has ended; each returns the windows now ready."""

    def __init__(self, frames: int | None, left_context: int, first_frames: int = 0) -> None:
        self.frames = frames
        self.left_context = left_context
        self.first_frames = first_frames
        self._codes: Any = None  # [codebooks, frames so far]
        self._done = 0  # frames already decoded (in some window)

    @property
    def received(self) -> int:
        return 0 if self._codes is None else int(self._codes.shape[1])

    def add(self, item: Any) -> list[Window]:
        import numpy as np

        block = np.asarray(item)
        if block.dtype.kind not in "iu" or block.ndim not in (1, 2) or block.size == 0:
            raise ChunkInputError(
                f"an item of {block.dtype} shape {list(block.shape)} is not frames of codes "
                f"(integers: one frame [codebooks], or [codebooks, frames])"
            )
        block = block.astype(np.int64).reshape(block.shape[0], -1)  # [codebooks, n]
        if self._codes is not None and block.shape[0] != self._codes.shape[0]:
            raise ChunkInputError(
                f"a frame of {block.shape[0]} codes after frames of {self._codes.shape[0]}"
            )
        self._codes = block if self._codes is None else np.concatenate([self._codes, block], axis=1)
        out = []
        while (size := self._next_size()) is not None and self.received - self._done >= size:
            out.append(self._window(size))
        return out

    def finish(self) -> list[Window]:
        """The last window: every frame not yet decoded (none when there is none)."""
        left = self.received - self._done
        return [self._window(left)] if left > 0 else []

    def _next_size(self) -> int | None:
        if self.frames is None:
            return None  # the whole input, at finish()
        if self._done == 0 and self.first_frames > 0:
            return self.first_frames
        return self.frames

    def _window(self, new: int) -> Window:
        context = min(self.left_context, self._done)
        start = self._done - context
        window = Window(self._codes[:, start : self._done + new], context, new)
        self._done += new
        return window


def new_samples(waveform: Any, window: Window, samples_per_frame: int) -> tuple[int, int]:
    """``(start, end)`` on the waveform's last axis (``end`` is its length): the samples of ``window``'s new frames
    (the module docstring). Raises ``ValueError`` when the window's context is too short to
    re-decode the tail the window before left (``context × samples_per_frame < tail``)."""
    got = int(waveform.shape[-1])
    full = (window.context + window.new) * samples_per_frame
    tail = max(0, full - got)
    start = window.context * samples_per_frame - tail
    if window.context > 0 and start < 0:
        raise ValueError(
            f"the decoder returns {tail} samples fewer than {window.context + window.new} frames × "
            f"{samples_per_frame}; a left context of {window.context} frame(s) cannot re-decode them"
        )
    return max(0, start), got
