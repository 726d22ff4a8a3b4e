"""The pipeline as a graph: typed edges, joins, cycles, reach and dangling outputs are refused by
the config loader (where → what → how to fix, exit 2) before anything is planned; the runtime keeps
its own guard. Fan-in at run time: tests/orchestrator/runtime/test_graph_runtime.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.core.errors import ConfigError
from orchestrator.runtime.runtime import Runtime
from stages.registry import get_kind
from tests.helpers.echo import echo_pipeline
from tests.helpers.graphs import write_artifact

REPO = Path(__file__).resolve().parents[2]
PIPER = REPO / "exports" / "piper-en-us-joe-medium"


def thinker(name: str = "thinker", inputs: str = "[request]", extra: str = "") -> str:
    return (
        f"  - {{name: {name}, kind: ar_decode, model: m, devices: [cpu], max_model_len: 64, "
        f"sampling: {{max_tokens: 8}}, inputs: {inputs}{extra}}}\n"
    )


def graph(name: str, artifact: Path, inputs: str, extra: str = "") -> str:
    return f"  - {{name: {name}, kind: exported_graph, artifact: {artifact}, devices: [cpu], inputs: {inputs}{extra}}}\n"


def artifact(tmp_path: Path, name: str, consumes: list[str], produces: list[str]) -> Path:
    """A small real artifact whose manifest declares the payload types under test."""
    return write_artifact(
        tmp_path / name, "relu", name=name, manifest={"consumes": consumes, "produces": produces}
    )


def refusal(tmp_path: Path, stages: str) -> list[tuple[str, str, str]]:
    """Load ``stages`` as a config; the problems it is refused with, as (where, what, fix) with the file cut off."""
    p = tmp_path / "p.yaml"
    p.write_text("name: p\nstages:\n" + stages)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    return [(pr.where.removeprefix(f"{p}: "), pr.what, pr.fix) for pr in exc.value.problems]


def loads(tmp_path: Path, stages: str) -> Any:
    p = tmp_path / "p.yaml"
    p.write_text("name: p\nstages:\n" + stages)
    return load_config(p)


# ---- typed edges ----------------------------------------------------------------


def test_a_graph_of_matching_types_loads_with_fan_out_several_entries_and_several_final_outputs(
    tmp_path: Path,
) -> None:
    listener = artifact(tmp_path, "listener", ["audio"], ["text"])  # any sample rate
    cfg = loads(
        tmp_path,
        thinker(extra=", final_output: true, final_output_type: text")
        + graph("voice", PIPER, "[thinker]", ", final_output: true, final_output_type: audio")
        + graph("echo_back", listener, "[voice]", ", final_output: true")
        + graph("direct_voice", PIPER, "[request]", ", final_output: true"),
    )
    assert [s.name for s in cfg.topological()] == ["thinker", "voice", "echo_back", "direct_voice"]
    ports = get_kind("exported_graph").ports(cfg.stage("voice"))
    assert [str(t) for t in ports.consumes] == ["text"] and [str(t) for t in ports.produces] == [
        "audio@22050"
    ]


def test_an_edge_of_the_wrong_kind_names_both_stages_and_both_types(tmp_path: Path) -> None:
    vad = artifact(tmp_path, "vad", ["audio@16000"], ["audio@16000"])
    assert refusal(
        tmp_path,
        thinker(extra=", final_output: true")
        + graph("vad", vad, "[thinker]", ", final_output: true"),
    ) == [
        (
            "stages.vad.inputs",
            "thinker (ar_decode) produces text, and vad (exported_graph) consumes audio@16000: text is not audio",
            "feed vad from a stage that produces audio@16000, or put a stage between thinker and vad that turns "
            "text into audio@16000",
        )
    ]


def test_audio_at_another_sample_rate_is_named_as_such(tmp_path: Path) -> None:
    vad = artifact(tmp_path, "vad", ["audio@16000"], ["audio@16000"])
    ((where, what, _),) = refusal(
        tmp_path,
        thinker()
        + graph("voice", PIPER, "[thinker]")
        + graph("vad", vad, "[voice]", ", final_output: true"),
    )
    assert where == "stages.vad.inputs"
    assert what == (
        "voice (exported_graph) produces audio@22050, and vad (exported_graph) consumes audio@16000: "
        "audio at 22050 Hz is not audio at 16000 Hz"
    )


def test_tensors_of_another_shape_are_refused_at_the_axis(tmp_path: Path) -> None:
    hidden = artifact(tmp_path, "hidden", ["text"], ["tensor:hidden_states<float32>[seq,896]"])
    talker = artifact(
        tmp_path,
        "talker",
        ["tensor:hidden_states<float32>[seq,2048]"],
        ["tensor:codec_codes<int64>[seq]"],
    )
    ((_, what, _),) = refusal(
        tmp_path,
        graph("h", hidden, "[request]") + graph("t", talker, "[h]", ", final_output: true"),
    )
    assert what.endswith(": axis 1 has size 896, not 2048")


def test_an_entry_stage_must_take_what_a_request_carries(tmp_path: Path) -> None:
    """A request carries text, audio, a tensor or token ids (docs/pipelines.md#request-payloads),
    never an event: a stage that consumes events alone cannot take it."""
    segments = write_artifact(
        tmp_path / "segments",
        "relu",
        name="segments",
        manifest={
            "consumes": ["event:segment"],
            "produces": ["audio@24000"],
            "preprocess": "exports.sentence_encoder:preprocess",
        },
    )
    assert refusal(tmp_path, graph("talker", segments, "[request]", ", final_output: true")) == [
        (
            "stages.talker.inputs",
            "talker (exported_graph) consumes event:segment, and a request carries text or audio or tensor or token_ids",
            "feed talker from a stage that produces event:segment instead of 'request'",
        )
    ]
    # a tensor-consuming entry (an Omni talker fed hidden states by the caller) takes the request
    talker = artifact(tmp_path, "talker", ["tensor:hidden_states"], ["audio@24000"])
    assert [
        s.name
        for s in loads(
            tmp_path, graph("talker", talker, "[request]", ", final_output: true")
        ).stages
    ] == ["talker"]


def test_final_output_type_must_be_something_the_stage_produces(tmp_path: Path) -> None:
    assert refusal(tmp_path, thinker(extra=", final_output: true, final_output_type: audio")) == [
        (
            "stages.thinker.final_output_type",
            "thinker (ar_decode) produces text, not audio",
            "set final_output_type: text, or leave it out",
        )
    ]


def test_a_manifest_that_misspells_a_payload_type_is_refused_where_it_is_written(
    tmp_path: Path,
) -> None:
    bad = artifact(tmp_path, "bad", ["audio@16kHz"], ["text"])
    p = tmp_path / "p.yaml"
    p.write_text("name: p\nstages:\n" + graph("bad", bad, "[request]", ", final_output: true"))
    with pytest.raises(
        ConfigError
    ) as exc:  # the loader defers to describe, which the planner calls first
        get_kind("exported_graph").describe(load_config(p).stage("bad"))
    assert "manifest.yaml: consumes" in str(
        exc.value
    ) and "'audio@16kHz' is not a payload type" in str(exc.value)


def test_a_kind_that_misspells_its_declaration_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(get_kind("echo")), "produces", ("sound",))
    ((where, what, _),) = refusal(
        tmp_path, "  - {name: e, kind: echo, devices: [cpu], final_output: true}\n"
    )
    assert where == "stages.e.kind"
    assert what == (
        "the echo kind declares a payload type wrongly: "
        "'sound' is not a payload kind; the kinds are text, token_ids, audio, tensor, event"
    )


# ---- the graph's shape ----------------------------------------------------------


def test_a_cycle_is_named_as_its_path_in_the_direction_data_flows(tmp_path: Path) -> None:
    # a feeds b (with the request), b feeds c, c feeds b back
    ((where, what, fix),) = refusal(
        tmp_path,
        thinker("a", extra=", final_output: true")
        + thinker("b", "[a, c]", ", join: all")
        + thinker("c", "[b]"),
    )
    assert where == "stages"
    assert what == "the stage graph has a cycle: b → c → b (each stage feeds the next)"
    assert fix == "make one of these stages take its input from earlier stages or 'request'"


def test_a_stage_no_path_from_the_request_reaches_is_named_with_its_chain(tmp_path: Path) -> None:
    problems = refusal(
        tmp_path,
        thinker(extra=", final_output: true")
        + thinker("orphan", "[]")
        + thinker("after", "[orphan]", ", final_output: true"),
    )
    assert problems == [
        (
            "stages.orphan.inputs",
            "no path from the request reaches orphan: orphan starts at orphan, which has no inputs",
            "give orphan inputs: [request] (or the stage that should feed it), or remove the stages that nothing feeds",
        ),
        (
            "stages.after.inputs",
            "no path from the request reaches after: orphan → after starts at orphan, which has no inputs",
            "give orphan inputs: [request] (or the stage that should feed it), or remove the stages that nothing feeds",
        ),
    ]


def test_an_output_that_goes_nowhere_is_refused(tmp_path: Path) -> None:
    assert refusal(
        tmp_path, thinker(extra=", final_output: true") + thinker("aside", "[thinker]")
    ) == [
        (
            "stages.aside",
            "the output of aside goes nowhere: no stage takes it as input and it is not a final output",
            "set final_output: true on aside, add it to a later stage's inputs, or remove the stage",
        )
    ]


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        (
            thinker("a", extra=", final_output: true")
            + thinker("b", "[request, a]", ", final_output: true"),
            (
                "stages.b.join",
                "b has 2 inputs (request, a) and no join, so how they combine is unsaid",
                "add join: all (each input's whole output, once every input has ended), zip (items paired by sequence) "
                "or latest (each input's newest item)",
            ),
        ),
        (
            thinker("a", extra=", final_output: true, join: zip"),
            (
                "stages.a.join",
                "join: zip combines several inputs, and a has one (request)",
                "remove join, or list the other inputs it should combine",
            ),
        ),
        (
            thinker("a", "[request, request]", ", final_output: true, join: all"),
            ("stages.a.inputs", "'request' is listed more than once", "list each input once"),
        ),
    ],
)
def test_joins_are_declared_where_inputs_meet(
    tmp_path: Path, stages: str, expected: tuple[str, str, str]
) -> None:
    assert refusal(tmp_path, stages) == [expected]


def test_an_unknown_join_lists_the_ones_there_are(tmp_path: Path) -> None:
    ((where, what, _),) = refusal(
        tmp_path,
        thinker("a", extra=", final_output: true")
        + thinker("b", "[request, a]", ", final_output: true, join: first"),
    )
    assert where == "stages[1].join" and "'all', 'zip' or 'latest'" in what


@pytest.mark.parametrize("join", ["all", "zip", "latest"])
def test_fan_in_with_a_join_loads_for_a_kind_that_takes_one_and_the_runtime_runs_it(
    tmp_path: Path, join: str
) -> None:
    cfg = loads(
        tmp_path,
        "  - {name: a, kind: join_echo, mode: count, devices: [cpu]}\n"
        f"  - {{name: b, kind: join_echo, inputs: [request, a], join: {join}, devices: [cpu], final_output: true}}\n",
    )
    assert cfg.stage("b").join == join
    # a kind that takes no join (echo) is refused at load: tests/orchestrator/runtime/test_graph_runtime.py
    plan, config = echo_pipeline(tmp_path)
    voice = dataclasses.replace(plan.stage("voice"), inputs=("request", "thinker"))
    with pytest.raises(
        ConfigError
    ) as exc:  # the runtime's own guard, for a plan handed to it directly
        Runtime(dataclasses.replace(plan, stages=(plan.stage("thinker"), voice)), config)
    assert "stages.voice" in str(exc.value)


# ---- output ports ----------------------------------------------------------------------


def omni(
    talker_inputs: str = "[thinker.hidden_states, thinker.text]", talker_extra: str = ""
) -> str:
    """An Omni thinker (text and hidden states out) and its talker (both in, codec codes out)."""
    return thinker(
        extra=", model_stage: thinker, final_output: true, final_output_type: text"
    ) + thinker(
        "talker",
        talker_inputs,
        ", model_stage: talker, final_output: true, final_output_type: token_ids" + talker_extra,
    )


def test_port_names_input_spellings_and_tagged_items() -> None:
    from stages.payloads import on_port, parse_payload, port_name, split_input, untag

    assert [
        port_name(parse_payload(t))
        for t in ("text", "tensor:hidden_states<float32>", "audio@22050", "tensor")
    ] == ["text", "hidden_states", "audio", "tensor"]
    assert split_input("thinker.hidden_states") == ("thinker", "hidden_states")
    assert split_input("thinker") == ("thinker", None) and split_input("request") == (
        "request",
        None,
    )
    tagged = on_port("text", "Hello.")
    assert tagged == {"__port__": "text", "item": "Hello."} and untag(tagged) == ("text", "Hello.")
    for plain in (
        "Hello.",
        {"item": 1, "other": 2},
        {"audio": [0.0], "sample_rate": 16000},
        [1, 2],
    ):
        assert untag(plain) == (None, plain)  # anything else is an untagged item, left as it is


def test_a_talker_takes_the_thinkers_two_ports_and_joins_them_all_by_default(
    tmp_path: Path,
) -> None:
    cfg = loads(tmp_path, omni())
    talker = cfg.stage("talker")
    assert talker.inputs == ["thinker.hidden_states", "thinker.text"]
    assert talker.join == "all"  # ar_decode's default for a talker (StageKind.default_join)
    assert [s.name for s in cfg.topological()] == ["thinker", "talker"]
    ports = get_kind("ar_decode").ports(cfg.stage("thinker"))
    assert ports.port_names() == ("text", "hidden_states")
    assert str(ports.port("hidden_states")[0]) == "tensor:hidden_states"
    # a plain input still means every item of the stage (back-compatible), type-checked against all its ports
    assert loads(tmp_path, omni("[thinker]")).stage("talker").join is None


def test_a_port_the_producer_does_not_have_names_both_stages_and_the_ports_there_are(
    tmp_path: Path,
) -> None:
    assert refusal(tmp_path, omni("[thinker.codes, thinker.text]")) == [
        (
            "stages.talker.inputs",
            "talker takes thinker.codes, and thinker (ar_decode) has no output port 'codes'; its ports are text, hidden_states",
            "name one of thinker.text, thinker.hidden_states, or thinker alone for every item it yields",
        )
    ]


def test_an_edge_from_a_port_is_checked_against_that_ports_types_only(tmp_path: Path) -> None:
    stages = thinker(extra=", model_stage: thinker, final_output: true") + graph(
        "voice", PIPER, "[thinker.hidden_states]", ", final_output: true"
    )
    ((where, what, _),) = refusal(tmp_path, stages)
    assert where == "stages.voice.inputs"
    assert what == (
        "thinker.hidden_states (ar_decode) produces tensor:hidden_states, and voice (exported_graph) "
        "consumes text: tensor is not text"
    )
    # the same voice on the text port, or on the whole thinker (whose text it takes), loads
    loads(
        tmp_path,
        thinker(extra=", model_stage: thinker, final_output: true")
        + graph("voice", PIPER, "[thinker.text]", ", final_output: true"),
    )
    loads(
        tmp_path,
        thinker(extra=", model_stage: thinker, final_output: true")
        + graph("voice", PIPER, "[thinker]", ", final_output: true"),
    )


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        (
            omni("[thinker, thinker.text]", ", join: all"),
            (
                "stages.talker.inputs",
                "thinker is listed whole and by port (thinker.text): thinker alone already takes "
                "every item it yields",
                "list thinker alone, or only the ports talker takes",
            ),
        ),
        (
            thinker(inputs="[request.text]", extra=", final_output: true"),
            (
                "stages.thinker.inputs",
                "'request.text': the request has no output ports",
                "write request",
            ),
        ),
        (
            omni("[ghost.text, thinker.text]"),
            (
                "stages.talker.inputs",
                "unknown input 'ghost.text'",
                "use 'request' or one of the stage names: thinker, talker",
            ),
        ),
    ],
)
def test_port_spellings_that_mean_nothing_are_refused(
    tmp_path: Path, stages: str, expected: tuple[str, str, str]
) -> None:
    assert expected in refusal(tmp_path, stages)


def test_only_a_talker_among_ar_decode_stages_takes_a_join(tmp_path: Path) -> None:
    ((where, what, _),) = refusal(
        tmp_path,
        thinker("a", extra=", model_stage: thinker, final_output: true")
        + thinker("b", "[a.text, request]", ", final_output: true, join: all"),
    )
    assert where == "stages.b.inputs" and "the ar_decode kind does not take joined items" in what


def test_a_zip_that_would_stall_is_refused_with_both_paths(tmp_path: Path) -> None:
    # the talker takes text whole (one item at the thinker's end) while hidden states stream
    assert refusal(tmp_path, omni(talker_extra=", join: zip")) == [
        (
            "stages.talker.join",
            "join: zip can stall: thinker.hidden_states → talker hands talker thinker's items as they come, and "
            "thinker.text → talker only once thinker has ended (talker takes whole text), so the streaming input fills "
            "the join's buffer, thinker pauses and never ends",
            "use join: all (each input's whole output once every input has ended), or feed talker from paths that both stream",
        )
    ]
    # a diamond: a feeds the sink directly (sentences, streaming) and through b, a decoder taking a's whole text
    diamond = (
        thinker("a")
        + thinker("b", "[a]")
        + "  - {name: sink, kind: join_echo, inputs: [a, b], join: zip, devices: [cpu], final_output: true}\n"
    )
    ((where, what, _),) = refusal(tmp_path, diamond)
    assert where == "stages.sink.join"
    assert what.startswith(
        "join: zip can stall: a → sink hands sink a's items as they come, and a → b → sink only "
        "once a has ended (b takes whole text)"
    )
    assert loads(tmp_path, diamond.replace("join: zip", "join: all")).stage("sink").join == "all"
    # two streaming paths from one stage (the voice's fan-in test) load under zip
    loads(
        tmp_path,
        thinker("a", extra=", final_output: true")
        + graph("voice", PIPER, "[a]", ", final_output: true")
        + "  - {name: sink, kind: join_echo, inputs: [a, voice], join: zip, devices: [cpu], final_output: true}\n",
    )


def test_the_cli_refuses_a_bad_graph_with_exit_2_before_planning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "name: p\nstages:\n" + thinker(extra=", final_output: true") + thinker("aside", "[thinker]")
    )
    assert main(["plan", str(p), "--out", str(tmp_path / "plan.json")]) == 2
    err = capsys.readouterr().err
    assert "stages.aside: the output of aside goes nowhere" in err and "how to fix:" in err
    assert not (tmp_path / "plan.json").exists()
