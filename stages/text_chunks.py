"""Cut a stream of text deltas into speakable chunks (sentences), as they arrive.

A decode stage yields text a token at a time; a TTS stage wants whole
sentences — short enough to start speaking early, long enough to sound
natural. Guarantees:

* Every non-blank character of the input is in exactly one chunk, in order
  (whitespace between chunks is dropped; chunks are stripped).
* A sentence is emitted as soon as it is certainly complete: when the first
  non-blank character after its terminator arrives (``.``, ``!``, ``?``,
  ``…``, then any closing quotes or brackets, then whitespace). It never waits
  for the end of the reply. So ``3.14`` and ``e.g.`` are not cut, and neither
  is a ``.`` followed by a lowercase word (``z. B. der``, ``ca. zehn``).
* CJK sentences end at ``。！？`` (and an ASCII ``!?.`` directly followed by a
  CJK character) without a space after them; the character after the
  terminator and its closing quotes (``」』”）``) decides, so ``「はい。」と``
  (a quoted sentence inside a Japanese one) is not cut.
* Abbreviations of English and German (``Dr.``, ``e.g.``, ``z.B.``,
  ``z. B.``, ``ca.``, ``bzw.``, ``usw.``, ``Nr.``) and single initials
  (``J.``) do not end a sentence; one list serves every language, so no
  language hint is needed.
* A number followed by ``.`` does not end a sentence when it is a list marker
  (``1. Buy milk`` at the start of a line) or an ordinal before a month or
  another ordinal noun (``am 3. Mai``, ``im 19. Jahrhundert``); for that case
  alone the chunker waits for the next word, and only while what has come of it
  can still become such a noun (``1982. However`` is out at ``However``'s
  first letters, one token after the ``.``, as any sentence).
* A line break ends a chunk (list items, paragraphs).
* A clause that runs past ``max_chars`` without a sentence end is cut at its
  last clause mark (``, ; : — ，；：、``) or, failing that, its last space.
* With ``first_max_chars`` (a TTS stage's ``first_chunk_chars``), the reply's
  **first** chunk is cut once it runs past that many characters, on a phrase
  boundary (its last clause mark, else its last space; failing both, the first
  space after them) of at least ``FIRST_MIN_WORDS`` words and
  ``FIRST_MIN_CUT_CHARS`` characters, never inside a word: the voice starts on a
  few words while the rest of the first sentence is still being decoded. Later
  chunks are sentences.
* At the end of the stream the rest is flushed.
* Chunks with no letter or digit (a stray ``*`` or ``...``) are merged into
  the next chunk rather than spoken alone; a trailing one is dropped (there
  is nothing to say).

Why not a library (``python bench/text_chunks.py``, 4-character deltas): the
37 hand-split replies of ``tests/stages/sentence_corpus.py`` (English, German,
Chinese, Japanese; 42 boundaries) streamed through this chunker, pysbd 0.3.4
(given each reply's language, re-run at every delta on the text not yet
emitted, all segments but the last emitted — it has no streaming mode) and
stream2sentence 1.1.0 (``generate_sentences``, rule-based, the reply's
language). This chunker: 37/37 replies exact, 42/42 boundaries, 0 false cuts,
~4 µs per delta, a sentence out 1.8 characters after its end on average.
pysbd: 31/37, 37/42, 5 false cuts (``approx. 5``, closing quotes after
``。``/``！`` cut off; the same 31/37 on whole texts), ~200 µs per delta.
stream2sentence: 23/37 with its defaults (it merges short sentences), 29/37
with merging off (9 false cuts: ``am 3.`` | ``Mai``, ``1.`` | ``Boil``),
75–165 µs per delta, and a sentence out ~6 characters after its end (it
waits for context). Before these rules the chunker got 10/37 (16 false cuts).
Neither library serves a streaming voice better; both would add a dependency
(stream2sentence pulls in emoji and, for its better tokenizers, NLTK or
Stanza). The corpus and these rules were written together: the numbers show
the cases handled, not accuracy on unseen text.

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
FIRST_MIN_CUT_CHARS = 8
"""The shortest first fragment (``first_max_chars``): two or three short words — "Sure, the" is
not cut off as "Sure," alone when a later mark or space leaves more."""
FIRST_MIN_WORDS = 2
"""The fewest words of a first fragment: one word alone ("Certainly,") sounds cut off."""

_ABBREVIATIONS = frozenset(
    [
        # English
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "approx",
        "no",
        "fig",
        "al",
        "inc",
        "ltd",
        "co",
        "mt",
        "ft",
        "cf",
        "viz",
        "dept",
        "est",
        "jan",
        "feb",
        "mar",
        "apr",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        # German
        "z.b",
        "zb",
        "d.h",
        "u.a",
        "u.u",
        "o.ä",
        "s.o",
        "s.u",
        "ca",
        "bzw",
        "usw",
        "nr",
        "vgl",
        "ggf",
        "evtl",
        "inkl",
        "exkl",
        "sog",
        "bspw",
        "str",
        "hr",
        "fr",
        "jh",
        "jhd",
        "mio",
        "mrd",
        "tel",
        "abs",
        "bd",
        "ebd",
        "allg",
        "bzgl",
        "gegr",
        "max",
        "min",
        "od",
        "rd",
        "urspr",
        "zz",
        "zzt",
    ]
)
_LOWER_INITIALS = "diosuvz"
"""Single lowercase letters that open German abbreviations written with spaces:
``z. B.``, ``d. h.``, ``u. a.``, ``s. o.``, ``v. a.``, ``i. d. R.``, ``o. ä.`` (``3 m.`` still ends)."""
_ORDINAL_NOUNS = frozenset(
    [
        "januar",
        "jänner",
        "februar",
        "märz",
        "april",
        "mai",
        "juni",
        "juli",
        "august",
        "september",
        "oktober",
        "november",
        "dezember",
        "jahrhundert",
        "jh",
        "jahrtausend",
        "platz",
        "stock",
        "klasse",
        "mal",
        "auflage",
        "geburtstag",
        "jahrestag",
        "kapitel",
        "runde",
        "spieltag",
        "januars",
        "jahrhunderts",
    ]
)
"""Words after ``<number>.`` that make the number an ordinal (German): ``am 3. Mai``."""
_TERMINATORS = ".!?…"
_CJK_TERMINATORS = "。！？｡"
_CLOSERS = "\"')]}»”’“‘」』）】〕〉》＂＇"
_QUOTATIVE = ("と", "って")
"""A Japanese quoted sentence goes on after its closing quote: 「はい。」と言った."""
_NOT_AN_END = -1
_CLAUSE_MARKS = ",;:—–，；：、"
_WORD_BEFORE = re.compile(r"([^\W\d_](?:[^\W\d_]|\.)*)\.$")
_NUMBER_BEFORE = re.compile(r"(?:^|(?<=\s))(\d{1,4})\.$")


def _is_cjk(c: str) -> bool:
    """Han, kana, hangul and CJK punctuation: a script written without spaces."""
    o = ord(c)
    return (
        0x3000 <= o <= 0x30FF
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0xAC00 <= o <= 0xD7AF
        or 0xF900 <= o <= 0xFAFF
        or 0xFF00 <= o <= 0xFFEF
    )


class SentenceChunker:
    """The synchronous core: ``feed`` deltas, collect chunks; ``flush`` at the end."""

    def __init__(
        self,
        max_chars: int = MAX_CHARS,
        min_cut_chars: int = MIN_CUT_CHARS,
        first_max_chars: int | None = None,
    ) -> None:
        if max_chars <= min_cut_chars:
            raise ValueError(f"max_chars ({max_chars}) must exceed min_cut_chars ({min_cut_chars})")
        if first_max_chars is not None and first_max_chars <= FIRST_MIN_CUT_CHARS:
            raise ValueError(
                f"first_max_chars ({first_max_chars}) must exceed {FIRST_MIN_CUT_CHARS}"
            )
        self.max_chars = max_chars
        self.min_cut_chars = min_cut_chars
        self.first_max_chars = first_max_chars
        self._first = first_max_chars is not None  # the first chunk is still to come
        self._buf = ""
        self._carry = ""  # a punctuation-only chunk waiting for the next one

    def feed(self, delta: str) -> list[str]:
        """Add a delta; return the chunks it completes (possibly none)."""
        self._buf += delta
        out: list[str] = []
        while True:
            cut = self._sentence_end()
            if (
                cut is None
                and self._first
                and self.first_max_chars is not None
                and len(self._buf) > self.first_max_chars
            ):
                cut = self._first_cut(self.first_max_chars)
            if cut is None and len(self._buf) > self.max_chars:
                cut = self._forced_cut(self.max_chars, self.min_cut_chars)
            if cut is None:
                break
            self._emit(self._buf[:cut], out)
            self._buf = self._buf[cut:]
            if out:
                self._first = False
        return out

    @property
    def pending_chars(self) -> int:
        """Characters fed and not yet cut off into a chunk: the fed text's length less this is
        where the last cut fell (the runtime's first-audio trace finds the token that ended a
        sentence with it)."""
        return len(self._buf)

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
        """Index just past the first complete sentence or line in the buffer, or
        None when there is none yet (or the characters that decide have not come)."""
        buf = self._buf
        for i, c in enumerate(buf):
            if c == "\n":
                return i + 1
            if c not in _TERMINATORS and c not in _CJK_TERMINATORS:
                continue
            j = i + 1
            while j < len(buf) and (
                buf[j] in _CLOSERS or buf[j] in _TERMINATORS or buf[j] in _CJK_TERMINATORS
            ):
                j += 1
            if j >= len(buf):
                return None  # the next character decides
            end = self._ends_at(buf, i, j)
            if end != _NOT_AN_END:
                return end
        return None

    def _ends_at(self, buf: str, i: int, j: int) -> int | None:
        """Whether the terminator at ``i`` (closers up to ``j``) ends a sentence: the
        index just past it, ``_NOT_AN_END``, or None (not decidable yet)."""
        c, nxt = buf[i], buf[j]
        if not nxt.isspace():
            if c in _CJK_TERMINATORS or _is_cjk(nxt):
                return _NOT_AN_END if j > i + 1 and buf.startswith(_QUOTATIVE, j) else j
            return _NOT_AN_END  # 3.14, e.g.x, "a.b"
        if c in _CJK_TERMINATORS:
            return j
        k = j
        while k < len(buf) and buf[k].isspace() and buf[k] != "\n":
            k += 1
        if k < len(buf) and buf[k] == "\n":
            return j
        if k >= len(buf):
            return None  # the next word decides
        if c != ".":
            return j
        head = buf[: i + 1]
        if self._is_abbreviation(head) or buf[k].islower():
            return _NOT_AN_END
        number = _NUMBER_BEFORE.search(head)
        if number:
            return self._after_number(buf, head, number, j, k)
        return j

    @staticmethod
    def _after_number(buf: str, head: str, number: re.Match[str], j: int, k: int) -> int | None:
        before = head[: number.start(1)]
        if not before.strip() or before.rstrip(" \t").endswith("\n"):
            return _NOT_AN_END  # a list marker: "1. Buy milk"
        m = re.match(r"[^\W\d_]+", buf[k:])
        if m is None:
            return j
        word = m.group(0).lower()
        if k + m.end() >= len(buf):
            # the word may go on: it decides only while it can still become an ordinal noun
            # ("1982. However" is out at " However", "am 3. Ma" waits for "Mai" or "Man")
            return None if any(noun.startswith(word) for noun in _ORDINAL_NOUNS) else j
        return _NOT_AN_END if word in _ORDINAL_NOUNS else j

    @staticmethod
    def _is_abbreviation(text: str) -> bool:
        m = _WORD_BEFORE.search(text)
        if not m:
            return False
        word = m.group(1)
        if len(word) == 1:
            return word.isupper() or word in _LOWER_INITIALS
        return word.lower() in _ABBREVIATIONS or word.lower().endswith("str")  # Hauptstr.

    def _first_cut(self, max_chars: int) -> int | None:
        """Where the first chunk ends when it runs past ``max_chars``: a phrase boundary of at
        least ``FIRST_MIN_WORDS`` words and ``FIRST_MIN_CUT_CHARS`` characters — the last clause
        mark, else the last space, within ``max_chars``; failing both, the first space after
        them (a fragment never ends inside a word); None until one has come."""
        buf = self._buf

        def fits(end: int) -> bool:
            head = buf[:end]
            return end >= FIRST_MIN_CUT_CHARS and len(head.split()) >= FIRST_MIN_WORDS

        window = buf[:max_chars]
        for marks in (_CLAUSE_MARKS, " "):
            pos = max(window.rfind(m) for m in marks)
            if pos >= 0 and fits(pos + 1):
                return pos + 1
        for pos in range(max_chars, len(buf)):
            if buf[pos] == " " and fits(pos + 1):
                return pos + 1
        return None

    def _forced_cut(self, max_chars: int, min_cut_chars: int) -> int | None:
        window = self._buf[:max_chars]
        for marks in (_CLAUSE_MARKS, " "):
            pos = max(window.rfind(m) for m in marks)
            if pos + 1 >= min_cut_chars:
                return pos + 1
        return max_chars


class WholeText:
    """``SentenceChunker``'s interface for a stage that wants the whole text as one
    item (``StageKind.text_input == "whole"``): ``feed`` keeps every delta and
    returns nothing; ``flush`` returns the text (empty when nothing came)."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def feed(self, delta: str) -> list[str]:
        self._parts.append(delta)
        return []

    @property
    def pending_chars(self) -> int:
        """Characters kept for the end (``SentenceChunker.pending_chars``)."""
        return sum(len(p) for p in self._parts)

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
