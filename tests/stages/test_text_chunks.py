"""Sentences out of a stream of deltas: what a TTS stage receives."""

from __future__ import annotations

import asyncio

import pytest

from stages.text_chunks import FIRST_MIN_CUT_CHARS, SentenceChunker, chunk_text, split_text
from tests.stages.sentence_corpus import CORPUS, text_of

REPLY = (
    "The Moon is about 384,400 km away. It has no atmosphere! Dr. Smith said e.g. pi is 3.14, "
    'and J. R. R. Tolkien agreed... Really? "Yes."\n- one\n- two'
)
EXPECTED = [
    "The Moon is about 384,400 km away.",
    "It has no atmosphere!",
    "Dr. Smith said e.g. pi is 3.14, and J. R. R. Tolkien agreed...",
    "Really?",
    '"Yes."',
    "- one",
    "- two",
]


def test_sentences_abbreviations_numbers_initials_and_lines() -> None:
    assert split_text(REPLY) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_the_cut_does_not_depend_on_how_the_text_is_split_into_deltas(size: int) -> None:
    c = SentenceChunker()
    out = []
    for i in range(0, len(REPLY), size):
        out += c.feed(REPLY[i : i + size])
    assert out + c.flush() == EXPECTED


def test_a_sentence_is_emitted_as_soon_as_the_next_non_blank_character_arrives() -> None:
    c = SentenceChunker()
    assert c.feed("Hello there.") == []  # could still be "there.com"
    assert c.feed(" ") == []  # could still be "there. and" (a lowercase word: no sentence end)
    assert c.feed("And") == ["Hello there."]
    assert c.flush() == ["And"]


def test_a_long_clause_is_cut_at_a_clause_mark_then_at_a_space() -> None:
    text = "word " * 20 + "and then, " + "more " * 40
    chunks = split_text(text, max_chars=120)
    assert all(len(c) <= 120 for c in chunks)
    assert chunks[0].endswith("then,")
    assert " ".join(chunks).split() == text.split()  # nothing lost, order kept


def test_punctuation_alone_is_merged_into_the_next_chunk_and_dropped_at_the_end() -> None:
    assert split_text("*\n Hello world. ...") == ["* Hello world."]


def test_async_chunking_yields_while_the_stream_is_still_open() -> None:
    seen: list[tuple[int, str]] = []

    async def deltas():
        for i, d in enumerate(["One. ", "Two", ". Thr", "ee"]):
            seen.append((i, d))
            yield d

    async def main() -> list[tuple[int, str]]:
        out = []
        async for chunk in chunk_text(deltas()):
            out.append((len(seen), chunk))
        return out

    # "One." is out once the next word starts (2nd delta), "Two." with the 3rd, "Three" at the end.
    assert asyncio.run(main()) == [(2, "One."), (3, "Two."), (4, "Three")]


@pytest.mark.parametrize(
    ("language", "sentences"), CORPUS, ids=[f"{lang}{i}" for i, (lang, _) in enumerate(CORPUS)]
)
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_english_german_chinese_and_japanese_replies_are_cut_where_their_sentences_end(
    language: str, sentences: list[str], size: int
) -> None:
    """Abbreviations (z.B., z. B., ca., Dr., e.g.), decimals, ordinals (am 3. Mai),
    quotes after the terminator, CJK terminators without a space: the corpus's
    hand-made splits, whatever the delta size."""
    text = text_of(language, sentences)
    c = SentenceChunker()
    out = []
    for i in range(0, len(text), size):
        out += c.feed(text[i : i + size])
    assert out + c.flush() == sentences


def test_a_cjk_sentence_is_out_when_the_next_character_arrives_without_a_space() -> None:
    c = SentenceChunker()
    assert c.feed("今天天气很好。") == []
    assert c.feed("我") == ["今天天气很好。"]
    assert c.feed("们去公园吧。」") == []  # a closing quote still belongs to it
    assert c.feed("好") == ["我们去公园吧。」"]


