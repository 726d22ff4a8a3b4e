"""The route worker's wire format: arrays arrive exactly as they were sent.

A route must be transparent — a graph verified through the OpenVINO venv has to
see the same feeds as one run in this interpreter. ``np.ascontiguousarray``
once turned silero VAD's 0-d ``sr`` into shape (1,), and the OpenVINO EP was
then blamed with ``numeric_gate_failed`` for refusing it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.ort.wire import MAGIC, encode, read_message


def _f_order() -> np.ndarray:
    return np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))


ARRAYS: dict[str, Any] = {
    "0-d int64 (silero's sr)": np.array(16000, dtype=np.int64),
    "0-d float64": np.array(-2.5),
    "0-d bool": np.array(True),
    "empty 2-d": np.zeros((0, 3), dtype=np.float32),
    "empty 1-d int64": np.zeros(0, dtype=np.int64),
    "non-contiguous slice": np.arange(24, dtype=np.float64).reshape(4, 6)[::2, 1::2],
    "transposed 3-d": np.arange(24, dtype=np.int16).reshape(2, 3, 4).transpose(2, 0, 1),
    "Fortran order": _f_order(),
    "big-endian int32": np.arange(5, dtype=">i4"),
    "big-endian float64": np.linspace(-1, 1, 4).astype(">f8"),
    "bool": np.array([[True, False, True]]),
    "float16": np.array([1.5, -2.0, 65504.0, np.inf], dtype=np.float16),
    "int64": np.array([[-(2**62), 2**62]], dtype=np.int64),
    "uint8": np.arange(250, 256, dtype=np.uint8),
    "complex64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "float32 with nan": np.array([np.nan, 0.0, -0.0], dtype=np.float32),
    "unicode fixed width": np.array(["ab", "c"]),
    "string tensor (object)": np.array(["héllo", "a\x00", ""], dtype=object),
    "empty string tensor": np.zeros((0, 2), dtype=object),
}
SCALARS: dict[str, Any] = {
    "numpy int64 scalar": np.int64(16000),
    "numpy float16 scalar": np.float16(0.25),
    "numpy bool scalar": np.bool_(False),
}


def _roundtrip(message: dict[str, Any]) -> dict[str, Any]:
    stream = io.BytesIO(encode(message))
    out = read_message(stream)
    assert out is not None
    assert read_message(stream) is None  # one frame, nothing left over
    return out


def _assert_same(got: Any, sent: Any) -> None:
    assert type(got) is type(sent) or (isinstance(sent, np.ndarray) and type(got) is np.ndarray)
    assert got.shape == sent.shape
    assert got.dtype == sent.dtype and got.dtype.str == sent.dtype.str  # byte order included
    if sent.dtype == object:
        assert got.tolist() == sent.tolist()
    else:
        assert np.array_equal(got, sent, equal_nan=sent.dtype.kind in "fc")
        assert got.tobytes() == np.ascontiguousarray(sent).tobytes()


@pytest.mark.parametrize("name", list(ARRAYS))
def test_an_array_survives_encode_and_read_message_exactly(name: str) -> None:
    sent = ARRAYS[name]
    got = _roundtrip({"id": 1, "args": {"feeds": {"x": sent}}})["args"]["feeds"]["x"]
    _assert_same(got, sent)
    if got.size and got.dtype != object:
        assert got.flags.writeable and got.flags.c_contiguous  # the receiver owns a normal array


@pytest.mark.parametrize("name", list(SCALARS))
def test_a_numpy_scalar_stays_a_numpy_scalar_of_its_dtype(name: str) -> None:
    sent = SCALARS[name]
    got = _roundtrip({"result": {"v": sent}})["result"]["v"]
    assert isinstance(got, np.generic) and not isinstance(got, np.ndarray)
    _assert_same(got, sent)


def test_arrays_nested_in_lists_and_beside_plain_values_keep_their_places() -> None:
    a, b = np.array(1, dtype=np.int64), np.zeros((2, 0), dtype=np.float16)
    got = _roundtrip(
        {"id": 7, "ok": True, "result": {"outputs": [a, {"b": b}], "run_s": 0.5, "name": "x"}}
    )
    assert got["id"] == 7 and got["result"]["run_s"] == 0.5 and got["result"]["name"] == "x"
    _assert_same(got["result"]["outputs"][0], a)
    _assert_same(got["result"]["outputs"][1]["b"], b)


def test_what_cannot_cross_exactly_is_refused_not_mangled() -> None:
    with pytest.raises(TypeError, match=r"holds str .* not int"):
        encode({"x": np.array(["a", 1], dtype=object)})
    with pytest.raises(TypeError, match="cannot cross a route"):
        encode({"x": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")])})


def test_a_buffer_that_does_not_match_its_shape_is_a_protocol_error() -> None:
    frame = encode({"x": np.arange(3, dtype=np.int64)})
    # Claim 4 elements for the 24 bytes that were sent.
    tampered = frame.replace(b'"shape": [3]', b'"shape": [4]')  # same header length
    assert tampered != frame and tampered[:4] == MAGIC
    with pytest.raises(ValueError, match="protocol error: 24 bytes for \\[4\\] of <i8"):
        read_message(io.BytesIO(tampered))


# ---- through a real worker process ------------------------------------------------


def _identity_graph(path: Path) -> list[str]:
    """Identity on inputs of the awkward kinds; returns the input names."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import save

    specs = [
        ("sr", T.INT64, []),
        ("empty", T.FLOAT, [0, 3]),
        ("flags", T.BOOL, [2]),
        ("half", T.FLOAT16, [4]),
        ("strided", T.INT64, [2, 2]),
        ("big", T.INT32, [5]),
    ]
    graph = h.make_graph(
        [h.make_node("Identity", [n], [f"{n}_out"]) for n, _, _ in specs],
        "identity",
        [h.make_tensor_value_info(n, t, s) for n, t, s in specs],
        [h.make_tensor_value_info(f"{n}_out", t, s) for n, t, s in specs],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, path)
    return [n for n, _, _ in specs]


