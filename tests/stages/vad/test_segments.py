"""The segmentation rules on probabilities built to have the property each test names:
speech starts at the threshold, ends after a pause of min_silence, short blips are dropped,
pads never overlap, long speech is cut at max_segment, and the end of input closes speech."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.vad.segments import Segmenter, SegmentRules

W = 10
"""Samples per window in these tests (the stage's is 512)."""


def run(probs: list[float], rules: SegmentRules) -> list[tuple[int, int]]:
    seg = Segmenter(rules)
    out = [s for p in probs for s in seg.push(p)]
    return out + seg.finish()


def rules(**kw: int | float | None) -> SegmentRules:
    base: dict[str, int | float | None] = {
        "window": W,
        "threshold": 0.5,
        "min_speech": 30,
        "min_silence": 40,
        "pad": 10,
        "max_segment": None,
    }
    base.update(kw)
    return SegmentRules(**base)  # type: ignore[arg-type]


def test_two_utterances_split_at_a_pause_with_pads() -> None:
    probs = [0.0] * 5 + [0.9] * 6 + [0.0] * 6 + [0.9] * 4 + [0.0] * 5
    # speech windows 5-10 (samples 50-110), pause from 110, 4 windows of silence close it at 150
    assert run(probs, rules()) == [(40, 120), (160, 220)]


def test_a_pause_shorter_than_min_silence_stays_inside() -> None:
    probs = [0.9] * 5 + [0.0] * 3 + [0.9] * 5 + [0.0] * 5
    assert run(probs, rules()) == [(0, 140)]


def test_hysteresis_keeps_soft_windows_inside_speech() -> None:
    probs = [0.9] * 4 + [0.4] * 6 + [0.9] * 4 + [0.0] * 4
    # 0.4 is below the threshold but above threshold - 0.15: not a pause
    assert run(probs, rules()) == [(0, 150)]


def test_a_blip_shorter_than_min_speech_is_dropped() -> None:
    assert run([0.0] * 3 + [0.9] * 2 + [0.0] * 8, rules()) == []


def test_silence_only_yields_nothing() -> None:
    assert run([0.1] * 50, rules()) == []


def test_the_end_of_input_closes_open_speech_at_the_last_sample() -> None:
    seg = Segmenter(rules())
    for p in [0.0] * 2 + [0.9] * 5:
        assert seg.push(p) == []
    assert seg.finish(total=65) == [(10, 65)]


def test_the_start_pad_never_reaches_into_the_previous_segment() -> None:
    r = rules(pad=40, min_silence=40)
    probs = [0.9] * 4 + [0.0] * 4 + [0.9] * 4 + [0.0] * 4
    a, b = run(probs, r)
    assert a == (0, 80) and b[0] == 80


def test_long_speech_is_cut_at_max_segment_contiguously() -> None:
    out = run([0.9] * 25 + [0.0] * 5, rules(max_segment=100))
    assert out[0] == (0, 100) and out[1] == (100, 200)
    assert all(b - a <= 100 for a, b in out)
    assert [a for a, _ in out[1:]] == [b for _, b in out[:-1]]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"pad": 50, "min_silence": 40}, "must not exceed min_silence"),
        ({"threshold": 1.0}, "strictly between 0 and 1"),
        ({"neg_threshold": 0.7}, r"neg_threshold must lie in \[0, threshold\]"),
        ({"max_segment": 30}, "two windows and both pads"),
    ],
)
def test_impossible_rules_are_refused(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rules(**kw)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1), max_size=120),
    st.integers(0, 4),
    st.integers(1, 6),
    st.integers(0, 4),
    st.one_of(st.none(), st.integers(4, 20)),
)
def test_segments_are_ordered_disjoint_bounded_and_within_what_was_heard(
    probs: list[float],
    pad_w: int,
    silence_w: int,
    speech_w: int,
    max_w: int | None,
) -> None:
    pad = min(pad_w, silence_w) * W
    max_segment = None if max_w is None else max(max_w * W, 2 * W + 2 * pad)
    r = rules(pad=pad, min_silence=silence_w * W, min_speech=speech_w * W, max_segment=max_segment)
    out = run(probs, r)
    heard = len(probs) * W
    for a, b in out:
        assert 0 <= a < b <= heard
        if max_segment is not None:
            assert b - a <= max_segment
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(out))
    if all(p < 0.5 for p in probs):
        assert out == []


def test_the_pending_segment_is_known_once_the_pause_has_its_pad() -> None:
    seg = Segmenter(rules())
    for p in [0.0] * 5 + [0.9] * 6:  # speech from sample 50 to 110
        seg.push(p)
    assert seg.pending() is None  # no pause yet
    seg.push(0.0)  # the pause starts at 110; 10 samples of it heard: the pad
    assert seg.pause_start == 110
    assert seg.pending() == (40, 120)
    assert seg.push(0.0) == [] and seg.pending() == (40, 120)
    seg.push(0.9)  # speech resumes: no pause, nothing pending
    assert seg.pause_start is None and seg.pending() is None


def test_nothing_is_pending_for_speech_too_short_to_keep() -> None:
    seg = Segmenter(rules())
    for p in [0.9] * 2 + [0.0] * 2:  # 20 samples of speech: under min_speech (30)
        seg.push(p)
    assert seg.pause_start == 20 and seg.pending() is None
    assert seg.closing() is None


