"""Tiny ONNX graphs (onnx.helper), artifact directories, profiles and placements for the tests
that verify or run exported graphs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from orchestrator.core.profile import HardwareProfile, parse_profile
from orchestrator.core.units import GiB
from orchestrator.verify.placement import Placement, placement_for
from stages.exported_graph.kind import ExportedGraphConfig, ExportedGraphKind

REPO = Path(__file__).resolve().parents[2]
OV_PYTHON = REPO / ".venvs" / "openvino" / "bin" / "python"
OPSET = 17
K, N = 64, 16
"""The full graph's MatMul shape."""


def _model(
    nodes: list[Any], inputs: list[Any], outputs: list[Any], initializers: list[Any] | None = None
) -> Any:
    from onnx import checker, helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    checker.check_model(model)
    return model


def full_graph() -> Any:
    """MatMul + Add + Tanh in fp32: every op the OpenVINO EP compiles. (Tanh, not
    Relu: OpenVINO's GEMM happens to match MLAS bit for bit, its tanh does not, so
    this graph is the ordinary, non-suspicious case.)"""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.random.RandomState(0).randn(K, N).astype(np.float32), "W")
    b = numpy_helper.from_array(np.linspace(-1, 1, N).astype(np.float32), "B")
    return _model(
        [
            h.make_node("MatMul", ["x", "W"], ["m"]),
            h.make_node("Add", ["m", "B"], ["a"]),
            h.make_node("Tanh", ["a"], ["y"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, ["n", K])],
        [h.make_tensor_value_info("y", T.FLOAT, ["n", N])],
        [w, b],
    )


def relu_graph() -> Any:
    """A lone Relu: exact arithmetic, so any EP's output equals the CPU's bit for bit."""
    from onnx import TensorProto as T
    from onnx import helper as h

    return _model(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 8])],
    )


def fp64_island_graph() -> Any:
    """fp32 in and out, an fp64 Abs in the middle (OpenVINO declines the fp64 part)."""
    from onnx import TensorProto as T
    from onnx import helper as h

    return _model(
        [
            h.make_node("Relu", ["x"], ["r"]),
            h.make_node("Cast", ["r"], ["d"], to=T.DOUBLE),
            h.make_node("Abs", ["d"], ["a"]),
            h.make_node("Cast", ["a"], ["f"], to=T.FLOAT),
            h.make_node("Sigmoid", ["f"], ["y"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 3])],
    )


def string_cast_graph() -> Any:
    """A round trip through a string tensor, which OpenVINO cannot hold."""
    from onnx import TensorProto as T
    from onnx import helper as h

    return _model(
        [
            h.make_node("Relu", ["x"], ["r"]),
            h.make_node("Cast", ["r"], ["s"], to=T.STRING),
            h.make_node("Cast", ["s"], ["f"], to=T.FLOAT),
            h.make_node("Sigmoid", ["f"], ["y"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 3])],
    )


