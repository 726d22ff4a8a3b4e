"""The sentence chunker against pysbd and stream2sentence, streamed, on one corpus.

    python bench/text_chunks.py [--delta-chars 4] [--json FILE]

(pysbd and stream2sentence are not dependencies: ``pip install pysbd
stream2sentence emoji`` into any folder on ``PYTHONPATH``; a missing one is
reported as such.) Every reply of ``tests/stages/sentence_corpus.py`` (hand-made
splits in English, German, Chinese, Japanese) is fed ``--delta-chars``
characters at a time, as a decoder streams it:

* **omni-edge**: ``stages.text_chunks.SentenceChunker`` (no language hint);
* **pysbd**: ``Segmenter(language=<the reply's language>)`` re-run on the
  text not yet emitted at every delta, emitting all its segments but the last
  (which may still grow) — pysbd has no streaming mode, this is how one
  streams it;
* **stream2sentence**: ``generate_sentences`` (rule-based tokenizer, the
  reply's language), with its defaults and with its merging of short sentences
  turned off (``minimum_sentence_length=1``, ``minimum_first_fragment_length=1``).

Reported per chunker: replies split exactly as expected, boundaries right
(recall) and false cuts, lag (characters fed after a sentence's end before it
was emitted: what the voice waits for, mean), and CPU time per delta (mean over
the corpus, and on one long reply: every corpus reply of a language joined).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stages.text_chunks import SentenceChunker
from tests.stages.sentence_corpus import CORPUS, text_of

Streamer = Callable[[list[str], str], Iterator[tuple[int, str]]]
"""(deltas, language) → (deltas fed so far, sentence) as each sentence is emitted."""


def omni_edge(deltas: list[str], language: str) -> Iterator[tuple[int, str]]:
    c = SentenceChunker()
    for n, d in enumerate(deltas, 1):
        for s in c.feed(d):
            yield n, s
    for s in c.flush():
        yield len(deltas), s


def pysbd_streamed(deltas: list[str], language: str) -> Iterator[tuple[int, str]]:
    import pysbd

    seg = pysbd.Segmenter(language=language, clean=False)
    pending = ""
    for n, d in enumerate(deltas, 1):
        pending += d
        parts = seg.segment(pending)
        for s in parts[:-1]:
            yield n, s.strip()
        pending = pending[sum(len(s) for s in parts[:-1]) :]
    for s in seg.segment(pending) if pending.strip() else []:
        yield len(deltas), s.strip()


def _s2s(deltas: list[str], language: str, **kw: Any) -> Iterator[tuple[int, str]]:
    from stream2sentence import generate_sentences

    fed = [0]

    def source() -> Iterator[str]:
        for d in deltas:
            fed[0] += 1
            yield d

    for s in generate_sentences(source(), language=language, **kw):
        yield fed[0], s.strip()


def s2s_default(deltas: list[str], language: str) -> Iterator[tuple[int, str]]:
    return _s2s(deltas, language)


def s2s_unmerged(deltas: list[str], language: str) -> Iterator[tuple[int, str]]:
    return _s2s(deltas, language, minimum_sentence_length=1, minimum_first_fragment_length=1)


CHUNKERS: dict[str, Streamer] = {
    "omni-edge": omni_edge,
    "pysbd": pysbd_streamed,
    "stream2sentence": s2s_default,
    "stream2sentence (no merging)": s2s_unmerged,
}


def _ends(language: str, sentences: list[str]) -> set[int]:
    """Sentence ends as offsets into the reply, without the last (the end of the text)."""
    sep = 1 if text_of(language, ["a", "b"]) == "a b" else 0
    out, pos = set(), 0
    for s in sentences[:-1]:
        pos += len(s)
        out.add(pos)
        pos += sep
    return out


def _split(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


def evaluate(name: str, fn: Streamer, delta_chars: int) -> dict[str, Any]:
    exact = right = expected = false_cuts = 0
    lags: list[int] = []
    cpu, n_deltas = 0.0, 0
    for language, sentences in CORPUS:
        text = text_of(language, sentences)
        deltas = _split(text, delta_chars)
        t0 = time.perf_counter()
        got = list(fn(deltas, language))
        cpu += time.perf_counter() - t0
        n_deltas += len(deltas)
        got_sentences = [s for _, s in got]
        exact += got_sentences == sentences
        want = _ends(language, sentences)
        have = (
            _ends(language, got_sentences)
            if "".join(got_sentences).replace(" ", "") == text.replace(" ", "")
            else set()
        )
        right += len(want & have)
        expected += len(want)
        false_cuts += len(have - want)
        pos = 0
        for (fed, s), sep in zip(
            got, [1 if language in ("en", "de") else 0] * len(got), strict=True
        ):
            pos = text.find(s, pos) + len(s)
            lags.append(max(0, min(fed * delta_chars, len(text)) - pos))
            pos += sep
    long_us = {}
    for language in ("en", "de", "zh", "ja"):
        long_text = text_of(language, [s for lang, ss in CORPUS if lang == language for s in ss])
        deltas = _split(long_text, delta_chars)
        t0 = time.perf_counter()
        list(fn(deltas, language))
        long_us[language] = round((time.perf_counter() - t0) / len(deltas) * 1e6, 1)
    return {
        "chunker": name,
        "replies": len(CORPUS),
        "exact": exact,
        "boundaries": expected,
        "right": right,
        "false_cuts": false_cuts,
        "mean_lag_chars": round(sum(lags) / max(1, len(lags)), 2),
        "us_per_delta": round(cpu / n_deltas * 1e6, 1),
        "us_per_delta_long_reply": long_us,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--delta-chars", type=int, default=4, help="characters per streamed delta (a token is ~4)"
    )
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = []
    for name, fn in CHUNKERS.items():
        try:
            rows.append(evaluate(name, fn, args.delta_chars))
        except ImportError as exc:
            print(f"{name}: not installed ({exc.name})", file=sys.stderr)
    print(
        f"{'chunker':30} {'exact':>7} {'bounds':>7} {'false':>5} {'lag':>5} {'µs/Δ':>7}  µs/Δ long (en de zh ja)"
    )
    for r in rows:
        long = " ".join(f"{v:g}" for v in r["us_per_delta_long_reply"].values())
        print(
            f"{r['chunker']:30} {r['exact']:>3}/{r['replies']:<3} {r['right']:>3}/{r['boundaries']:<3} "
            f"{r['false_cuts']:>5} {r['mean_lag_chars']:>5} {r['us_per_delta']:>7}  {long}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
