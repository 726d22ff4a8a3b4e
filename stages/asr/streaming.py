"""A transcript that grows while the user speaks: the words two passes agree on are committed.

The asr stage transcribes a closed segment; a spoken session wants the words as they are
said. Whisper is re-run on the growing segment (every ~0.5 s of new audio) and the tokens
two consecutive passes agree on are committed — the LocalAgreement-2 policy of
whisper_streaming (Macháček et al., 2023). Each pass after the first is decoded with the
committed tokens forced as its head (``AsrRunner.decode_tokens(prefix=...)``), so a
committed word is never taken back, and the last pass, once the speech ended, decodes only
what follows them.

:class:`LocalAgreement` is the policy alone, on token ids (no audio, no model): each
hypothesis comes with the indices of the tokens that begin a word in it
(``AsrRunner.word_starts``). Guarantees:

* what it commits is the longest head both of the last two hypotheses share, cut back to
  whole words: a word is committed only when both hypotheses go on past it with a new
  word (the last word of a growing segment is often cut mid-way, and a ``?`` or a plural
  ``s`` may still join it);
* the committed tokens only grow, and each hypothesis must start with them (the forced
  head): ``ValueError`` otherwise;
* :meth:`LocalAgreement.final` commits all of the last hypothesis: the transcript is the
  committed tokens, in the order they were committed.
"""

from __future__ import annotations

from collections.abc import Sequence


class LocalAgreement:
    """The committed tokens of one segment (see the module docstring)."""

    def __init__(self) -> None:
        self.committed: list[int] = []
        """The tokens committed so far, each pass's forced head."""
        self._last: tuple[list[int], frozenset[int]] | None = None

    @property
    def last(self) -> list[int] | None:
        """The last hypothesis, which the next one is compared with (None before the first)."""
        return None if self._last is None else list(self._last[0])

    def update(self, tokens: Sequence[int], starts: frozenset[int]) -> list[int]:
        """One pass's tokens (the committed ones first) and the indices in them that begin a
        word; the tokens this pass commits (often none)."""
        tokens = list(tokens)
        self._check(tokens)
        last, self._last = self._last, (tokens, starts)
        if last is None:
            return []
        before, before_starts = last
        agreed = 0
        for a, b in zip(before, tokens, strict=False):
            if a != b:
                break
            agreed += 1
        done = len(self.committed)
        cut = done
        for k in range(agreed, done, -1):
            # token k begins a word in both (or is past the end of neither): the words before it are whole
            if k < len(tokens) and k < len(before) and k in starts and k in before_starts:
                cut = k
                break
        new = tokens[done:cut]
        self.committed += new
        return new

    def final(self, tokens: Sequence[int]) -> list[int]:
        """The last pass, on the whole segment: every token after the committed ones is committed."""
        tokens = list(tokens)
        self._check(tokens)
        new = tokens[len(self.committed) :]
        self.committed += new
        self._last = None
        return new

    def _check(self, tokens: list[int]) -> None:
        n = len(self.committed)
        if tokens[:n] != self.committed:
            raise ValueError(
                f"a pass must start with the {n} committed tokens (decode it with them as its prefix)"
            )
