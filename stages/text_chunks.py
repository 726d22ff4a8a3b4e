"""Cut a stream of text deltas into speakable chunks (sentences), as they arrive.

A decode stage yields text a token at a time; a TTS stage wants whole
sentences — short enough to start speaking early, long enough to sound
natural. Guarantees:

* Every non-blank character of the input is in exactly one chunk, in order
  (whitespace between chunks is dropped; chunks are stripped).
* A sentence is emitted as soon as the character after its terminator
  arrives (``.``, ``!``, ``?``, ``…``, optionally followed by closing quotes
  or brackets, then whitespace) — it waits one character, so ``3.14`` and
  ``e.g.`` are not cut. Common abbreviations (``Dr.``, ``e.g.``) and single
  initials (``J.``) do not end a sentence.
* A line break ends a chunk (list items, paragraphs).
* A clause that runs past ``max_chars`` without a sentence end is cut at its
  last clause mark (``, ; : —``) or, failing that, its last space.
* At the end of the stream the rest is flushed.
* Chunks with no letter or digit (a stray ``*`` or ``...``) are merged into
  the next chunk rather than spoken alone; a trailing one is dropped (there
  is nothing to say).

No I/O and no imports beyond the standard library: the same object serves
the orchestrated pipeline and the in-process baseline of ``bench/pipeline.py``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator

MAX_CHARS = 200
"""Longest chunk before a forced cut: about 12 s of speech at piper's pace, so a
run-on sentence still reaches the TTS while decoding continues."""
MIN_CUT_CHARS = 24
"""A forced cut never leaves a fragment shorter than this (it would sound clipped)."""

_ABBREVIATIONS = frozenset(
    ["mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "approx", "no", "fig", "al", "inc", "ltd", "co", "mt", "ft"]
)
_TERMINATORS = ".!?…"
_CLOSERS = "\"')]}»”’"
_CLAUSE_MARKS = ",;:—–"
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)\.$")


class SentenceChunker:
    """The synchronous core: ``feed`` deltas, collect chunks; ``flush`` at the end."""

    def __init__(self, max_chars: int = MAX_CHARS, min_cut_chars: int = MIN_CUT_CHARS) -> None:
        if max_chars <= min_cut_chars:
            raise ValueError(f"max_chars ({max_chars}) must exceed min_cut_chars ({min_cut_chars})")
        self.max_chars = max_chars
        self.min_cut_chars = min_cut_chars
        self._buf = ""
        self._carry = ""  # a punctuation-only chunk waiting for the next one

    def feed(self, delta: str) -> list[str]:
        """Add a delta; return the chunks it completes (possibly none)."""
        self._buf += delta
        out: list[str] = []
        while True:
            cut = self._sentence_end()
            if cut is None and len(self._buf) > self.max_chars:
                cut = self._forced_cut()
            if cut is None:
                break
            self._emit(self._buf[:cut], out)
            self._buf = self._buf[cut:]
        return out

    def flush(self) -> list[str]:
        """The rest of the text as a last chunk (or nothing when it is blank)."""
        out: list[str] = []
        self._emit(self._buf, out)
        self._buf = ""
        self._carry = ""  # punctuation only, nothing after it: nothing to say
        return out

    # -- internals -------------------------------------------------------------
    def _emit(self, text: str, out: list[str]) -> None:
        text = (self._carry + " " + text.strip()).strip() if self._carry else text.strip()
        if not text:
            return
        if not any(c.isalnum() for c in text):
            self._carry = text
            return
        self._carry = ""
        out.append(text)

    def _sentence_end(self) -> int | None:
        """Index just past the first complete sentence or line in the buffer."""
        buf = self._buf
        for i, c in enumerate(buf):
            if c == "\n":
                return i + 1
            if c not in _TERMINATORS:
                continue
            j = i + 1
            while j < len(buf) and (buf[j] in _CLOSERS or buf[j] in _TERMINATORS):
                j += 1
            if j >= len(buf):
                return None  # the next character decides
            if not buf[j].isspace():
                continue  # 3.14, e.g.x, "a.b"
            if c == "." and self._is_abbreviation(buf[: i + 1]):
                continue
            return j
        return None

    @staticmethod
    def _is_abbreviation(text: str) -> bool:
        m = _WORD_BEFORE.search(text)
        if not m:
            return False
        word = m.group(1)
        return (len(word) == 1 and word.isupper()) or word.lower() in _ABBREVIATIONS

    def _forced_cut(self) -> int | None:
        window = self._buf[: self.max_chars]
        for marks in (_CLAUSE_MARKS, " "):
            pos = max(window.rfind(m) for m in marks)
            if pos + 1 >= self.min_cut_chars:
                return pos + 1
        return self.max_chars


class WholeText:
    """``SentenceChunker``'s interface for a stage that wants the whole text as one
    item (``StageKind.text_input == "whole"``): ``feed`` keeps every delta and
    returns nothing; ``flush`` returns the text (empty when nothing came)."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def feed(self, delta: str) -> list[str]:
        self._parts.append(delta)
        return []

    def flush(self) -> list[str]:
        text, self._parts = "".join(self._parts), []
        return [text]


async def chunk_text(
    deltas: AsyncIterable[str], *, max_chars: int = MAX_CHARS, min_cut_chars: int = MIN_CUT_CHARS
) -> AsyncIterator[str]:
    """Yield speakable chunks from an async stream of text deltas, as they complete."""
    chunker = SentenceChunker(max_chars, min_cut_chars)
    async for delta in deltas:
        for chunk in chunker.feed(delta):
            yield chunk
    for chunk in chunker.flush():
        yield chunk


def split_text(text: str, *, max_chars: int = MAX_CHARS) -> list[str]:
    """The chunks of a whole text (what ``chunk_text`` yields for it in one delta)."""
    chunker = SentenceChunker(max_chars)
    return [*chunker.feed(text), *chunker.flush()]
