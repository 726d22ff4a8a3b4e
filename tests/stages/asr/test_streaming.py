"""A transcript that grows while the user speaks: LocalAgreement commits whole words that two
passes agree on (hypotheses built here, so each rule is a property of the input), and the asr
runner decodes a pass with the committed tokens forced as its head.

The runner's tests use the project's Piper voice (noise 0) and assert the mechanics (what a
forced head does, where words begin), never the words a model picks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.config import parse_config
from orchestrator.core.errors import StageFailed
from orchestrator.planner import plan_pipeline
from stages.asr.streaming import LocalAgreement
from stages.registry import get_kind
from tests.helpers.speech import speak
from tests.stages.asr.test_kind import asr_stage, profile

# token ids stand for words and word pieces: 1xx begin a word, 2xx continue one, 3xx are "?" / "."
W = {101: "What", 102: " is", 103: " the", 104: " larg", 204: "est", 105: " planet", 301: "?"}


def starts(tokens: list[int]) -> frozenset[int]:
    return frozenset(i for i, t in enumerate(tokens) if 100 <= t < 200)


def test_nothing_is_committed_from_one_pass() -> None:
    la = LocalAgreement()
    assert la.update([101, 102, 103], starts([101, 102, 103])) == []
    assert la.committed == []


def test_two_passes_commit_the_whole_words_they_share() -> None:
    """ "What is the larg" then "What is the largest planet": the shared head is "What is the
    larg", but "larg" goes on differently ("est"): only "What is the" is whole in both."""
    la = LocalAgreement()
    one, two = [101, 102, 103, 104], [101, 102, 103, 104, 204, 105]
    la.update(one, starts(one))
    assert la.update(two, starts(two)) == [101, 102, 103]
    assert la.committed == [101, 102, 103]


def test_a_word_both_passes_end_and_go_on_from_is_committed() -> None:
    la = LocalAgreement()
    one, two = [101, 102, 103, 105], [101, 102, 103, 104, 204]
    la.update(one, starts(one))
    # both go on after " the" with a new word (" planet" / " larg"): " the" is whole in both
    assert la.update(two, starts(two)) == [101, 102, 103]


def test_a_word_one_pass_ends_on_is_not_committed() -> None:
    """The first pass's audio ended on " the": it may have been cut there."""
    la = LocalAgreement()
    la.update([101, 102, 103], starts([101, 102, 103]))
    assert la.update([101, 102, 103, 105], starts([101, 102, 103, 105])) == [101, 102]


def test_identical_passes_keep_their_last_word_open() -> None:
    """The audio may have cut the last word: "planet" may still become "planet?" or "planets"."""
    la = LocalAgreement()
    one = [101, 102, 103, 105]
    la.update(one, starts(one))
    assert la.update(one, starts(one)) == [101, 102, 103]
    three = [101, 102, 103, 105, 301]
    assert la.update(three, starts(three)) == []  # "?" joins "planet": still not whole


def test_the_final_pass_commits_the_rest_and_the_transcript_is_every_commit_in_order() -> None:
    la = LocalAgreement()
    passes = [[101, 102], [101, 102, 103, 104], [101, 102, 103, 104, 204, 105]]
    deltas: list[list[int]] = []
    for p in passes:
        deltas.append(la.update(p, starts(p)))
    final = [101, 102, 103, 104, 204, 105, 301]
    deltas.append(la.final(final))
    assert [t for d in deltas for t in d] == la.committed == final
    assert "".join(W[t] for t in la.committed) == "What is the largest planet?"


def test_a_pass_that_does_not_start_with_the_committed_tokens_is_refused() -> None:
    la = LocalAgreement()
    la.update([101, 102, 103, 104], starts([101, 102, 103, 104]))
    la.update([101, 102, 103, 105], starts([101, 102, 103, 105]))
    assert la.committed == [101, 102, 103]
    with pytest.raises(ValueError, match="must start with the 3 committed tokens"):
        la.update([101, 105], starts([101, 105]))
    with pytest.raises(ValueError, match="must start with the 3 committed tokens"):
        la.final([101])


# -- the runner's side ---------------------------------------------------------------------
SENTENCE = "Please turn off the lights in the kitchen before you go to bed."


@pytest.fixture(scope="module")
def runner(
    whisper_graphs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs, audio_context="fit")]},
        where="t.yaml",
        base_dir=tmp_path_factory.mktemp("asr"),
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    r = get_kind("asr").runner(plan.stage("asr"), config.stage("asr"))
    r.load()
    yield r
    r.close()


@pytest.mark.slow
@pytest.mark.ort
def test_a_pass_without_a_head_is_the_transcript_and_a_forced_head_leads_its_tokens(
    runner: Any,
) -> None:
    audio, rate = speak(SENTENCE)
    item = {"audio": audio, "sample_rate": rate}
    tokens = runner.decode_tokens(item)
    assert runner.text(tokens) == runner.transcribe(item)  # the same decode, without a head
    words = runner.text(tokens).split()
    begins = runner.word_starts(tokens)
    assert 0 in begins and len(begins) == len(words)
    # a head that is not what the audio says is kept as it is, and decoding goes on after it
    head = tokens[:2][::-1]
    forced = runner.decode_tokens(item, prefix=head)
    assert forced[:2] == head and len(forced) > 2


@pytest.mark.slow
@pytest.mark.ort
def test_a_pass_longer_than_a_window_is_refused_naming_the_stage(runner: Any) -> None:
    item = {"audio": np.zeros(31 * 16000, dtype=np.float32), "sample_rate": 16000}
    with pytest.raises(StageFailed, match="one window of 30 s at most") as err:
        runner.decode_tokens(item)
    assert err.value.stage == "asr"