def det_graph() -> Any:
    """Det, which the OpenVINO EP does not take."""
    from onnx import TensorProto as T
    from onnx import helper as h

    return _model(
        [
            h.make_node("Relu", ["x"], ["r"]),
            h.make_node("Det", ["r"], ["d"]),
            h.make_node("Sigmoid", ["d"], ["y"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, [2])],
    )


def fp64_only_graph() -> Any:
    """Nothing but fp64: the OpenVINO EP takes no node."""
    from onnx import TensorProto as T
    from onnx import helper as h

    return _model(
        [h.make_node("Abs", ["x"], ["a"]), h.make_node("Neg", ["a"], ["y"])],
        [h.make_tensor_value_info("x", T.DOUBLE, [2, 3])],
        [h.make_tensor_value_info("y", T.DOUBLE, [2, 3])],
    )


EMBEDDING, PROJECTED = 384, 16
"""The projection graph's sizes: the shipped sentence encoder's embedding in, a few numbers out."""


def projection_graph() -> Any:
    """``projected[16] = embedding[384] @ W``: one input, shaped as the shipped sentence
    encoder's output (a float32 [384] vector), so it can run downstream of it without hooks."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    w = numpy_helper.from_array(
        np.random.RandomState(7).randn(EMBEDDING, PROJECTED).astype(np.float32), "W"
    )
    return _model(
        [h.make_node("MatMul", ["embedding", "W"], ["projected"])],
        [h.make_tensor_value_info("embedding", T.FLOAT, [EMBEDDING])],
        [h.make_tensor_value_info("projected", T.FLOAT, [PROJECTED])],
        [w],
    )


def add_two_graph() -> Any:
    """``y = a + b`` over two inputs of any length: fed by a mapping of both names; two
    lengths that do not broadcast fail inside the session, not before it."""
    from onnx import TensorProto as T
    from onnx import helper as h

    return _model(
        [h.make_node("Add", ["a", "b"], ["y"])],
        [
            h.make_tensor_value_info("a", T.FLOAT, ["n"]),
            h.make_tensor_value_info("b", T.FLOAT, ["m"]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, ["k"])],
    )


GROWING_ROWS = 16
"""The growing graph's intermediates are ``GROWING_ROWS`` x n floats (64 bytes per n)."""


def growing_graph() -> Any:
    """y[1, n] = the column sums of sin(x broadcast to [16, n]): two intermediates of 64 bytes per n.
    Fed a larger n each call, ONNX Runtime's CPU arena (which keeps every region it extends by)
    grows with every call, by construction: no free region holds the next call's tensors."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    return _model(
        [
            h.make_node("Expand", ["x", "rows"], ["e"]),
            h.make_node("Sin", ["e"], ["s"]),
            h.make_node("ReduceSum", ["s", "axes"], ["y"], keepdims=1),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [1, "n"])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, "n"])],
        [
            numpy_helper.from_array(np.array([GROWING_ROWS, 1], np.int64), "rows"),
            numpy_helper.from_array(np.array([0], np.int64), "axes"),
        ],
    )


GRAPHS = {
    "full": (full_graph, lambda: {"x": np.random.RandomState(1).randn(5, K).astype(np.float32)}),
    "relu": (relu_graph, lambda: {"x": np.random.RandomState(5).randn(4, 8).astype(np.float32)}),
    "fp64_island": (
        fp64_island_graph,
        lambda: {"x": np.random.RandomState(2).randn(2, 3).astype(np.float32)},
    ),
    "string_cast": (
        string_cast_graph,
        lambda: {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2},
    ),
    "det": (det_graph, lambda: {"x": np.random.RandomState(3).rand(2, 3, 3).astype(np.float32)}),
    "fp64_only": (fp64_only_graph, lambda: {"x": np.random.RandomState(4).randn(2, 3)}),
    "projection": (
        projection_graph,
        lambda: {"embedding": np.random.RandomState(6).randn(EMBEDDING).astype(np.float32)},
    ),
    "add_two": (
        add_two_graph,
        lambda: {"a": np.arange(3, dtype=np.float32), "b": np.ones(3, np.float32)},
    ),
    "growing": (
        growing_graph,
        lambda: {"x": np.random.RandomState(6).randn(1, 64).astype(np.float32)},
    ),
}


def cpu_outputs(model_path: Path, feeds: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime as ort

    s = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


def write_artifact(
    directory: Path,
    graph: str,
    *,
    name: str | None = None,
    reference_outputs: dict[str, Any] | None = None,
    manifest: dict[str, Any] | None = None,
) -> Path:
    """An artifact directory for one of GRAPHS: fp32.onnx, reference_inputs.npz, manifest.yaml."""
    import onnx

    build, feeds_fn = GRAPHS[graph]
    directory.mkdir(parents=True, exist_ok=True)
    model = build()
    onnx.save(model, directory / "fp32.onnx")
    feeds = feeds_fn()
    np.savez(directory / "reference_inputs.npz", **feeds)
    spec = lambda v: {  # noqa: E731 - a one-line view of a value_info
        "name": v.name,
        "dtype": {1: "float32", 11: "float64"}[v.type.tensor_type.elem_type],
        "shape": [
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in v.type.tensor_type.shape.dim
        ],
    }
    doc: dict[str, Any] = {
        "format": "omni-edge.export/1",
        "name": name or graph.replace("_", "-"),
        "version": "1",
        "source": {
            "origin": "built by tests/helpers/graphs.py with onnx.helper",
            "license": "Apache-2.0",
        },
        "precisions": {"fp32": "fp32.onnx"},
        "inputs": [spec(v) for v in model.graph.input],
        "outputs": [spec(v) for v in model.graph.output],
        "reference": {"inputs": "reference_inputs.npz"},
        "tolerance": {"rel_l2": 1e-4, "max_abs": 1e-4, "cosine_min": 0.9999},
    }
    if reference_outputs is not None:
        np.savez(directory / "reference_outputs.npz", **reference_outputs)
        doc["reference"]["outputs"] = "reference_outputs.npz"
    doc.update(manifest or {})
    (directory / "manifest.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return directory


def machine_profile(
    *, ov_python: Path | str = OV_PYTHON, name: str = "this machine"
) -> HardwareProfile:
    """This machine as the tests see it: a CPU driven by ort-openvino (through the
    OpenVINO venv) and ort-cpu (this interpreter)."""
    return parse_profile(
        {
            "format": "omni-edge.profile/1",
            "name": name,
            "host": {"os": "linux", "ram_total_bytes": 24 * GiB, "ram_available_bytes": 16 * GiB},
            "devices": [
                {
                    "id": "cpu",
                    "kind": "cpu",
                    "name": "test x86 CPU",
                    "backends": ["ort-openvino", "ort-cpu"],
                    "backend_routes": {"ort-openvino": "openvino"},
                }
            ],
            "routes": [
                {"name": "this-process"},
                {"name": "openvino", "kind": "interpreter", "python": str(ov_python)},
            ],
        }
    )


ORT_COUNTS = """
import json, sys
import onnxruntime as ort
out = {}
for path in sys.argv[1:]:
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    s = ort.InferenceSession(path, so, providers=["OpenVINOExecutionProvider", "CPUExecutionProvider"],
                             provider_options=[{"device_type": "CPU"}, {}])
    counts = {}
    for sg in s.get_provider_graph_assignment_info():
        counts[sg.ep_name] = counts.get(sg.ep_name, 0) + len(sg.get_nodes())
    out[path] = {"counts": counts, "providers": s.get_providers()}
print(json.dumps(out))
"""


def ort_own_counts(paths: list[Path]) -> dict[str, Any]:
    """ONNX Runtime's own per-EP node counts, asked directly in the OpenVINO venv
    (independent of omni-edge's worker)."""
    proc = subprocess.run(
        [str(OV_PYTHON), "-c", ORT_COUNTS, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def placement(artifact: Path, backend: str = "ort-openvino", **stage: Any) -> Placement:
    """The placement of an exported_graph stage on this machine's CPU device with ``backend``."""
    kind = ExportedGraphKind()
    cfg = ExportedGraphConfig(
        name="s", kind="exported_graph", devices=["cpu"], artifact=str(artifact), **stage
    )
    profile = machine_profile()
    device = profile.device("cpu")
    assert device is not None
    route = profile.route(device.route_for(backend))
    assert route is not None
    info = kind.describe(cfg)
    gate = kind.gate_spec(cfg, info, device, backend)
    assert gate is not None
    return placement_for(gate, route)


def one_stage_cli_args(tmp_path: Path, artifact: Path, command: str = "plan") -> list[str]:
    """CLI arguments for ``command`` on a one-stage pipeline (``net``: the artifact
    on the CPU EP) and a small CPU-only profile, both written under ``tmp_path``."""
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "stages": [
                    {
                        "name": "net",
                        "kind": "exported_graph",
                        "artifact": str(artifact),
                        "devices": ["cpu"],
                        "backends": ["ort-cpu"],
                        "final_output": True,
                    }
                ],
            }
        )
    )
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(
            {
                "format": "omni-edge.profile/1",
                "name": "test box",
                "host": {"os": "linux", "ram_total_bytes": 2**34, "ram_available_bytes": 2**33},
                "devices": [
                    {"id": "cpu", "kind": "cpu", "name": "test CPU", "backends": ["ort-cpu"]}
                ],
                "routes": [{"name": "this-process"}],
            }
        )
    )
    return [command, str(config), "--profile", str(profile)]
