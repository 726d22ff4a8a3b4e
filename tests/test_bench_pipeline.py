"""bench/pipeline.py's report for any reply the model may give: an empty one, one
sentence, several. Only the report is exercised here (no model): the figures a
reply lacks are printed as n/a and their targets are not evaluated."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.helpers.bench import load_bench

MiB = 2**20


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("pipeline")


RECORD = {
    "runtime": {
        "ray": {"memory": {"bytes": 500 * MiB, "measure": "test"}},
        "startup": {"start_s": 14.0},
    },
    "stages": [
        {"stage": "thinker", "budget_bytes": 1500 * MiB, "measured_peak_bytes": 1200 * MiB},
        {"stage": "voice", "budget_bytes": 700 * MiB, "measured_peak_bytes": 600 * MiB},
    ],
    "versions": {},
}


def empty(total: float) -> dict[str, Any]:
    """What the three variants return for a reply with no text: no token, sentence or audio."""
    return {
        "ttft": None,
        "ttfa": None,
        "total": total,
        "chunks": 0,
        "audio_s": 0.0,
        "text": "",
        "first_sentence": None,
        "first_sentence_tts": None,
        "first_sentence_tts_in_stage": None,
        "critical_path_overhead": None,
        "text_done": total,
    }


def spoken(total: float, sentence: float, tts: float, chunks: int) -> dict[str, Any]:
    return {
        "ttft": 0.05,
        "ttfa": sentence + tts,
        "total": total,
        "chunks": chunks,
        "audio_s": 2.0,
        "text": "A reply.",
        "first_sentence": sentence,
        "first_sentence_tts": tts,
        "first_sentence_tts_in_stage": tts - 0.004,
        "critical_path_overhead": 0.004,
    }


def test_an_empty_reply_reports_n_a_and_evaluates_only_what_it_has(bench: ModuleType) -> None:
    lines, doc, ok = bench.report(
        "Say nothing.",
        1,
        [empty(0.05)],
        [empty(0.05)],
        [empty(0.06)],
        RECORD,
        {"held_bytes": 0},
        7.0,
        14.0,
    )
    text = "\n".join(lines)
    assert (
        "time to first audio" in text and "first sentence complete at n/a, its TTS took n/a" in text
    )
    assert "target first audio (b) <= n/a + n/a + 0.100 = n/a: n/a n/a" in text
    assert "the replies had nothing to speak" in text
    assert (
        "target total (b)/(a) <= 1.10: 1.20 FAIL" in text
    )  # what the runs do have is still judged
    assert doc["targets"] == {"total": False, "ttfa": None, "memory": True, "in_run_overhead": None}
    assert not ok


def test_a_one_sentence_reply_is_judged_like_any_other(bench: ModuleType) -> None:
    one = spoken(1.0, sentence=0.9, tts=0.2, chunks=1)
    lines, doc, ok = bench.report(
        "Hi.", 1, [one], [one], [one], RECORD, {"held_bytes": 0}, 7.0, 14.0
    )
    text = "\n".join(lines)
    assert "n/a" not in text and "sentences spoken per reply: (a) 1, (a2) 1, (b) 1" in text
    assert "target first audio (b) <= 0.900 + 0.200 + 0.100 = 1.200 s: 1.100 s PASS" in text
    assert (
        doc["targets"] == {"total": True, "ttfa": True, "memory": True, "in_run_overhead": True}
        and ok
    )
