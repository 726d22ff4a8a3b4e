"""The payload vocabulary: spellings parse and round-trip, bad ones are named, edges match or say why."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stages.payloads import (
    PayloadSpecError,
    PayloadType,
    edge_mismatch,
    mismatch,
    parse_payload,
    parse_payloads,
    spell,
)
from stages.registry import get_kind


@pytest.mark.parametrize(
    "spec",
    [
        "text",
        "token_ids",
        "audio",
        "audio@16000",
        "tensor",
        "tensor:hidden_states",
        "tensor<float32>[seq,896]",
        "tensor<int64>[*,8]",
        "tensor[]",
        "event",
        "event:segment",
    ],
)
def test_spellings_round_trip(spec: str) -> None:
    assert str(parse_payload(spec)) == spec


@pytest.mark.parametrize(
    ("spec", "what"),
    [
        ("txt", "'txt' is not a payload kind; the kinds are text, token_ids, audio, tensor, event"),
        ("text@16000", "only audio has a sample rate"),
        ("audio<float32>", "only a tensor has a dtype and a shape"),
        ("text:prompt", "only a tensor or an event has a role"),
        ("tensor[seq,-1]", "axis '-1' is neither a size nor a name"),
        ("audio@0", "is not a payload type"),
    ],
)
def test_bad_spellings_say_what_is_wrong(spec: str, what: str) -> None:
    with pytest.raises(PayloadSpecError) as exc:
        parse_payload(spec)
    assert what in str(exc.value)


@pytest.mark.parametrize(
    ("produces", "consumes", "why"),
    [
        (["text"], ["text"], None),
        (["audio@22050"], ["audio"], None),
        (["audio"], ["audio@16000"], None),
        (["text", "tensor:hidden_states"], ["tensor<float32>[seq,896]"], None),
        (["tensor<float32>[seq,896]"], ["tensor<float32>[*,896]"], None),
        (["text"], ["audio@16000"], "text is not audio"),
        (["audio@22050"], ["audio@16000", "text"], "audio at 22050 Hz is not audio at 16000 Hz"),
        (["tensor<float16>"], ["tensor<float32>"], "float16 is not float32"),
        (["tensor[seq,896]"], ["tensor[seq,1024]"], "axis 1 has size 896, not 1024"),
        (["tensor[seq]"], ["tensor[1,seq]"], "a rank-1 tensor is not rank 2"),
        (
            ["tensor:hidden_states"],
            ["tensor:codec_codes"],
            "tensor 'hidden_states' is not 'codec_codes'",
        ),
        (["token_ids"], ["text"], "token_ids is not text"),
    ],
)
def test_edges_match_or_say_why(produces: list[str], consumes: list[str], why: str | None) -> None:
    assert edge_mismatch(parse_payloads(produces), parse_payloads(consumes)) == why


def test_kinds_declare_what_they_take_and_give() -> None:
    thinker = get_kind("ar_decode")
    assert (
        spell(parse_payloads(thinker.consumes)) == "text"
        and spell(parse_payloads(thinker.produces)) == "text"
    )
    graph = get_kind("exported_graph")  # per artifact: see test_config's typed-edge tests
    assert spell(parse_payloads(graph.consumes)) == "text or token_ids or audio or tensor or event"


@given(st.text(max_size=40))
def test_any_text_parses_or_is_a_named_spelling_error(spec: str) -> None:
    try:
        parsed = parse_payload(spec)
    except PayloadSpecError as exc:
        assert str(exc)
        return
    assert parse_payload(str(parsed)) == parsed


_NAME = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True)
_TYPES = st.one_of(
    st.builds(PayloadType, st.sampled_from(["text", "token_ids"])),
    st.builds(PayloadType, st.just("audio"), sample_rate=st.none() | st.integers(1, 192_000)),
    st.builds(PayloadType, st.sampled_from(["tensor", "event"]), role=st.none() | _NAME),
    st.builds(
        PayloadType,
        st.just("tensor"),
        role=st.none() | _NAME,
        dtype=st.none() | st.sampled_from(["float32", "float16", "int64"]),
        shape=st.none()
        | st.lists(st.sampled_from(["*", "seq", "1", "896"]), max_size=4).map(tuple),
    ),
)


@given(_TYPES)
def test_every_type_round_trips_and_feeds_itself(t: PayloadType) -> None:
    assert parse_payload(str(t)) == t
    assert mismatch(t, t) is None


@given(_TYPES, _TYPES)
def test_a_mismatch_is_refused_both_ways(a: PayloadType, b: PayloadType) -> None:
    assert (mismatch(a, b) is None) == (mismatch(b, a) is None)
