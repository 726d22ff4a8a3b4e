"""Items go stage to stage without the driver (``runtime.STREAMING == "direct"``): the
producer's device actor feeds its consumer's, and the driver reads only final outputs and
control events. The relay (``"relay"``, every item through the driver) is kept to compare:
both give the same events, edges and sentences. A dead consumer is named, never its
producer; a feed waiting on a full queue ends with the request; context stays first."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import StageFailed
from orchestrator.core.plan import StagePlan
from orchestrator.runtime import record
from orchestrator.runtime import runtime as runtime_mod
from orchestrator.runtime.actor_inputs import StreamRoute
from orchestrator.runtime.device_actor import DeviceActor
from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta, collect
from orchestrator.runtime.metering import Hosted
from orchestrator.runtime.router import RouteTable
from orchestrator.runtime.runtime import Runtime
from stages.base import StageRunner
from stages.requests import as_request
from tests.helpers.echo import echo_pipeline
from tests.orchestrator.runtime.test_graph_runtime import started

pytestmark = pytest.mark.ray

PROMPT = "hello"
WAIT_S = 30.0
"""The longest a test waits for a state it polls (a loaded machine is slow, never this slow)."""


def _start(tmp_path: Path, mode: str, *, thinker_final: bool = True, **kw: Any) -> Runtime:
    plan, config = echo_pipeline(tmp_path, voice_device="igpu:0", **kw)
    if not thinker_final:  # the thinker's text reaches only the voice: no final output
        stages = (dataclasses.replace(plan.stages[0], final_output=False), plan.stages[1])
        plan = dataclasses.replace(plan, stages=stages)
    patch = pytest.MonkeyPatch()
    patch.setattr(runtime_mod, "STREAMING", mode)
    try:
        rt = Runtime(plan, config)
    finally:
        patch.undo()
    rt.start()
    return rt


def _run(rt: Runtime, prompt: str = PROMPT) -> tuple[Any, list[Any]]:
    async def main() -> list[Any]:
        return [e async for e in rt.stream(as_request(prompt), request_id="r1")]

    events = asyncio.run(main())
    return collect("r1", prompt, events, 0.0), events


def _shape(events: list[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """What a client reads, per stage in order (two stages' events interleave as they come):
    each event's kind, and its text or samples."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for e in events:
        if isinstance(e, TextDelta):
            out.setdefault(e.stage, []).append(("text", e.text))
        elif isinstance(e, AudioChunk):
            out.setdefault(e.stage, []).append(("audio", e.index, e.audio.size, e.sample_rate))
        elif isinstance(e, StageEvent):
            out.setdefault(e.stage, []).append((e.kind,))
    return out


@pytest.mark.slow
def test_the_driver_feeds_nothing_and_reads_only_final_outputs(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = _start(tmp_path, "direct", thinker_final=False)
    try:
        result, events = _run(rt)
        doc = record.build(rt, [result])
    finally:
        rt.close()
    audio = [e for e in events if isinstance(e, AudioChunk)]
    assert audio and not [e for e in events if isinstance(e, TextDelta)]
    streaming = doc["runtime"]["streaming"]
    assert streaming["mode"] == "direct"
    assert streaming["driver"]["feeds_sent"] == 0  # every item went thinker → voice
    assert streaming["driver"]["items_read"] == len(
        audio
    )  # the voice's final outputs, nothing else
    assert streaming["driver"]["cpu_s"] > 0
    (edge,) = streaming["edges"]
    assert (edge["from"], edge["to"], edge["path"]) == ("thinker", "voice", "direct")
    assert edge["crossings_per_item"] == 0 and edge["node_crossings"] == 0  # one node
    # the voice still got its sentences, and the thinker's edge still counts them
    assert doc["edges"][0]["items"] == len(result.chunks) == len(audio)
    first = next(e for e in events if isinstance(e, StageEvent) and e.kind == "first_output")
    assert first.stage in ("thinker", "voice")  # the thinker's first output is still said


@pytest.mark.slow
def test_relay_and_direct_give_equal_events_edges_and_sentences(
    ray_cluster: Any, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}
    for mode in ("relay", "direct"):
        rt = _start(tmp_path / mode, mode)
        try:
            result, events = _run(rt)
            doc = record.build(rt, [result])
        finally:
            rt.close()
        seen[mode] = (_shape(events), doc, result)
    (relay_events, relay_doc, relay), (direct_events, direct_doc, direct) = (
        seen["relay"],
        seen["direct"],
    )
    assert direct_events == relay_events
    assert direct_doc["edges"] == relay_doc["edges"]
    assert direct.chunks == relay.chunks and direct.text == relay.text
    assert direct.stages["voice"]["chunks_in"] == relay.stages["voice"]["chunks_in"]
    assert direct.stages["thinker"]["edges_out"] == relay.stages["thinker"]["edges_out"]
    # the relay fed every sentence from the driver; the direct mode none
    assert relay_doc["runtime"]["streaming"]["driver"]["feeds_sent"] == len(relay.chunks)
    assert direct_doc["runtime"]["streaming"]["driver"]["feeds_sent"] == 0
    assert relay_doc["runtime"]["streaming"]["edges"][0]["path"] == "driver"


@pytest.mark.slow
@pytest.mark.parametrize("when", ["thinker_first_output", "first_audio"])
def test_killing_the_consumer_s_actor_names_the_consumer_never_the_producer(
    ray_cluster: Any, tmp_path: Path, when: str
) -> None:
    """Killed before the thinker has fed anything (its next feed meets a dead actor), or once
    audio flows (a feed may be in flight): either way the voice and its device are named."""
    rt = _start(
        tmp_path,
        "direct",
        thinker={"delay_s": 0.05},
        voice={"delay_s": 0.05, "restart": "never"},
    )
    try:

        async def main() -> BaseException | None:
            killed = False
            try:
                async for e in rt.stream(as_request(PROMPT)):
                    hit = (
                        isinstance(e, StageEvent)
                        and e.kind == "first_output"
                        and e.stage == "thinker"
                        if when == "thinker_first_output"
                        else isinstance(e, AudioChunk)
                    )
                    if hit and not killed:
                        rt.kill_device("igpu:0")
                        killed = True
            except StageFailed as exc:
                return exc
            return None

        exc = asyncio.run(main())
        assert isinstance(exc, StageFailed)
        assert (exc.stage, exc.device, exc.code) == ("voice", "igpu:0", "device_actor_died")
        assert not rt.devices["cpu"].dead and rt.devices["igpu:0"].dead
        snap = rt.ledger_snapshot()
        assert "voice" not in snap["holders"] and "thinker" in snap["holders"]
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0


@pytest.mark.slow
def test_cancel_ends_a_feed_waiting_on_a_full_queue(ray_cluster: Any, tmp_path: Path) -> None:
    """A voice slow by construction (a minute per sentence) and a thinker that yields at once:
    its feed waits on the voice's full queue. ``cancel`` on the voice's actor ends that feed
    with the stream (before, a feed was no task of the request and waited forever)."""
    rt = _start(tmp_path, "direct", voice={"delay_s": 60.0})
    voice = rt.devices["igpu:0"].actor
    prompt = " ".join(f"Sentence {i}." for i in range(12))
    import ray

    async def main() -> tuple[int, BaseException | None]:
        async def consume() -> None:
            async for _ in rt.stream(as_request(prompt), request_id="full"):
                pass

        task = asyncio.create_task(consume())
        deadline = time.monotonic() + WAIT_S
        while await voice.pending.remote("full") < 2:  # its stream, and a feed held back
            assert time.monotonic() < deadline, "the thinker's feed never waited on the voice"
            await asyncio.sleep(0.05)
        cancelled = await voice.cancel.remote("full")
        try:
            await asyncio.wait_for(task, WAIT_S)
        except StageFailed as exc:
            return cancelled, exc
        return cancelled, None

    try:
        cancelled, exc = asyncio.run(main())
        assert cancelled >= 2  # the stream and the waiting feed
        assert ray.get(voice.pending.remote("full")) == 0
        assert isinstance(exc, StageFailed)  # the request ended, it did not hang
    finally:
        rt.close()


@pytest.mark.slow
@pytest.mark.parametrize("second_device", ["cpu", "igpu:0"])
def test_context_comes_before_the_items_of_a_producer_that_yields_at_once(
    ray_cluster: Any, tmp_path: Path, second_device: str
) -> None:
    """The echo ``words`` kind answers ``You said`` + its inputs in the order it took them:
    the context's words come first, though the first stage yields its reply at once and feeds
    the second — in the same actor (a local call, ahead of any call from the driver) or in
    another — while the second's stream is being opened."""
    rt = started(
        ray_cluster,
        tmp_path,
        [
            {"name": "first", "kind": "echo", "mode": "words", "devices": ["cpu"]},
            {
                "name": "second",
                "kind": "echo",
                "mode": "words",
                "inputs": ["first"],
                "devices": [second_device],
                "final_output": True,
            },
        ],
    )
    history = {"second": [{"messages": [{"role": "user", "content": "one two three"}]}]}

    async def main() -> list[Any]:
        return [e async for e in rt.stream(as_request("hello there"), context=history)]

    try:
        assert rt.streaming == "direct"
        texts = []
        for _ in range(3):
            events = asyncio.run(main())
            texts.append(
                "".join(e.text for e in events if isinstance(e, TextDelta) and e.stage == "second")
            )
    finally:
        rt.close()
    for text in texts:
        assert text.startswith("You said one two three You said hello there."), text


class _Taken(StageRunner):
    """Yields its inputs in the order it took them."""

    def load(self) -> None:
        pass

    async def stream(self, request_id: str, inputs: Any) -> Any:
        async for item in inputs:
            yield item


def test_items_fed_before_the_consumer_s_stream_opens_still_come_after_its_context() -> None:
    """The race the direct mode has by construction: a producer's actor may feed the consumer
    before the driver's ``stream`` call (which carries the context) reaches it. The consumer's
    actor puts the context first whatever came before (no Ray: the actor's own methods)."""
    plan = StagePlan(
        name="second",
        kind="echo",
        admitted=True,
        device="cpu",
        backend="ort-cpu",
        route="this-process",
        reservations=(),
        refusals=(),
        engine_kwargs={},
        artifact={},
        inputs=("first",),
    )
    actor = DeviceActor("cpu", ledger=None)
    actor.stages["second"] = Hosted(
        plan=plan, runner=_Taken(), load_s=0.0, load_info={}, tree_load_peak=0, tree_resident=0
    )
    table = RouteTable("second", "cpu", ("text",), True, None, ())

    async def main() -> list[Any]:
        await actor.connect({}, {"second": table}, {})
        await actor.feed("second", "r", ["fed 1", "fed 2"], "first")  # the producer came first
        await actor.end_input("second", "r", "first")
        route = StreamRoute(to={}, context=["history"], request_item=None)
        return [m async for m in actor.stream("second", "r", None, route)]

    messages = asyncio.run(main())
    outputs = [x for kind, item in messages if kind in ("out", "outs") for x in _items(kind, item)]
    assert outputs == ["history", "fed 1", "fed 2"]
    kinds = [kind for kind, _ in messages]
    assert kinds[0] == "first" and kinds[-1] == "stats"
    assert set(kinds[1:-1]) <= {"out", "outs"}


def _items(kind: str, item: Any) -> list[Any]:
    return list(item) if kind == "outs" else [item]


def test_a_feed_that_found_its_consumer_s_actor_dead_is_said_as_the_consumer_s_death(
    tmp_path: Path,
) -> None:
    """The producer's side of a dead consumer, as it reaches the driver: the thinker's stream
    fails with ``PeerLost`` (its feed met the voice's dead actor). The request fails naming the
    voice and its device, which is marked dead; the thinker's actor is not blamed. (The race
    with the voice's own stream, which also fails, is the test above; this is the path when
    the producer's failure comes first.)"""
    from ray.exceptions import RayTaskError

    from orchestrator.core.errors import PeerLost
    from orchestrator.runtime.startup import Device

    plan, config = echo_pipeline(tmp_path, voice_device="igpu:0")
    rt = Runtime(plan, config)
    rt.devices = {
        "cpu": Device("cpu", None, {}, ["thinker"]),
        "igpu:0": Device("igpu:0", None, {}, ["voice"]),
    }
    lost = PeerLost("voice", "igpu:0", "igpu:0", "ActorDiedError: The actor died unexpectedly")
    exc = RayTaskError("stream", "", lost).as_instanceof_cause()
    failed = rt.map_failure(exc, "thinker", rt.devices["cpu"], "serving request r1")
    assert isinstance(failed, StageFailed)
    assert (failed.stage, failed.device, failed.code) == ("voice", "igpu:0", "device_actor_died")
    assert "serving request r1" in failed.cause and "ActorDiedError" in failed.cause
    assert rt.devices["igpu:0"].dead and not rt.devices["cpu"].dead


def test_final_outputs_that_come_together_go_together_and_none_waits_for_the_next() -> None:
    """``coalesce.routed_finals`` over a stage whose outputs are gated by the test: the first
    goes alone at once; two made while the window runs go as one message; an output made when
    no other follows (the stage waits at a gate the test opens only after seeing it) is sent by
    the timer, not held for the next; the routing saw every output in order."""
    from orchestrator.runtime.coalesce import routed_finals

    routed: list[str] = []

    async def main() -> list[tuple[str, Any]]:
        gate = asyncio.Event()
        got: list[tuple[str, Any]] = []

        async def outputs() -> Any:
            yield "a"
            yield "b"
            yield "c"
            await gate.wait()  # held until the test has seen "c"
            yield "d"

        async def route(x: str) -> None:
            routed.append(x)

        def take(x: str) -> Any:
            return x == "a", x.upper(), route(x)

        async for message in routed_finals(outputs(), take, window_s=0.05):
            got.append(message)
            if message[0] in ("out", "outs") and "C" in _items(*message):
                gate.set()
        return got

    got = asyncio.run(main())
    assert routed == ["a", "b", "c", "d"]
    assert got[0] == ("first", None)
    finals = [x for kind, item in got[1:] for x in _items(kind, item)]
    assert finals == ["A", "B", "C", "D"]
    assert got[-1] == ("out", "D")  # sent though nothing followed it


def test_the_last_outputs_go_as_the_stream_ends_not_when_the_window_would() -> None:
    """Outputs made inside a window wait for it, except when the stage's stream ends first: then
    they go at once. The window is 60 s and the test gives the stream 20 s: held for the window,
    the last output would come 40 s after the deadline, on any machine."""
    from orchestrator.runtime.coalesce import routed_finals

    async def turns() -> None:  # the sender's turns on the loop: it sends or starts its wait
        for _ in range(3):
            await asyncio.sleep(0)

    async def outputs() -> Any:
        yield "a"
        await turns()  # "a" goes at once, and its window starts
        yield "b"  # inside that window: waits for it, or for the end
        await turns()

    async def nothing() -> None:
        return None

    async def main() -> list[Any]:
        got: list[Any] = []
        async for message in routed_finals(outputs(), lambda x: (x == "a", x, nothing()), 60.0):
            got.append(message)
        return got

    got = asyncio.run(asyncio.wait_for(main(), 20.0))
    assert got == [("first", None), ("out", "a"), ("out", "b")]


def test_an_error_of_the_stage_comes_after_the_outputs_before_it() -> None:
    from orchestrator.runtime.coalesce import routed_finals

    async def outputs() -> Any:
        yield "a"
        raise ValueError("the stage broke")

    async def nothing() -> None:
        return None

    async def main() -> list[Any]:
        got: list[Any] = []
        with pytest.raises(ValueError, match="the stage broke"):
            async for message in routed_finals(outputs(), lambda x: (True, x, nothing())):
                got.append(message)
        return got

    assert asyncio.run(main()) == [("first", None), ("out", "a")]
