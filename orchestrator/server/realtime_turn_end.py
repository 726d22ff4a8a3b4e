"""Semantic end of turn for ``/v1/realtime``: a pause as long as the utterance needs.

A fixed silence (``server_vad``'s ``silence_duration_ms``) is too long after a finished
question and too short inside one ("I'd like to know … about the moon"). With
``turn_detection: {type: semantic_vad, eagerness: ...}`` (OpenAI's Realtime names; the vad
stage's ``turn_detection`` sets a pipeline's default) a pause ends the turn after
:attr:`Pauses.incomplete_ms` of silence, unless the transcript of the speech before it is
judged complete — the thinker's own model's probability that the user's message ends there
(``DecodeEngine.turn_scorer``; ``stages.ar_decode.engines.llamacpp_turn``) at least
:attr:`Pauses.threshold` — and then after :attr:`Pauses.complete_ms`
(``Segmenter.limit_pause``: the same segment, sooner).

The transcript is the session's own (``realtime_transcribe``): its pass on the speech before
the pause starts when the VAD hears the pause, so the verdict comes a pass and a score after
the speech ended, and a complete question's turn ends then or at ``complete_ms``, whichever
is later.

Guarantees: the verdict only ever shortens the pause it was asked about (a pause that ended —
speech resumed — is never limited by a verdict on it); with no verdict yet the turn waits
``incomplete_ms``; a session's ``eagerness`` is one of :data:`EAGERNESS`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from orchestrator.config import PipelineConfig
from orchestrator.core.errors import Problem
from stages.base import TurnScorer
from stages.registry import get_kind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pauses:
    """One eagerness: the pauses that end a turn, and the score that makes one complete."""

    complete_ms: int
    """The pause after an utterance judged complete."""
    incomplete_ms: int
    """The pause after one that is not (or not judged yet): the longest a turn waits."""
    threshold: float
    """The end-of-utterance probability at which an utterance is complete."""


EAGERNESS: dict[str, Pauses] = {
    "high": Pauses(complete_ms=150, incomplete_ms=500, threshold=0.05),
    "medium": Pauses(complete_ms=200, incomplete_ms=800, threshold=0.1),
    "low": Pauses(complete_ms=300, incomplete_ms=1200, threshold=0.2),
}
"""OpenAI's eagerness names: high ends a turn soonest, low waits longest; ``auto`` is medium.
The thresholds sit between the scores of finished questions and of ones cut after a
preposition or an article, as ``bench/turn_scores.py`` measures them (docs/benchmarks.md)."""
EAGERNESS["auto"] = EAGERNESS["medium"]


def pauses(eagerness: str) -> Pauses:
    return EAGERNESS[eagerness]


def semantic_problem(config: PipelineConfig, vad_stage: str) -> Problem | None:
    """Why ``vad_stage`` of ``config`` cannot end turns semantically (None when it can): it must
    feed one stage that transcribes speech (``StageKind.transcribes_speech``: the session's own
    transcript, run in the server), which feeds one stage whose model may score it
    (``StageKind.scores_turns``: the thinker). Read from the config: before anything is planned."""
    where = f"stages.{vad_stage}.turn_detection"
    fix = "use {type: server_vad}, or feed the vad stage to an asr stage and that to the thinker"
    asr = [s for s in config.stages if vad_stage in s.inputs]
    if len(asr) != 1 or not get_kind(asr[0].kind).transcribes_speech or len(asr[0].inputs) != 1:
        return Problem(
            where,
            "semantic_vad needs the vad stage to feed one asr stage (the transcript it scores)",
            fix,
        )
    thinker = [s for s in config.stages if asr[0].name in s.inputs]
    if (
        len(thinker) != 1
        or not get_kind(thinker[0].kind).scores_turns
        or len(thinker[0].inputs) != 1
    ):
        return Problem(
            where,
            f"semantic_vad needs the asr stage {asr[0].name!r} to feed one ar_decode stage (the model "
            "that scores the transcript)",
            fix,
        )
    return None


class TurnEnd:
    """The verdicts of one server's scorer (shared by its sessions; calls are serialised)."""

    def __init__(self, scorer: TurnScorer) -> None:
        self.scorer = scorer
        self._warming: asyncio.Future[float] | None = None

    async def complete(self, transcript: str, eagerness: str) -> bool:
        """Whether ``transcript`` is a finished utterance at ``eagerness``'s threshold."""
        score = await asyncio.to_thread(self.scorer.complete, transcript)
        return score >= pauses(eagerness).threshold

    def warm(self, words: str) -> None:
        """Read ``words`` (a transcript's head: the words committed while the user speaks) in the
        background, its score dropped: the scorer keeps what it read, so the verdict at the pause
        reads only the words after them (the llama.cpp scorer reads a transcript from where it
        parts from the last one). At most one at a time: a call while one runs does nothing."""
        if not words.strip() or (self._warming is not None and not self._warming.done()):
            return
        self._warming = asyncio.ensure_future(asyncio.to_thread(self.scorer.complete, words))
        self._warming.add_done_callback(_warmed)


def _warmed(done: asyncio.Future[float]) -> None:
    """A warm-up's end: its score is dropped; a failure is logged (the verdict that follows will
    meet it too), not left for the loop to report as never retrieved."""
    if not done.cancelled() and done.exception() is not None:
        log.warning("the turn scorer failed reading a transcript's head: %s", done.exception())
