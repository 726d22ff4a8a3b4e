"""The first-audio trace's arithmetic (``orchestrator.runtime.hop``), on token streams and
stamps written by hand: which token ended the sentence, which one released it, and the
steps between the two stages. No Ray and no clock: every stamp is the test's own."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.runtime.hop import STEPS, EdgeTrace, first_chunk_hop, same_clock
from stages.text_chunks import SentenceChunker

TOKENS = ["The", " sky", " is", " blue", ".", " It", " scatters", " light", "."]


def _release(tokens: list[str]) -> tuple[Any, list[str]]:
    """Feed ``tokens`` as the runtime's pump does; the first chunk's record and the chunks."""
    chunker, trace = SentenceChunker(), EdgeTrace("thinker")
    arrived = [10.0 + i for i in range(len(tokens))]  # output i reached the driver at 10 + i s
    chunks: list[str] = []
    first = None
    for i, token in enumerate(tokens):
        trace.fed(i, token)
        cut = chunker.feed(token)
        if cut and trace.open:
            first = trace.released(chunker.pending_chars, arrived[: i + 1])
        chunks += cut
    rest = chunker.flush()
    if rest and trace.open:
        first = trace.released(0, arrived, at_end=True)
    return first, chunks + rest


def test_the_sentence_is_traced_to_the_token_that_ended_it_and_the_one_that_released_it() -> None:
    first, chunks = _release(TOKENS)
    assert chunks == ["The sky is blue.", "It scatters light."]
    # "." (output 4) ends the sentence; the chunker can only tell once " It" (output 5) shows an
    # upper-case word after it, so that output releases it
    assert (first.token_index, first.release_index, first.at_end) == (4, 5, False)
    assert (first.token_arrived, first.release_arrived) == (14.0, 15.0)


def test_a_terminator_inside_a_token_is_found_in_that_token() -> None:
    first, chunks = _release(["The sky is blue. It", " scatters", " light."])
    assert chunks[0] == "The sky is blue."
    assert (first.token_index, first.release_index) == (
        0,
        0,
    )  # ended and released by the same output


def test_a_reply_of_one_sentence_is_released_by_the_end_of_the_stream() -> None:
    first, chunks = _release(["Ottawa", " is", " the", " capital", "."])
    assert chunks == ["Ottawa is the capital."]
    assert first.at_end and first.token_index == 4 and first.release_index is None


def _stamps(**runner: float) -> dict[str, Any]:
    return {
        "first_fed": 15.6,
        "first_taken": 15.7,
        "emitted": [16.9, 18.0],
        "runner": runner or None,
    }


def test_the_steps_add_up_to_the_whole_hop() -> None:
    first, _ = _release(TOKENS)
    first.token_emitted = 13.9
    first.released = 15.5
    runner = {
        "dispatched": 15.7,
        "started": 15.75,
        "preprocessed": 15.8,
        "ran": 16.8,
        "run_s": 0.9,
        "postprocessed": 16.85,
    }
    hop = first_chunk_hop(first, _stamps(**runner), voice_arrived=17.0, t0=9.0)
    assert hop is not None and list(hop["steps_s"]) == list(STEPS)
    steps = hop["steps_s"]
    assert steps["to_driver"] == pytest.approx(0.1) and steps["held"] == pytest.approx(1.0)
    assert steps["chunk"] == pytest.approx(0.5) and steps["feed"] == pytest.approx(0.1)
    assert steps["session_run"] == pytest.approx(0.9) and steps["session_bridge"] == pytest.approx(
        0.1
    )
    assert steps["to_driver_audio"] == pytest.approx(0.1)
    assert sum(steps.values()) == pytest.approx(hop["total_s"]) and hop["total_s"] == pytest.approx(
        17.0 - 13.9
    )
    assert hop["released_by"] == "output 5" and hop["token_index"] == 4
    assert (
        hop["sentence_token_s"],
        hop["first_sentence_s"],
        hop["first_output_s"],
    ) == pytest.approx((5.0, 6.5, 8.0))


def test_a_consumer_without_runner_stamps_gets_one_in_stage_step() -> None:
    first, _ = _release(TOKENS)
    first.token_emitted, first.released = 13.9, 15.5
    hop = first_chunk_hop(first, _stamps(), voice_arrived=17.0, t0=9.0)
    assert hop is not None and hop["steps_s"]["in_stage"] == pytest.approx(16.9 - 15.7)
    assert "session_run" not in hop["steps_s"]
    assert sum(hop["steps_s"].values()) == pytest.approx(hop["total_s"])


def test_no_hop_without_the_stamps_it_needs() -> None:
    first, _ = _release(TOKENS)
    assert (
        first_chunk_hop(first, _stamps(), 17.0, 9.0) is None
    )  # the producer's emit stamp never came
    first.token_emitted = 13.9
    assert first_chunk_hop(first, {**_stamps(), "first_fed": None}, 17.0, 9.0) is None
    assert first_chunk_hop(first, {**_stamps(), "emitted": []}, 17.0, 9.0) is None


def test_stamps_are_compared_only_on_one_clock() -> None:
    assert same_clock("cpu", "gpu:0") and same_clock("desk/cpu", "desk/gpu:0")
    assert not same_clock("desk/cpu", "laptop/cpu") and not same_clock("cpu", "laptop/cpu")


def _firsts(rt: Any, at: str | None, to: dict[str, str]) -> list[Any]:
    """The thinker's router for one request served by the actors ``at`` (the thinker's) and
    ``to`` (its consumers'), fed ``TOKENS``: the first chunk handed with each delivery."""
    import asyncio

    from orchestrator.runtime.router import Router

    handed: list[Any] = []

    async def deliver(r: Any, items: list[Any], end: bool, first: Any) -> None:
        handed.append(first)

    async def go() -> None:
        router = Router(rt.route_tables["thinker"], deliver, at=at, to=to)
        for token in TOKENS:
            port, payload, _final = router.take(token)
            await router.route(port, payload)
        await router.finish()

    asyncio.run(go())
    return [f for f in handed if f is not None]


def test_the_hop_is_traced_only_when_the_request_s_consumer_replica_shares_the_clock(
    tmp_path: Any,
) -> None:
    """The voice's replicas on two nodes (``head/cpu``, ``second/cpu``), the thinker on the
    head: a request the second node's replica serves is not traced (its stamps are on another
    clock), one the head's serves is; the thinker on the second node: the reverse. Which
    replica is replica 0 does not decide it."""
    import dataclasses

    from orchestrator.runtime.runtime import Runtime
    from tests.helpers.echo import echo_pipeline

    def runtime(thinker: str) -> Runtime:
        plan, config = echo_pipeline(tmp_path, voice_replicas=("head/cpu", "second/cpu"))
        stages = tuple(
            dataclasses.replace(s, device=thinker) if s.name == "thinker" else s
            for s in plan.stages
        )
        return Runtime(dataclasses.replace(plan, stages=stages), config)

    on_head = runtime("head/cpu")
    assert _firsts(on_head, "head/cpu", {"voice": "second/cpu"}) == []
    (first,) = _firsts(on_head, "head/cpu", {"voice": "head/cpu"})
    assert first.producer == "thinker" and first.token_index == 4
    assert len(_firsts(on_head, "head/cpu", {"voice": "head/cpu#1"})) == 1  # a 2nd actor there
    on_second = runtime("second/cpu")
    assert len(_firsts(on_second, "second/cpu", {"voice": "second/cpu"})) == 1
    assert _firsts(on_second, "second/cpu", {"voice": "head/cpu"}) == []
