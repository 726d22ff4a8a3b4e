"""The ``logprobs`` sampling key: bounded as OpenAI's ``top_logprobs`` (0 to 20), returned by
llama.cpp and vLLM, and refused by name on the engine that does not return log-probabilities
(transformers) — never a reply without them. Their values are held by
``tests/orchestrator/server/test_serve_logprobs.py`` against a real serve (llama.cpp) and
``tests/stages/ar_decode/test_vllm_constrained.py`` on vLLM's runner."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import BadRequest
from stages.ar_decode.config import Sampling
from stages.ar_decode.engines import engine_for
from stages.requests import TOP_LOGPROBS_MAX


@pytest.mark.parametrize("backend", ["transformers-cpu", "transformers-cuda"])
def test_an_engine_that_returns_no_logprobs_refuses_them_by_name(backend: str) -> None:
    for top in (0, 5):
        with pytest.raises(BadRequest) as err:
            engine_for(backend).check_sampling({"logprobs": top}, backend)
        p = err.value.problems[0]
        assert p.where == "request.sampling.logprobs"
        assert f"{top}: the stage's backend {backend} cannot apply it" in p.what
        assert "llamacpp-cpu" in p.fix and "vllm" in p.fix and "logprobs" in p.fix
    engine_for(backend).check_sampling({}, backend)  # not asked: nothing to refuse


def test_llamacpp_returns_them() -> None:
    pytest.importorskip("llama_cpp")
    assert engine_for("llamacpp-cpu").check_sampling({"logprobs": 20}, "llamacpp-cpu") is None


@pytest.mark.parametrize("backend", ["vllm-cpu", "vllm-cuda"])
def test_vllm_returns_them(backend: str) -> None:
    for top in (0, TOP_LOGPROBS_MAX):  # taken: no grammar, no refusal
        assert engine_for(backend).check_sampling({"logprobs": top}, backend) is None


def test_the_alternatives_are_bounded_as_openais_top_logprobs() -> None:
    assert Sampling(logprobs=TOP_LOGPROBS_MAX).logprobs == 20 and Sampling().logprobs is None
    for bad in (-1, TOP_LOGPROBS_MAX + 1):
        with pytest.raises(ValueError, match="logprobs"):
            Sampling(logprobs=bad)