def test_an_ordinal_waits_for_the_next_word_and_nothing_else_does() -> None:
    c = SentenceChunker()
    assert c.feed("Wir treffen uns am 3. Ma") == []  # "Mai" or "Man"?
    assert c.feed("i in Berlin. Kommst") == ["Wir treffen uns am 3. Mai in Berlin."]
    c = SentenceChunker()
    assert c.feed("Das sind 3. Ma") == []
    assert c.feed("n") == ["Das sind 3."]  # "Man" can no longer become an ordinal noun: out at once


def test_a_sentence_ending_in_a_number_is_out_with_the_next_token_not_the_one_after() -> None:
    """A decoder's tokens, by hand: "1982." ended the sentence, and " However" cannot begin an
    ordinal noun, so the sentence goes to the voice when " However" arrives. It waited for
    "," before (the whole next word), one decode step more."""
    c = SentenceChunker()
    out = [c.feed(t) for t in ["It", " opened", " in", " 198", "2", ".", " However", ",", " it"]]
    assert out[6] == ["It opened in 1982."] and all(o == [] for i, o in enumerate(out) if i != 6)
    c = SentenceChunker()
    out = [c.feed(t) for t in ["Es", " war", " am", " 3", ".", " Ma", "i", " in", " Berlin", "."]]
    assert all(o == [] for o in out)  # "Mai" after "3.": an ordinal, no sentence end
    assert c.flush() == ["Es war am 3. Mai in Berlin."]


def test_a_long_cjk_clause_is_cut_at_a_full_width_comma() -> None:
    text = "我们" * 30 + "，" + "他们" * 40
    chunks = split_text(text, max_chars=100)
    assert chunks[0] == "我们" * 30 + "，" and "".join(chunks) == text


def test_first_max_chars_cuts_only_the_first_chunk_at_a_clause_mark_or_space() -> None:
    text = "Well, the Moon is Earth's only natural satellite. It has no air at all, and no water either."
    chunker = SentenceChunker(first_max_chars=24)
    chunks = [
        c for i in range(0, len(text), 3) for c in chunker.feed(text[i : i + 3])
    ] + chunker.flush()
    # past 24 characters with no sentence end: cut at the last space within them ("Well," alone
    # would be shorter than FIRST_MIN_CUT_CHARS); every later chunk is a whole sentence
    assert chunks == [
        "Well, the Moon is",
        "Earth's only natural satellite.",
        "It has no air at all, and no water either.",
    ]
    assert " ".join(chunks) == text


def test_first_max_chars_leaves_a_first_sentence_shorter_than_it_whole() -> None:
    chunker = SentenceChunker(first_max_chars=40)
    chunks = [
        c for d in ["Sure", "!", " The", " Moon", " is", " bright", "."] for c in chunker.feed(d)
    ] + chunker.flush()
    assert chunks == ["Sure!", "The Moon is bright."]


def test_first_max_chars_must_leave_room_for_a_fragment() -> None:
    with pytest.raises(ValueError, match="first_max_chars"):
        SentenceChunker(first_max_chars=FIRST_MIN_CUT_CHARS)


def test_the_first_chunk_is_at_least_two_words_and_never_ends_inside_a_word() -> None:
    """A short ``first_max_chars``: "Certainly," alone (one word) is not a first chunk; the cut
    waits for the boundary after a second word. A first word longer than the limit is not cut
    inside: the first space after it that leaves two words ends the chunk."""
    chunker = SentenceChunker(first_max_chars=12)
    text = "Certainly, photosynthesis turns light into sugar. Plants need it."
    chunks = [c for ch in text for c in chunker.feed(ch)] + chunker.flush()
    assert chunks[0] == "Certainly, photosynthesis"
    assert all(len(c.split()) >= 2 for c in chunks)
    assert " ".join(chunks) == text
    long = SentenceChunker(first_max_chars=9)
    text = "Extraordinarily interesting question, really. Yes."
    chunks = [c for ch in text for c in long.feed(ch)] + long.flush()
    assert chunks[0] == "Extraordinarily interesting"
    assert " ".join(chunks) == text
