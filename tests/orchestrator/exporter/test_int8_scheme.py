"""The int8 scheme of the exporter's Python API (``Int8Scheme``: uint16 activations, only the
named nodes quantized) and ``python -m orchestrator.exporter REQUEST.json``, which runs it
for build scripts (``python -m exports.piper_voice build``).

The source is a two-layer ONNX graph made here with onnx.helper (``/a/`` then ``/b/``),
exported ``--from onnx``: milliseconds, no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.exporter import __main__ as entry
from orchestrator.exporter.build import ExportRequest, Int8Scheme, export
from stages.exported_graph.artifact import load_artifact

pytestmark = [pytest.mark.ort]


def _source(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    rng = np.random.RandomState(0)
    w1 = numpy_helper.from_array(rng.randn(16, 32).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.randn(32, 8).astype(np.float32) / 4, "W2")
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "W1"], ["m1"], name="/a/MatMul"),
            h.make_node("Tanh", ["m1"], ["t"], name="/a/Tanh"),
            h.make_node("MatMul", ["t", "W2"], ["y"], name="/b/MatMul"),
        ],
        "two",
        [h.make_tensor_value_info("x", T.FLOAT, ["n", 16])],
        [h.make_tensor_value_info("y", T.FLOAT, ["n", 8])],
        [w1, w2],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "two.onnx"
    onnx.save(model, src)
    feeds = [tmp_path / f"cal{i}.npz" for i in range(4)]
    for i, f in enumerate(feeds):
        np.savez(f, x=np.random.RandomState(10 + i).randn(2, 16).astype(np.float32))
    return src, feeds[0], [str(f) for f in feeds[1:]]


def _request(tmp_path: Path, out: Path, **kw: Any) -> ExportRequest:
    src, ref, cal = _source(tmp_path)
    return ExportRequest(
        source="onnx",
        location=str(src),
        out=out,
        precisions=("fp32", "int8"),
        inputs_npz=str(ref),
        calibration_npz=cal,
        license="MIT",
        **kw,
    )


def _quantized_nodes(graph: Path) -> dict[str, Any]:
    """Which of the source's nodes read a DequantizeLinear output, and the activations' zero-point types."""
    import onnx

    model = onnx.load(str(graph))
    dq_out = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    zp_types = {
        onnx.TensorProto.DataType.Name(inits[n.input[2]].data_type)
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits
    }
    fed = {
        n.name: any(i in dq_out for i in n.input)
        for n in model.graph.node
        if n.name.startswith(("/a/", "/b/"))
    }
    return {"fed": fed, "zero_points": zp_types}


def test_only_the_named_nodes_are_quantized_with_uint16_activations(tmp_path: Path) -> None:
    out = tmp_path / "two-int8"
    result = export(_request(tmp_path, out, int8=Int8Scheme(activations="uint16", nodes=("/b/",))))
    q = _quantized_nodes(out / "int8.onnx")
    assert q["fed"]["/b/MatMul"] and not q["fed"]["/a/MatMul"]
    assert "UINT16" in q["zero_points"] and "UINT8" not in q["zero_points"]
    notes = load_artifact(out).manifest.source.notes
    assert "the nodes under /b/ (the rest fp32)" in notes and "uint16 activations" in notes
    # measured, within the ceiling, and judged by its own tolerance
    assert 0 < result.precisions["int8"]["rel_l2"] < 0.05


def test_the_default_scheme_quantizes_every_node_with_uint8(tmp_path: Path) -> None:
    out = tmp_path / "two-int8"
    export(_request(tmp_path, out))
    q = _quantized_nodes(out / "int8.onnx")
    assert q["fed"]["/a/MatMul"] and q["fed"]["/b/MatMul"] and q["zero_points"] == {"UINT8"}


def test_a_prefix_that_names_no_node_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "two-int8"
    with pytest.raises(ConfigError) as err:
        export(_request(tmp_path, out, int8=Int8Scheme(nodes=("/dec/",))))
    assert "no node name starts with /dec/" in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".two-int8.export-*"))


def test_an_unknown_activation_type_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        export(_request(tmp_path, tmp_path / "x", int8=Int8Scheme(activations="int4")))
    assert "'int4' is not an activation type" in str(err.value) and "uint8 or uint16" in str(
        err.value
    )


def test_the_request_entry_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, ref, cal = _source(tmp_path)
    request = tmp_path / "request.json"
    out = tmp_path / "two-int8"
    request.write_text(
        json.dumps(
            {
                "source": "onnx",
                "location": str(src),
                "out": str(out),
                "precisions": ["fp32", "int8"],
                "inputs_npz": str(ref),
                "calibration_npz": cal,
                "int8": {"activations": "uint16", "nodes": ["/b/"]},
            }
        )
    )
    assert entry.main([str(request)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["format"] == "omni-edge.export-result/1"
    assert "quantizing to int8 QDQ" in captured.err
    assert load_artifact(out).manifest.tolerance_for("int8").rel_l2 >= 0.02
    request.write_text(
        json.dumps(
            {
                "source": "onnx",
                "location": str(src),
                "out": str(tmp_path / "y"),
                "precison": ["fp32"],
            }
        )
    )
    assert entry.main([str(request)]) == 2
    err = capsys.readouterr().err
    assert "unknown request field(s): precison" in err and "how to fix" in err
    assert not (tmp_path / "y").exists()


def test_the_command_line_takes_the_same_scheme(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    src, ref, cal = _source(tmp_path)
    out = tmp_path / "cli-int8"
    args = [
        "export",
        "--from",
        "onnx",
        str(src),
        "-o",
        str(out),
        "--inputs",
        str(ref),
        *(a for c in cal for a in ("--calibration", c)),
        "--precision",
        "fp32,int8",
    ]
    assert main([*args, "--int8-activations", "uint16", "--int8-nodes", "/b/", "--json"]) == 0, (
        capsys.readouterr()
    )
    q = _quantized_nodes(out / "int8.onnx")
    assert q["fed"]["/b/MatMul"] and not q["fed"]["/a/MatMul"]
    assert "UINT16" in q["zero_points"] and "UINT8" not in q["zero_points"]
    capsys.readouterr()
    # the scheme's flags without an int8 precision: refused before any work, nothing written
    refused = tmp_path / "refused"
    code = main(
        [
            "export",
            "--from",
            "onnx",
            str(src),
            "-o",
            str(refused),
            "--inputs",
            str(ref),
            "--int8-nodes",
            "/b/",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--int8-nodes" in err and "add int8 to --precision" in err
    assert not refused.exists()
