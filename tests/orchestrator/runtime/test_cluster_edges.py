"""What crosses an edge between two stages: the payload's size without pickling
(``pump.payload_bytes``), counted per producer and consumer for each request
(``edges_out`` in the producer's done stats), and the run record's ``edges[]``
(``record.edge_rows``): nodes, ``crosses_nodes``, items, bytes, bytes per item.
The counting and the record's rows are tested as plain code, then once on real actors
(the weightless echo kinds); the two-node test checks an edge between nodes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from orchestrator.runtime.events import Result, StageEvent, collect
from orchestrator.runtime.pump import _count_item, edge_counts, payload_bytes
from orchestrator.runtime.record import edge_rows
from orchestrator.runtime.runtime import Runtime


def test_payload_bytes_of_text_arrays_and_containers() -> None:
    assert payload_bytes("Moon.") == 5
    assert payload_bytes("Mönd") == 5  # UTF-8: ö is two bytes
    audio = np.zeros(88200, dtype=np.float32)
    assert payload_bytes(audio) == 352800
    # an audio chunk as the voice yields it: keys and values
    assert (
        payload_bytes({"audio": audio, "sample_rate": 22050})
        == len("audio") + 352800 + len("sample_rate") + 8
    )
    assert payload_bytes([b"ab", (1.5, None)]) == 2 + 8 + 1


def test_counts_per_consumer_for_one_request() -> None:
    sent: dict[str, list[int]] = {}
    for chunk in ("The Moon is far. ", "It has no air."):
        _count_item(sent, "voice", chunk)
    _count_item(sent, "embed", "x")
    assert edge_counts(sent) == {
        "voice": {"items": 2, "bytes": 31},
        "embed": {"items": 1, "bytes": 1},
    }


def _result(stages: dict[str, dict[str, Any]]) -> Result:
    return Result("r", "p", "", None, None, stages, None, None, 1.0)


def _runtime(devices: dict[str, str]) -> Any:
    stages = [SimpleNamespace(name=n, device=d) for n, d in devices.items()]
    return SimpleNamespace(
        stages=stages,
        consumers={"thinker": ["voice"], "voice": []},
        plan=SimpleNamespace(stage=lambda n: next(s for s in stages if s.name == n)),
    )


def test_the_record_says_which_edges_cross_nodes_and_what_they_carried() -> None:
    runtime = _runtime({"thinker": "desktop/gpu:0", "voice": "laptop/npu:0"})
    results = [
        _result({"thinker": {"edges_out": {"voice": {"items": 2, "bytes": 31}}}, "voice": {}}),
        _result({"thinker": {"edges_out": {"voice": {"items": 1, "bytes": 9}}}, "voice": {}}),
        _result({"voice": {}}),
    ]  # entered at the voice: the edge did not run
    assert edge_rows(runtime, results) == [
        {
            "from": "thinker",
            "to": "voice",
            "from_node": "desktop",
            "to_node": "laptop",
            "crosses_nodes": True,
            "requests": 2,
            "items": 3,
            "bytes": 40,
            "bytes_per_item": 13.3,
        }
    ]


def test_an_edge_into_replicas_on_two_nodes_has_a_row_per_replica_with_its_node() -> None:
    """The voice has a replica on each node: the requests balanced to the one beside the
    thinker did not cross, the others did, and each row says so with its own counts (one
    row naming replica 0's node for all of them would hide the crossings)."""
    from orchestrator.runtime.record import streaming

    runtime = _runtime({"thinker": "desktop/cpu", "voice": "desktop/cpu"})
    runtime.streaming = "direct"
    runtime.driver_node = "N-desktop"
    runtime.refs = {
        "thinker": SimpleNamespace(key="desktop/cpu"),
        "voice#0": SimpleNamespace(key="desktop/cpu#1"),
        "voice#1": SimpleNamespace(key="laptop/cpu"),
    }
    runtime.devices = {
        key: SimpleNamespace(info={"node_id": f"N-{key.split('/')[0]}"})
        for key in ("desktop/cpu", "desktop/cpu#1", "laptop/cpu")
    }

    def ran(replica: int, items: int) -> Result:
        device = ("desktop/cpu", "laptop/cpu")[replica]
        return _result(
            {
                "thinker": {"edges_out": {"voice": {"items": items, "bytes": 10 * items}}},
                "voice": {"holder": f"voice#{replica}", "device": device},
            }
        )

    results = [ran(0, 2), ran(1, 3), ran(1, 1)]
    rows = edge_rows(runtime, results)
    assert [(r["to_node"], r["crosses_nodes"], r["requests"], r["items"]) for r in rows] == [
        ("desktop", False, 1, 2),
        ("laptop", True, 2, 4),
    ]
    edges = streaming(runtime, results)["edges"]
    assert [(e["to_node"], e["crossings_per_item"], e["node_crossings"]) for e in edges] == [
        ("N-desktop", 0, 0),
        ("N-laptop", 1, 4),
    ]


def test_on_one_machine_no_edge_crosses_and_an_idle_edge_has_no_per_item_cost() -> None:
    rows = edge_rows(_runtime({"thinker": "cpu", "voice": "npu:0"}), [_result({"voice": {}})])
    assert rows == [
        {
            "from": "thinker",
            "to": "voice",
            "from_node": "",
            "to_node": "",
            "crosses_nodes": False,
            "requests": 0,
            "items": 0,
            "bytes": 0,
            "bytes_per_item": None,
        }
    ]


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_counts_what_went_over_each_edge(ray_cluster: Any, tmp_path: Path) -> None:
    """On real actors (the weightless echo kinds): the producer's done stats carry what the
    runtime handed its consumer — one item per sentence, their UTF-8 bytes — and the
    record's row says so."""
    from tests.orchestrator.runtime.test_graph_runtime import graph_pipeline, run

    plan, config = graph_pipeline(
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
                "name": "voice",
                "kind": "echo",
                "mode": "tone",
                "inputs": ["thinker"],
                "devices": ["cpu"],
                "final_output": True,
            },
        ],
    )
    rt = Runtime(plan, config)
    rt.start()
    try:
        events = run(rt, {"script": ["The Moon is far. ", "Its dust is grey. ", "Näher nie."]})
    finally:
        rt.close()
    done = {e.stage: e.stats for e in events if isinstance(e, StageEvent) and e.kind == "done"}
    sentences = done["voice"]["chunks_in"]
    assert len(sentences) == 3
    sent = {"items": 3, "bytes": sum(len(s.encode()) for s in sentences)}
    assert done["thinker"]["edges_out"] == {"voice": sent} and done["voice"]["edges_out"] == {}
    row = edge_rows(rt, [collect("r", "p", events, 1.0)])
    assert row == [
        {
            "from": "thinker",
            "to": "voice",
            "from_node": "",
            "to_node": "",
            "crosses_nodes": False,
            "requests": 1,
            **sent,
            "bytes_per_item": round(sent["bytes"] / 3, 1),
        }
    ]