def test_the_closing_segment_is_known_as_the_pause_begins_before_its_pad() -> None:
    """What a session with its own transcript answers early: the same bounds ``pending`` gives
    once the pad is heard, known a window sooner."""
    seg = Segmenter(rules(pad=20, min_silence=40))
    for p in [0.0] * 5 + [0.9] * 6:  # speech from sample 50 to 110
        seg.push(p)
    assert seg.closing() is None  # no pause yet
    seg.push(0.0)  # the pause starts at 110; 10 of its 20 samples of pad heard
    assert seg.closing() == (30, 130) and seg.pending() is None
    seg.push(0.0)
    assert seg.pending() == seg.closing() == (30, 130)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0, 1), max_size=120), st.integers(0, 4), st.integers(1, 6), st.integers(0, 4)
)
def test_a_pending_segment_is_exactly_the_segment_its_pause_closes(
    probs: list[float],
    pad_w: int,
    silence_w: int,
    speech_w: int,
) -> None:
    """What a realtime session's early response answers is the turn that closes, when it closes."""
    pad = min(pad_w, silence_w) * W
    seg = Segmenter(rules(pad=pad, min_silence=silence_w * W, min_speech=speech_w * W))
    for p in probs:
        pending = seg.pending()
        closed = seg.push(p)
        if pending is not None and closed:
            assert closed == [pending]
        if closed:
            assert seg.pending() is None


def test_a_pause_limited_shorter_closes_the_segment_with_the_same_bounds() -> None:
    """An utterance judged complete: its pause limited to 2 windows closes it 2 windows after the
    pause began, where a pause of ``min_silence`` would have closed it later with the same bounds."""
    probs = [0.0] * 2 + [0.9] * 5 + [0.0] * 6
    whole = run(probs, rules())
    seg = Segmenter(rules())
    out: list[tuple[int, int]] = []
    for i, p in enumerate(probs):
        out += seg.push(p)
        if i == 7:  # one window into the pause (it began at window 7)
            assert seg.limit_pause(2 * W) == []
            assert seg.pause_limit == 2 * W
        if out:
            closed_at = i
            break
    assert out == whole == [(10, 80)]
    assert closed_at == 8  # the pause's second window: 2 windows heard
    # no pause is open now: a limit has nothing to apply to, and the next pause has min_silence
    assert seg.limit_pause(W) == [] and seg.pause_limit == 40


def test_a_limit_given_after_the_pause_lasted_longer_closes_at_once() -> None:
    seg = Segmenter(rules())
    for p in [0.9] * 5 + [0.0] * 3:  # a pause of 3 windows, under min_silence's 4
        assert seg.push(p) == []
    assert seg.limit_pause(2 * W) == [(0, 60)]
    assert seg.finish() == []


def test_a_pause_limit_ends_with_the_pause_and_is_clamped_to_pad_and_min_silence() -> None:
    """Speech resuming ends the limited pause: the next pause waits ``min_silence`` again. A limit
    below the pad is the pad (the end pad is cut from the pause), above ``min_silence`` it is that."""
    seg = Segmenter(rules(pad=20))
    for p in [0.9] * 5 + [0.0]:
        seg.push(p)
    assert seg.limit_pause(0) == [] and seg.pause_limit == 20  # the pad
    assert seg.push(0.9) == []  # speech resumed before the pause lasted the pad
    assert seg.pause_limit == 40
    out = [s for p in [0.0] * 3 for s in seg.push(p)]
    assert out == []  # 3 windows: under min_silence, the old limit is gone
    assert seg.limit_pause(10_000) == [] and seg.pause_limit == 40
    assert seg.push(0.0) == [(0, 90)]


@settings(max_examples=300, deadline=None)
@given(
    probs=st.lists(st.sampled_from([0.0, 0.3, 0.45, 0.9]), min_size=1, max_size=60),
    limits=st.lists(st.integers(min_value=0, max_value=60), min_size=60, max_size=60),
)
def test_limited_pauses_keep_the_segments_in_order_and_within_the_heard(
    probs: list[float], limits: list[int]
) -> None:
    """Whatever limits are given and when, segments stay ordered, disjoint and within the
    samples heard, and each holds at least min_speech of speech before its pads."""
    r = rules()
    seg = Segmenter(r)
    out: list[tuple[int, int]] = []
    for p, lim in zip(probs, limits, strict=False):
        out += seg.push(p)
        out += seg.limit_pause(lim)
    out += seg.finish()
    for (_, b), (c, _) in itertools.pairwise(out):
        assert b <= c
    for a, b in out:
        assert 0 <= a < b <= seg.heard
        assert b - a >= r.min_speech


def test_the_pause_span_is_known_when_the_pause_begins_and_is_what_it_closes() -> None:
    seg = Segmenter(rules(pad=20))
    for p in [0.9] * 5:
        seg.push(p)
    assert seg.pause_span() is None  # no pause
    seg.push(0.0)  # the pause begins at 50: its pad not heard yet, nothing pending
    assert seg.pause_span() == (0, 70) and seg.pending() is None
    seg.push(0.0)
    assert seg.pending() == seg.pause_span() == (0, 70)
    assert [s for p in [0.0] * 2 for s in seg.push(p)] == [(0, 70)]
    assert seg.pause_span() is None
