"""What the vLLM runner hands vLLM for a request's sampling: OpenAI's ``stop`` and penalties in
vLLM's own ``SamplingParams`` (vLLM cuts at the stop strings and applies the penalties itself).
No engine is started: the request is prepared as the runner prepares it, with the GGUF's
vocabulary standing in for the checkpoint's tokenizer (the prompt's tokens are not checked
here, only the parameters)."""

from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.core.plan import StagePlan
from stages.ar_decode.engines.vllm_runner import VllmRunner
from stages.ar_decode.gguf_vocab import gguf_vocab
from tests.helpers import REPO

pytest.importorskip("vllm")
pytest.importorskip("llama_cpp")


def test_stop_and_the_penalties_reach_vllms_sampling_params() -> None:
    stage = load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")
    plan = StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="vllm-cpu",
        route=None,
        reservations=(),
        refusals=(),
        engine_kwargs={"model": stage.model},
        artifact={},
    )
    runner = VllmRunner(plan, stage)
    runner._tokenizer = gguf_vocab(stage.model)
    sampling = {"stop": ["five", "six"], "presence_penalty": 0.5, "frequency_penalty": -1.0}
    _, params = runner._prepare([{"prompt": "Count to ten.", "sampling": sampling}])
    assert (params.stop, params.presence_penalty, params.frequency_penalty) == (
        ["five", "six"],
        0.5,
        -1.0,
    )
    _, plain = runner._prepare([{"prompt": "Count to ten."}])
    assert (plain.stop, plain.presence_penalty, plain.frequency_penalty) == ([], 0.0, 0.0)
