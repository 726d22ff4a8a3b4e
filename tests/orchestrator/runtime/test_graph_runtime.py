"""Graphs at run time: fan-out (one producer, several consumers, each with its own bounded
queue) and fan-in (a stage with several inputs and a join: zip, all, latest).

The join semantics and bounds are tested on ``orchestrator.runtime.joins.Joiner`` alone
(no Ray); then whole graphs run on real Ray actors with the weightless ``echo`` and
``join_echo`` test kinds, whose sources yield known counts of numbered items stamped
with the time they were produced, so order and back-pressure are checked by
construction, not by luck."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import PipelineConfig, load_config, parse_config
from orchestrator.core.errors import ConfigError, StageFailed
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import PipelinePlan, PoolPlan, StagePlan
from orchestrator.core.units import GiB, MiB
from orchestrator.runtime.actor_inputs import INPUT_QUEUE_ITEMS
from orchestrator.runtime.events import AudioChunk, OutputItem, StageEvent, TextDelta
from orchestrator.runtime.joins import JOIN_BUFFER_ITEMS, Joiner
from orchestrator.runtime.runtime import GENERATOR_BACKPRESSURE, Runtime
from stages.requests import as_request

# ---- plans by hand -----------------------------------------------------------------


def graph_pipeline(
    tmp_path: Path, stages: list[dict[str, Any]]
) -> tuple[PipelinePlan, PipelineConfig]:
    """``stages`` (config rows) as a config and a hand-written plan: every stage admitted on its
    first device, a decoder on llama.cpp's CPU backend and every other stage on ORT's."""
    config = parse_config(
        {"name": "graph", "stages": stages}, where=str(tmp_path / "graph.yaml"), base_dir=tmp_path
    )
    plans = []
    for s in config.stages:
        rs = (Reservation("host_ram", "weights", 1 * MiB, "session", "D", "test stage"),)
        plans.append(
            StagePlan(
                name=s.name,
                kind=s.kind,
                admitted=True,
                device=s.devices[0],
                backend="llamacpp-cpu" if s.kind == "ar_decode" else "ort-cpu",
                route="this-process",
                reservations=rs,
                refusals=(),
                engine_kwargs={},
                artifact={},
                inputs=tuple(s.inputs),
                final_output=s.final_output,
                final_output_type=s.final_output_type,
            )
        )
    shared = (
        Reservation(
            "host_ram", "ray_runtime", 900 * MiB, "session", "E", "estimate the runtime replaces"
        ),
    )
    plan = PipelinePlan(
        pipeline="graph",
        admitted=True,
        profile="test",
        stages=tuple(plans),
        pools=(PoolPlan("host_ram", 8 * GiB, 0, {}),),
        shared_reservations=shared,
    )
    return plan, config


def source(name: str, count: int, delay_s: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "join_echo",
        "mode": "count",
        "count": count,
        "delay_s": delay_s,
        "devices": ["cpu"],
        "final_output": True,
        **extra,
    }


def sink(inputs: list[str], join: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "sink",
        "kind": "join_echo",
        "mode": "report",
        "inputs": inputs,
        "join": join,
        "devices": ["cpu"],
        "final_output": True,
        **extra,
    }


# ---- the join alone (no Ray) -----------------------------------------------------------


async def _drive(
    joiner: Joiner, feeds: dict[str, list[Any]], gaps: dict[str, float] | None = None
) -> list[Any]:
    async def produce(src: str) -> None:
        for item in feeds[src]:
            await asyncio.sleep((gaps or {}).get(src, 0.0))
            await joiner.put(src, item)
        await joiner.end(src)

    async def consume() -> list[Any]:
        return [item async for item in joiner.joined()]

    out, *_ = await asyncio.gather(consume(), *(produce(s) for s in feeds))
    return list(out)


def test_zip_pairs_the_ith_items_in_order_and_counts_the_unpaired() -> None:
    j = Joiner("sink", "cpu", "zip", ["a", "b"])
    out = asyncio.run(_drive(j, {"a": list(range(10)), "b": ["x", "y", "z"]}, {"b": 0.002}))
    assert out == [{"a": 0, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "z"}]
    assert j.stats()["unpaired"] == {"a": 7} and j.stats()["joined"] == 3


def test_zip_bounds_an_input_that_runs_ahead() -> None:
    """a has 50 items at once, b one every 2 ms: a waits in put, never more than the buffer ahead."""
    j = Joiner("sink", "cpu", "zip", ["a", "b"], buffer_items=3)
    out = asyncio.run(_drive(j, {"a": list(range(50)), "b": list(range(50))}, {"b": 0.002}))
    assert [o["a"] for o in out] == list(range(50)) == [o["b"] for o in out]
    assert j.stats()["ahead_max"]["a"] == 3  # reached, never passed


def test_all_waits_for_every_input_and_hands_over_whole_outputs() -> None:
    j = Joiner("sink", "cpu", "all", ["request", "a", "b"])
    out = asyncio.run(_drive(j, {"request": ["hi"], "a": [1, 2, 3], "b": []}, {"a": 0.001}))
    assert out == [{"request": ["hi"], "a": [1, 2, 3], "b": []}]


def test_all_fails_the_request_past_its_bound_naming_the_joined_stage() -> None:
    j = Joiner("sink", "cpu", "all", ["a", "b"], all_items=5)
    with pytest.raises(StageFailed) as exc:
        asyncio.run(_drive(j, {"a": list(range(6)), "b": []}))
    assert exc.value.stage == "sink" and "join: all keeps every item" in str(exc.value)


def test_latest_emits_on_every_item_with_absent_inputs_left_out() -> None:
    j = Joiner("sink", "cpu", "latest", ["a", "b"])
    out = asyncio.run(_drive(j, {"a": [0, 1, 2], "b": ["x", "y"]}, {"a": 0.003, "b": 0.0045}))
    assert len(out) == 5
    assert len(out[0]) == 1  # the first input to speak, alone: the other is absent, not None
    assert out[-1] == {"a": 2, "b": "y"}
    for before, after in itertools.pairwise(out):  # each item changes one input by one step
        changed = [k for k in after if before.get(k) != after[k]]
        assert len(changed) == 1


# ---- config and graph checks (no Ray) -----------------------------------------------------


def test_a_kind_that_takes_no_join_is_refused_at_load_with_where_what_fix(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "name: p\nstages:\n"
        "  - {name: a, kind: echo, devices: [cpu], final_output: true}\n"
        "  - {name: b, kind: echo, mode: tone, inputs: [request, a], join: zip, devices: [cpu], final_output: true}\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    (problem,) = exc.value.problems
    assert problem.where == f"{p}: stages.b.inputs"
    assert problem.what == (
        "b (echo) has 2 inputs (request, a), and the echo kind does not take joined items "
        "(one dict keyed by source per item)"
    )
    assert (
        problem.fix == "give b one input, or put a stage of a kind that takes a join in front of it"
    )


def test_the_runtime_takes_fan_in_counts_its_calls_and_keeps_entries_sound(tmp_path: Path) -> None:
    plan, config = graph_pipeline(
        tmp_path,
        [
            source("a", 2),
            source("b", 2),
            sink(["a", "b"], "zip"),
            {
                "name": "voice",
                "kind": "echo",
                "mode": "tone",
                "inputs": ["request"],
                "devices": ["igpu:0"],
                "final_output": True,
            },
        ],
    )
    rt = Runtime(plan, config)
    assert rt.consumers == {"a": ["sink"], "b": ["sink"], "sink": [], "voice": []}
    assert rt.joins == {"sink": "zip"}
    # one stream per stage, and one feeder per (producer, device): a and b each feed the sink
    # (its join runs in the sink's own actor)
    assert rt.calls_per_request == {"cpu": 5, "igpu:0": 1}
    # a or b alone would leave the sink waiting for the other: neither is an entry; the sink neither
    assert rt.entry_stages() == ["voice"]


def test_the_runtime_guard_refuses_fan_in_on_a_kind_that_takes_no_join(tmp_path: Path) -> None:
    """A plan handed to the runtime directly, whose fan-in stage is of a kind without a join."""
    plan, config = graph_pipeline(tmp_path, [source("a", 2), sink(["request", "a"], "all")])
    plan = dataclasses.replace(
        plan, stages=(plan.stage("a"), dataclasses.replace(plan.stage("sink"), kind="echo"))
    )
    with pytest.raises(ConfigError) as exc:
        Runtime(plan, config)
    assert "stages.sink.inputs" in str(exc.value) and "does not take joined items" in str(exc.value)


# ---- whole graphs on Ray --------------------------------------------------------------------


def run(rt: Runtime, prompt: Any) -> list[Any]:
    async def main() -> list[Any]:
        return [e async for e in rt.stream(as_request(prompt))]

    return asyncio.run(main())


def outputs(events: list[Any], stage: str) -> list[Any]:
    return [e.value for e in events if isinstance(e, OutputItem) and e.stage == stage]


def started(ray_cluster: Any, tmp_path: Path, stages: list[dict[str, Any]]) -> Runtime:
    plan, config = graph_pipeline(tmp_path, stages)
    rt = Runtime(plan, config)
    rt.start()
    return rt


@pytest.mark.ray
@pytest.mark.slow
def test_fan_out_feeds_two_final_consumers_in_order_and_a_slow_one_holds_the_producer_back(
    ray_cluster: Any, tmp_path: Path
) -> None:
    sentences = [f"Sentence number {i} is here." for i in range(30)]
    rt = started(
        ray_cluster,
        tmp_path,
        [
            {
                "name": "thinker",
                "kind": "echo",
                "mode": "words",
                "devices": ["cpu"],
                "final_output": True,
            },
            {
                "name": "fast",
                "kind": "echo",
                "mode": "tone",
                "inputs": ["thinker"],
                "devices": ["cpu"],
                "final_output": True,
            },
            {
                "name": "slow",
                "kind": "echo",
                "mode": "tone",
                "delay_s": 0.08,
                "inputs": ["thinker"],
                "devices": ["igpu:0"],
                "final_output": True,
            },
        ],
    )
    try:
        events = run(rt, {"script": [s + " " for s in sentences]})
    finally:
        rt.close()
    for voice in ("fast", "slow"):  # every sentence, in order, to each consumer
        chunks = [e for e in events if isinstance(e, AudioChunk) and e.stage == voice]
        assert [c.index for c in chunks] == list(range(30))
    done = {e.stage: e.stats for e in events if isinstance(e, StageEvent) and e.kind == "done"}
    assert done["fast"]["chunks_in"] == sentences == done["slow"]["chunks_in"]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).strip() == " ".join(
        sentences
    )
    # Back-pressure: when the slow voice has spoken k + 1 sentences, the producer has been read
    # at most k + 1 + one in the voice's hands + its queue (INPUT_QUEUE_ITEMS) + one feed
    # waiting + the delta that completes a sentence, + 2 for the driver reading the voice's
    # output late (it speaks one per 80 ms): never the whole reply ahead.
    bound = INPUT_QUEUE_ITEMS + 5
    deltas = 0
    k = 0
    for e in events:
        if isinstance(e, TextDelta) and e.stage == "thinker":
            deltas += 1
        elif isinstance(e, AudioChunk) and e.stage == "slow":
            assert deltas <= k + 1 + bound, (
                f"{deltas} sentences read when the slow voice had spoken {k + 1}"
            )
            k += 1


@pytest.mark.ray
@pytest.mark.slow
def test_zip_pairs_by_sequence_end_to_end_and_bounds_the_input_running_ahead(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = started(
        ray_cluster, tmp_path, [source("a", 60), source("b", 10, 0.05), sink(["a", "b"], "zip")]
    )
    try:
        events = run(rt, "go")
    finally:
        rt.close()
    got = [o["got"] for o in outputs(events, "sink")]
    assert [(g["a"]["i"], g["b"]["i"]) for g in got] == [(i, i) for i in range(10)]
    assert [o["i"] for o in outputs(events, "a")] == list(
        range(60)
    )  # a's rest still reaches the caller
    stats = next(
        e.stats
        for e in events
        if isinstance(e, StageEvent) and e.stage == "sink" and e.kind == "done"
    )
    assert stats["join"]["joined"] == 10 and stats["join"]["ahead_max"]["a"] <= JOIN_BUFFER_ITEMS
    assert (
        0 < stats["join"]["unpaired"]["a"] <= 50
    )  # counted up to the sink's end; a drains on after it
    # a running ahead is bounded: by the time b produced item k, a had produced at most
    # k + 1 + the join's buffer + Ray's unread generator items + what its pump and the
    # generator hold in hand (before back-pressure, all 60 would be out at once).
    t_a = [o["t"] for o in outputs(events, "a")]
    bound = JOIN_BUFFER_ITEMS + GENERATOR_BACKPRESSURE + 4
    for k, b in enumerate(outputs(events, "b")[:5]):
        ahead = sum(t < b["t"] for t in t_a)
        assert ahead <= k + 1 + bound, f"a produced {ahead} items before b's item {k}"


@pytest.mark.ray
@pytest.mark.slow
def test_all_and_latest_end_to_end_and_a_failed_input_names_its_stage(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = started(
        ray_cluster,
        tmp_path / "all",
        [source("a", 5, 0.01), source("b", 3, 0.015), sink(["request", "a", "b"], "all")],
    )
    try:
        events = run(rt, "go")
        (only,) = [o["got"] for o in outputs(events, "sink")]
        assert list(only) == ["request", "a", "b"]
        assert only["request"] == ["go"]
        assert [x["i"] for x in only["a"]] == [0, 1, 2, 3, 4] and [x["i"] for x in only["b"]] == [
            0,
            1,
            2,
        ]
    finally:
        rt.close()

    rt = started(
        ray_cluster,
        tmp_path / "latest",
        [
            source("a", 5, 0.02),
            source("b", 3, 0.033),
            sink(["request", "a", "b"], "latest"),
            source("c", 4, 0.01, fail_at=2, final_output=False),
            sink(["a", "c"], "zip", name="failing"),
        ],
    )
    try:
        with pytest.raises(
            StageFailed
        ) as exc:  # the graph with the failing input: the request fails naming c
            run(rt, "go")
        assert exc.value.stage == "c" and "told to fail at item 2" in str(exc.value)
    finally:
        rt.close()

    rt = started(
        ray_cluster,
        tmp_path / "latest2",
        [source("a", 5, 0.02), source("b", 3, 0.033), sink(["request", "a", "b"], "latest")],
    )
    try:
        events = run(rt, "go")
    finally:
        rt.close()
    got = [o["got"] for o in outputs(events, "sink")]
    assert len(got) == 1 + 5 + 3  # one per item of any input
    assert got[0] == {"request": "go"}  # a and b had produced nothing yet: absent
    assert {k: v["i"] for k, v in got[-1].items() if k != "request"} == {"a": 4, "b": 2}
    for before, after in itertools.pairwise(got):
        changed = [k for k in after if before.get(k) != after[k]]
        assert len(changed) == 1 and after[changed[0]]["i"] == (
            before[changed[0]]["i"] + 1 if changed[0] in before else 0
        )


@pytest.mark.ray
@pytest.mark.ort
@pytest.mark.slow
def test_a_fan_in_of_the_real_voice_pairs_each_sentence_with_its_audio(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """The default pipeline's Piper voice (ONNX Runtime) fed by a scripted text source; a
    join_echo stage zips the source's sentences with the voice's audio chunks."""
    pytest.importorskip("onnxruntime")
    import yaml

    from orchestrator.api import Pipeline
    from orchestrator.planner import plan_pipeline
    from tests.helpers import REPO
    from tests.helpers.profiles import make_profile

    doc = yaml.safe_load((REPO / "configs/voice-assistant.yaml").read_text())
    doc["stages"][0] = {
        "name": "thinker",
        "kind": "echo",
        "mode": "words",
        "devices": ["cpu"],
        "final_output": True,
        "final_output_type": "text",
    }
    doc["stages"][1]["first_chunk_chars"] = None  # a chunk per sentence: each is paired
    doc["stages"].append(sink(["thinker", "voice"], "zip", name="pairs"))
    config = parse_config(
        doc, where="voice-assistant.yaml (scripted, with a fan-in)", base_dir=REPO / "configs"
    )
    profile = make_profile()
    plan = plan_pipeline(config, profile)
    assert plan.admitted, [s.refusals for s in plan.stages]
    p = Pipeline(plan, config, profile=profile, record=tmp_path / "runs")
    p.start()
    try:

        async def main() -> list[Any]:
            return [
                e
                async for e in p.stream(
                    {"script": ["One sentence here.", " A second one.", " And a third."]}
                )
            ]

        events = asyncio.run(main())
    finally:
        p.close()
    pairs = [o["got"] for o in outputs(events, "pairs")]
    assert [list(x) for x in pairs] == [["thinker", "voice"]] * 3
    assert [x["thinker"] for x in pairs] == ["One sentence here.", "A second one.", "And a third."]
    voice = [e for e in events if isinstance(e, AudioChunk) and e.stage == "voice"]
    assert len(voice) == 3  # the voice is still a final output of its own
    for x, chunk in zip(pairs, voice, strict=True):
        assert x["voice"]["sample_rate"] == chunk.sample_rate > 0
        assert (
            len(x["voice"]["audio"]) == len(chunk.audio) > 0
        )  # the i-th sentence's audio, paired with it


# ---- output ports: a producer of two ports, each consumer gets only its port -----------------


def ports_graph(count: int = 4, *, hiddens: bool = True, **src: Any) -> list[dict[str, Any]]:
    """A ``port_echo`` source (text and hidden states, each item tagged with its port) feeding a
    join of both ports, a consumer of each port alone, and a plain consumer that takes text only."""

    def report(name: str, inputs: list[str], **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "kind": "port_echo",
            "mode": "report",
            "inputs": inputs,
            "devices": ["cpu"],
            "final_output": True,
            **extra,
        }

    return [
        {
            "name": "src",
            "kind": "port_echo",
            "mode": "source",
            "count": count,
            "devices": ["cpu"],
            "final_output": True,
            "final_output_type": "text",
            **src,
        },
        report("both", ["src.hidden_states", "src.text"], join="zip"),
        report("texts", ["src.text"]),
        *([report("hiddens", ["src.hidden_states"], devices=["igpu:0"])] if hiddens else []),
        {
            "name": "plain",
            "kind": "join_echo",
            "mode": "report",
            "inputs": ["src"],
            "devices": ["igpu:0"],
            "final_output": True,
        },
    ]


def test_the_runtime_routes_each_consumer_input_to_its_ports(tmp_path: Path) -> None:
    plan, config = graph_pipeline(tmp_path, ports_graph())
    rt = Runtime(plan, config)
    assert rt.consumers["src"] == ["both", "texts", "hiddens", "plain"]
    routes = {(c, entry): ports for c, entry, ports in rt.routes_out["src"]}
    assert routes == {
        ("both", "src.hidden_states"): {"hidden_states"},
        ("both", "src.text"): {"text"},
        ("texts", "src.text"): {"text"},
        ("hiddens", "src.hidden_states"): {"hidden_states"},
        ("plain", "src"): {"text"},
    }  # a plain input: the ports whose types join_echo consumes
    assert rt.joins == {"both": "zip"}
    # an item's port: its tag; untagged, a str is on the text port, anything else on no known port
    src = plan.stage("src")
    assert rt.graph.item_port(src, {"__port__": "hidden_states", "item": 1}) == ("hidden_states", 1)
    assert rt.graph.item_port(src, "Hi.") == ("text", "Hi.") and rt.graph.item_port(
        src, {"x": 1}
    ) == (
        None,
        {"x": 1},
    )
    assert rt.graph.item_port(plan.stage("both"), {"x": 1}) == (
        "event",
        {"x": 1},
    )  # a single port: every item
    # one stream per stage; one feeder per device: src's feeds (the join of both runs in its actor)
    assert rt.calls_per_request == {"cpu": 3 + 1, "igpu:0": 2 + 1}


@pytest.mark.ray
@pytest.mark.slow
def test_a_two_port_producer_feeds_a_join_of_both_and_each_consumer_only_its_port(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = started(ray_cluster, tmp_path / "ok", ports_graph(count=4, hiddens=False))
    try:
        events = run(rt, "go")
    finally:
        rt.close()
    sentences = [f"Sentence {i}." for i in range(4)]
    hidden = [{"array": [[float(i)] * 4], "dtype": "float32"} for i in range(4)]
    got = {name: [o["got"] for o in outputs(events, name)] for name in ("both", "texts", "plain")}
    # the join: the i-th hidden states with the i-th sentence, in order, keyed by the input as listed
    assert got["both"] == [
        {"src.hidden_states": h, "src.text": t} for h, t in zip(hidden, sentences, strict=True)
    ]
    assert got["texts"] == sentences  # the text port only
    assert (
        got["plain"] == sentences
    )  # a plain input: the port its kind consumes (text), not the tensors
    # the caller gets src's text (final_output_type: text), untagged; its tensors are no output
    assert (
        "".join(e.text for e in events if isinstance(e, TextDelta) and e.stage == "src")
        == " ".join(sentences) + " "
    )
    assert outputs(events, "src") == []
    stats = next(
        e.stats
        for e in events
        if isinstance(e, StageEvent) and e.stage == "both" and e.kind == "done"
    )
    assert (
        stats["join"]["received"] == {"src.hidden_states": 4, "src.text": 4}
        and stats["join"]["joined"] == 4
    )

    rt = started(ray_cluster, tmp_path / "bad", ports_graph(count=2, hiddens=False, bad_port=True))
    try:
        with pytest.raises(StageFailed) as exc:  # an item on a port the stage does not have
            run(rt, "go")
    finally:
        rt.close()
    assert exc.value.stage == "src"
    assert "output port 'codes'" in str(exc.value) and "text, hidden_states" in str(exc.value)


@pytest.mark.ray
@pytest.mark.slow
def test_a_consumer_of_the_tensor_port_alone_gets_the_arrays(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = started(ray_cluster, tmp_path, ports_graph(count=3))
    try:
        events = run(rt, "go")
    finally:
        rt.close()
    assert [o["got"] for o in outputs(events, "hiddens")] == [
        {"array": [[float(i)] * 4], "dtype": "float32"} for i in range(3)
    ]


@pytest.mark.ray
@pytest.mark.slow
def test_context_reaches_a_stage_ahead_of_its_producers_items_and_a_bad_one_is_refused(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """``stream(context=)``: items fed to a stage before its producer's (a realtime session's
    history to the decode stage). The echo ``words`` kind counts the words of every item it
    was given as its ``prompt_tokens``: the context's three words are counted on top of its
    producer's reply, and nowhere else. A context naming a stage the request does not reach
    that way is a ``BadRequest`` before anything runs."""
    rt = started(
        ray_cluster,
        tmp_path,
        [
            {
                "name": "first",
                "kind": "echo",
                "mode": "words",
                "devices": ["cpu"],
                "final_output": True,
            },
            {
                "name": "second",
                "kind": "echo",
                "mode": "words",
                "inputs": ["first"],
                "devices": ["cpu"],
                "final_output": True,
            },
        ],
    )

    async def main(context: Any, entry: str | None = None) -> list[Any]:
        return [e async for e in rt.stream(as_request("hello there"), context=context, entry=entry)]

    try:
        plain = asyncio.run(main(None))
        history = {"second": [{"messages": [{"role": "user", "content": "one two three"}]}]}
        given = asyncio.run(main(history))
        # entering at the stage the context names: the context first, then the request's text
        entered = asyncio.run(main(history, entry="second"))
        for context, where in (
            ({"first": [{"messages": []}]}, "context.first"),
            ({"nope": ["x"]}, "context.nope"),
        ):
            with pytest.raises(ConfigError) as refused:
                asyncio.run(main(context))
            assert refused.value.problems[0].where == where
    finally:
        rt.close()

    def prompt_tokens(events: list[Any], stage: str) -> int:
        return next(
            int(e.stats["prompt_tokens"])
            for e in events
            if isinstance(e, StageEvent) and e.kind == "done" and e.stage == stage
        )

    first_reply = "".join(e.text for e in plain if isinstance(e, TextDelta) and e.stage == "first")
    assert prompt_tokens(plain, "second") == len(first_reply.split())
    assert prompt_tokens(given, "second") == len(first_reply.split()) + 3
    assert prompt_tokens(given, "first") == prompt_tokens(plain, "first") == 2
    assert prompt_tokens(entered, "second") == 2 + 3
    said = "".join(e.text for e in entered if isinstance(e, TextDelta) and e.stage == "second")
    assert said.startswith("You said one two three hello there"), said