@pytest.mark.openvino
@pytest.mark.parametrize(
    "providers", [["OpenVINOExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"]]
)
def test_feeds_reach_onnx_runtime_in_the_openvino_venv_unchanged(
    tmp_path: Path, providers: list[str], ov_host: Any
) -> None:
    pytest.importorskip("onnx")
    graph = tmp_path / "identity.onnx"
    names = _identity_graph(graph)
    feeds = {
        "sr": np.array(16000, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "flags": np.array([True, False]),
        "half": np.array([1.5, -2.0, 65504.0, 0.0], dtype=np.float16),
        "strided": np.arange(8, dtype=np.int64).reshape(2, 4)[:, ::2],
        "big": np.arange(5, dtype=">i4"),
    }
    opened = ov_host.open(
        {
            "graph": str(graph),
            "providers": providers,
            "provider_options": [{} for _ in providers],
            "session_options": {},
            "session_config": {},
        }
    )
    try:
        outputs = ov_host.run(opened["handle"], feeds)["outputs"]
    finally:
        ov_host.close(opened["handle"])
    for name in names:
        got, sent = outputs[f"{name}_out"], feeds[name]
        assert got.shape == sent.shape, name
        assert np.array_equal(got, sent), name
        # ONNX Runtime answers in native byte order; every other dtype is the one sent.
        assert got.dtype == sent.dtype.newbyteorder("="), name
    assert outputs["sr_out"].ndim == 0 and int(outputs["sr_out"]) == 16000


def test_this_process_and_a_worker_see_the_same_big_endian_values(tmp_path: Path) -> None:
    """ONNX Runtime reads buffers as native-endian whatever the dtype says; the
    session host converts, so a big-endian reference feed is not silently garbled."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from orchestrator.ort.sessions import open_sessions, this_process

    graph = tmp_path / "identity.onnx"
    _identity_graph(graph)
    host = open_sessions(this_process())
    opened = host.open(
        {
            "graph": str(graph),
            "providers": ["CPUExecutionProvider"],
            "provider_options": [{}],
            "session_options": {},
            "session_config": {},
        }
    )
    feeds = {
        "sr": np.array(8000, dtype=">i8"),
        "empty": np.zeros((0, 3), dtype=">f4"),
        "flags": np.array([False, True]),
        "half": np.ones(4, dtype=">f2"),
        "strided": np.zeros((2, 2), dtype=np.int64),
        "big": np.arange(5, dtype=">i4"),
    }
    out = host.run(opened["handle"], feeds)["outputs"]
    assert out["big_out"].tolist() == [0, 1, 2, 3, 4]
    assert int(out["sr_out"]) == 8000 and out["half_out"].tolist() == [1.0] * 4


@pytest.mark.openvino
def test_the_openvino_venvs_session_is_given_the_planned_precision(ov_host: Any) -> None:
    """The built-in OpenVINO EP (onnxruntime-openvino): the session the route worker opens
    for an fp32 placement on the CPU gets load_config with INFERENCE_PRECISION_HINT f32
    (the EP reports no options back, so the worker says what it gave), and computes
    like the CPU EP."""
    import json

    from orchestrator.core.backends import session_spec
    from stages.exported_graph.artifact import load_artifact
    from tests.helpers import REPO

    artifact = load_artifact(REPO / "exports" / "silero-vad-op18")
    graph = str(artifact.resolve(artifact.manifest.precisions["fp32"]))
    spec = session_spec(
        "ort-openvino",
        graph=graph,
        device_kind="cpu",
        device_id="cpu",
        precision="fp32",
        cache_key="t",
    )
    feeds = artifact.reference_inputs()
    opened = ov_host.open(spec.to_dict())
    reference = ov_host.open(
        {
            "graph": graph,
            "providers": ["CPUExecutionProvider"],
            "provider_options": [{}],
            "session_options": {},
            "session_config": {},
        },
        record=False,
    )
    try:
        got = ov_host.run(opened["handle"], feeds)["outputs"]
        want = ov_host.run(reference["handle"], feeds)["outputs"]
    finally:
        ov_host.close(opened["handle"])
        ov_host.close(reference["handle"])
    assert opened["providers"][0] == "OpenVINOExecutionProvider" and opened["plugin"] is None
    assert json.loads(opened["ep_options"]["given"]["load_config"]) == {
        "CPU": {"INFERENCE_PRECISION_HINT": "f32"}
    }
    for name, value in want.items():
        rel = float(np.linalg.norm(got[name] - value) / (np.linalg.norm(value) or 1.0))
        assert rel < 1e-5, (name, rel)  # f32 (bf16 measured 6.2e-2 on a CPU with AMX-BF16)


# ---- the session spec at the process boundary ---------------------------------------


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"providers": ["CPUExecutionProvider"], "provider_options": [{}]}, "'graph'"),
        ({"graph": "g.onnx", "provider_options": [{}]}, "'providers'"),
        ({"graph": "g.onnx", "providers": ["CPUExecutionProvider"]}, "'provider_options'"),
        (
            {"graph": "g.onnx", "providers": "CPUExecutionProvider", "provider_options": [{}]},
            "'providers' is",
        ),
        (
            {
                "graph": "g.onnx",
                "providers": ["CPUExecutionProvider"],
                "provider_options": [{}, {}],
            },
            "2 entries for 1",
        ),
        (
            {
                "graph": "g.onnx",
                "providers": ["CPUExecutionProvider"],
                "provider_options": [{}],
                "session_options": [],
            },
            "'session_options' is a list",
        ),
    ],
)
def test_a_malformed_session_spec_is_refused_by_the_key_it_lacks(
    spec: dict[str, Any], named: str
) -> None:
    """Where the route receives a spec, a missing or mistyped key is a ValueError that names it
    (it was a bare ``KeyError: 'providers'`` from deep inside ``open``), before onnxruntime loads."""
    from orchestrator.ort.worker import Sessions

    with pytest.raises(ValueError, match="session spec") as caught:
        Sessions().open(spec)  # type: ignore[arg-type]  # malformed on purpose
    assert named in str(caught.value)
    assert "SessionSpec.to_dict()" in str(caught.value)  # the remedy: what a spec holds


def test_a_malformed_spec_through_a_session_host_is_a_remote_error_naming_the_key() -> None:
    """In-process, the refusal arrives as the RemoteError every caller already handles."""
    pytest.importorskip("onnxruntime")
    from orchestrator.ort.sessions import RemoteError, open_sessions, this_process

    host = open_sessions(this_process())
    with pytest.raises(RemoteError) as caught:
        host.open({"graph": "g.onnx", "provider_options": [{}]})
    assert caught.value.type_name == "ValueError"
    assert "'providers'" in caught.value.message and "session spec" in caught.value.message


def test_a_worker_session_host_refuses_a_malformed_spec_before_asking_the_route(
    tmp_path: Path,
) -> None:
    """The worker-process client checks the spec before spelling its paths for the route
    (it was a ``KeyError: 'provider_options'`` on the client side); the worker is untouched."""
    import sys

    from orchestrator.ort.sessions import ResolvedRoute, WorkerSessions

    host = WorkerSessions(ResolvedRoute("plain", "interpreter", sys.executable))
    try:
        with pytest.raises(ValueError, match="'provider_options'") as caught:
            host.open({"graph": str(tmp_path / "g.onnx"), "providers": ["CPUExecutionProvider"]})
        assert "session spec" in str(caught.value)
        assert host.calls == 0 and not host._opened
    finally:
        host.shutdown()
