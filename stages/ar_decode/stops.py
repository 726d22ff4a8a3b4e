"""A reply's text cut at its first stop string, as it streams.

The guarantee: no stop string, nor anything after the first one, is ever sent. A delta
that ends with the beginning of a stop string ("fi" of "five") is held back until the
next delta shows whether the string completes; the held text is sent when it cannot, or
when the reply ends otherwise (:meth:`StopText.flush`). The engines that decode in this
process (llama.cpp's runner) cut with it; vLLM cuts in its own detokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopText:
    """The text deltas of one reply, cut at the first of ``stops`` (none: passed as they come)."""

    __slots__ = ("held", "stopped", "stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self.stopped = False

    def add(self, text: str) -> str:
        """What of ``text`` may be sent now; after a stop string, nothing (``stopped`` is set)."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held, self.stopped = "", True
            return buf[: min(hits)]
        keep = max((self._open_prefix(buf, s) for s in self.stops), default=0)
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The text held back, to be sent when the reply ends without a stop string."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out

    @staticmethod
    def _open_prefix(buf: str, stop: str) -> int:
        """The length of the longest tail of ``buf`` that begins ``stop`` (and is shorter)."""
        for k in range(min(len(stop) - 1, len(buf)), 0, -1):
            if buf.endswith(stop[:k]):
                return k
        return 0
