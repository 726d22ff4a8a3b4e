"""A request that carries arrays: an exported graph taking a tensor is the entry stage.

The pipeline is one hook-less projection graph (``tests/helpers/graphs.py``: float32 [384]
embedding in, float32 [16] out) whose manifest consumes ``tensor:embedding<float32>[384]``.
The request is an array through the Python API (``Pipeline.run(array)`` or a mapping by input
name), the CLI (``omni-edge run CONFIG --input embedding=FILE.npy``) and the server (an
``input_tensor`` content part, base64 ``.npy``, sent by the real ``openai`` client); each
output is compared with onnxruntime run directly on the same array in the same test. A wrong
dtype or shape is refused by name before anything runs (exit 2, a 400 naming the part); a
``.npy`` holding pickled objects is never unpickled."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.core.errors import BadRequest, ConfigError
from tests.helpers import REPO
from tests.helpers.graphs import EMBEDDING, PROJECTED, cpu_outputs, write_artifact

pytestmark = [pytest.mark.ort]

OBJECT_NPY_MARK = "holds Python objects (an object array, stored pickled): it is not loaded"


def _pipeline(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(config, profile, artifact): the projection graph as the entry stage, on the CPU EP."""
    art = write_artifact(
        tmp_path / "proj",
        "projection",
        manifest={
            "consumes": [f"tensor:embedding<float32>[{EMBEDDING}]"],
            "produces": [f"tensor<float32>[{PROJECTED}]"],
        },
    )
    config = tmp_path / "project.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "project-a-tensor",
                "stages": [
                    {
                        "name": "proj",
                        "kind": "exported_graph",
                        "artifact": str(art),
                        "devices": ["cpu"],
                        "backends": ["ort-cpu"],
                        "final_output": True,
                        "final_output_type": "tensor",
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
    return config, profile, art


def _npy(array: np.ndarray, *, allow_pickle: bool = False) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=allow_pickle)
    return out.getvalue()


def _header_only(shape: list[int], dtype: str = "<f4") -> bytes:
    """A ``.npy`` that is all header: it declares ``shape`` and holds no data."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)}
    )
    return out.getvalue()


def _vector(seed: int = 3) -> np.ndarray:
    return np.random.RandomState(seed).randn(EMBEDDING).astype(np.float32)


def _object_array() -> np.ndarray:
    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = {"a": 1}, [1, 2]
    return arr


# ---- the config, the reader, the check: no Ray --------------------------------------------


def test_an_exported_graph_taking_a_tensor_may_take_the_request(tmp_path: Path) -> None:
    """Before: 'proj (exported_graph) consumes tensor:embedding<float32>[384], and a request carries text or audio'."""
    from orchestrator.api import audio_entry_stages, tensor_entry_stages
    from orchestrator.config import load_config

    config, _, _ = _pipeline(tmp_path)
    loaded = load_config(config)
    assert tensor_entry_stages(loaded) == ["proj"]
    assert audio_entry_stages(loaded) == []


def test_a_stage_consuming_only_events_still_cannot_take_the_request(tmp_path: Path) -> None:
    from orchestrator.config import load_config

    art = write_artifact(
        tmp_path / "proj",
        "projection",
        manifest={
            "consumes": ["event:segment"],
            "preprocess": "exports.sentence_encoder:preprocess",
        },
    )
    config = tmp_path / "p.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "p",
                "stages": [
                    {
                        "name": "proj",
                        "kind": "exported_graph",
                        "artifact": str(art),
                        "devices": ["cpu"],
                        "final_output": True,
                    }
                ],
            }
        )
    )
    with pytest.raises(ConfigError) as exc:
        load_config(config)
    assert any(
        p.what
        == "proj (exported_graph) consumes event:segment, and a request carries text or audio or "
        "tensor or token_ids"
        for p in exc.value.problems
    ), exc.value.problems


def test_tensor_request_reads_a_npy_and_never_unpickles(tmp_path: Path) -> None:
    from orchestrator.api import tensor_request

    vector = _vector()
    (tmp_path / "v.npy").write_bytes(_npy(vector))
    np.testing.assert_array_equal(tensor_request(tmp_path / "v.npy"), vector)
    np.testing.assert_array_equal(tensor_request(_npy(vector), where="part"), vector)
    (tmp_path / "obj.npy").write_bytes(_npy(_object_array(), allow_pickle=True))
    np.savez(tmp_path / "two.npz", a=vector, b=vector)
    (tmp_path / "text.npy").write_bytes(b"not numpy at all")
    cases = {
        tmp_path / "obj.npy": OBJECT_NPY_MARK,
        tmp_path / "two.npz": "is an .npz archive, not one array",
        tmp_path / "text.npy": "is not a readable .npy file",
        tmp_path / "none.npy": "no such file",
    }
    for path, what in cases.items():
        with pytest.raises(BadRequest) as exc:
            tensor_request(path)
        ((problem,),) = [exc.value.problems]
        assert problem.where == str(path) and what in problem.what, problem
    with pytest.raises(BadRequest) as exc:
        tensor_request(_npy(vector), where="part", max_bytes=100, bytes_flag="--max-tensor-mib")
    assert "over the cap of 100 bytes per tensor (--max-tensor-mib)" in str(exc.value)


def test_a_npy_header_is_checked_against_the_cap_and_the_file_before_anything_is_allocated() -> (
    None
):
    """A 128-byte ``.npy`` whose header declares 4 TB of float32: numpy would try to allocate
    that (a MemoryError, a 500 from the server); its declared size is checked first."""
    from orchestrator.api import tensor_request
    from orchestrator.server.protocol import chat_request

    huge = _header_only([100_000, 100_000, 100])
    assert len(huge) == 128
    with pytest.raises(BadRequest) as exc:
        chat_request({"messages": [{"role": "user", "content": [_part(huge)]}]}, tensor_entry=True)
    ((problem,),) = [exc.value.problems]
    assert problem.where == "messages[0].content[0].input_tensor.data"
    assert problem.what.startswith(
        "declares a float32 array of shape [100000, 100000, 100]: 4000000000000 bytes, over the "
        "cap of"
    ), problem
    assert "--max-tensor-mib" in problem.fix
    # with no cap (the Python API may lift it) the header still cannot promise more than it holds
    with pytest.raises(BadRequest) as exc:
        tensor_request(huge, where="part", max_bytes=None)
    assert "declares 4000000000000 bytes of data" in str(exc.value) and "holds 0" in str(exc.value)
    cut = _npy(_vector())[:-4]
    with pytest.raises(BadRequest, match="holds 1532: the file is cut short"):
        tensor_request(cut, where="part")


def test_cli_input_of_the_wrong_dtype_or_a_pickled_npy_is_exit_2_before_anything_runs(
    tmp_path: Path,
) -> None:
    config, profile, _ = _pipeline(tmp_path)
    np.save(tmp_path / "f64.npy", _vector().astype(np.float64))
    np.save(tmp_path / "short.npy", _vector()[:100])
    (tmp_path / "obj.npy").write_bytes(_npy(_object_array(), allow_pickle=True))
    cases = {
        "embedding=f64.npy": (
            "--input: request (stage proj, kind exported_graph): embedding",
            "a float64[384] array came; the graph takes embedding float32[384]",
        ),
        "embedding=short.npy": (
            "--input: request (stage proj, kind exported_graph): embedding",
            "a float32[100] array came; the graph takes embedding float32[384]",
        ),
        "embeding=short.npy": (
            "--input: request (stage proj, kind exported_graph)",
            "a mapping of embeding came, and the graph takes embedding float32[384]; missing: "
            "embedding; unknown: embeding",
        ),
        "embedding=obj.npy": ("--input embedding=obj.npy", OBJECT_NPY_MARK),
    }
    for arg, (where, what) in cases.items():
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "run",
                str(config),
                "--profile",
                str(profile),
                "--input",
                arg,
                "--no-calibration",
                "--record",
                str(tmp_path / "runs"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert proc.returncode == 2, (arg, proc.stderr[-2000:])
        assert proc.stderr.startswith("error:") and f"{where}: {what}" in " ".join(
            proc.stderr.split()
        ), (arg, proc.stderr)
        assert "Traceback" not in proc.stderr and "how to fix:" in proc.stderr
        assert "starting: Ray" not in proc.stderr, "refused before anything started"
        assert not (tmp_path / "runs").exists(), "nothing written"
        print(f"{arg}: exit 2 in {time.perf_counter() - t0:.1f} s")


def test_cli_input_to_a_pipeline_without_a_tensor_entry_is_exit_2(tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", _vector())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            str(REPO / "configs/voice-assistant.yaml"),
            "--input",
            "embedding=v.npy",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        "--input: pipeline 'voice-assistant' has no entry stage that consumes a tensor"
        in " ".join(proc.stderr.split())
    ), proc.stderr


def _part(array: np.ndarray | bytes, name: str | None = "embedding") -> dict[str, Any]:
    data = array if isinstance(array, bytes) else _npy(array)
    part: dict[str, Any] = {"data": base64.b64encode(data).decode()}
    if name is not None:
        part["name"] = name
    return {"type": "input_tensor", "input_tensor": part}


def test_the_protocol_reads_input_tensor_parts_and_names_each_bad_one() -> None:
    from orchestrator.server.protocol import ServerLimits, chat_request

    vector = _vector()
    one = chat_request(
        {"messages": [{"role": "user", "content": [_part(vector)]}]}, tensor_entry=True
    )
    assert set(one) == {"embedding"}
    np.testing.assert_array_equal(one["embedding"], vector)
    bare = chat_request(
        {"messages": [{"role": "user", "content": [_part(vector, None)]}]}, tensor_entry=True
    )
    np.testing.assert_array_equal(bare, vector)
    at = "messages[0].content[0].input_tensor"
    bad: list[tuple[dict[str, Any], bool, ServerLimits | None, str, str]] = [
        (
            {"messages": [{"role": "user", "content": [_part(vector)]}]},
            False,
            None,
            "messages[0].content[0]",
            "this pipeline has no entry stage that consumes a tensor",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [_part(_npy(_object_array(), allow_pickle=True))]}
                ]
            },
            True,
            None,
            f"{at}.data",
            OBJECT_NPY_MARK,
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_tensor", "input_tensor": {"data": "%%%"}}],
                    }
                ]
            },
            True,
            None,
            f"{at}.data",
            "is not base64",
        ),
        (
            {"messages": [{"role": "user", "content": [_part(vector)]}]},
            True,
            ServerLimits(max_tensor_bytes=1000),
            f"{at}.data",
            "over the cap of 1000 bytes per request (--max-tensor-mib)",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [_part(vector), {"type": "text", "text": "and this"}],
                    }
                ]
            },
            True,
            None,
            "messages[0].content[1]",
            "text next to the arrays",
        ),
        (
            {"messages": [{"role": "user", "content": [_part(vector)]}], "temperature": 0.5},
            True,
            None,
            "temperature",
            "with arrays that stage takes none",
        ),
        (
            {"messages": [{"role": "user", "content": [_part(vector), _part(vector)]}]},
            True,
            None,
            "messages[0].content[1].input_tensor.name",
            "input given twice",
        ),
        (
            {"messages": [{"role": "user", "content": [_part(vector, None), _part(vector, "b")]}]},
            True,
            None,
            "messages[0].content[1].input_tensor.name",
            "is missing, and the request carries several arrays",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_tensor", "input_tensor": {"name": "x"}}],
                    }
                ]
            },
            True,
            None,
            f"{at}.data",
            "is required",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            True,
            None,
            "messages[0].content[0]",
            "only text, input_audio and input_tensor content parts are served",
        ),
    ]
    for body, entry, limits, where, what in bad:
        with pytest.raises(BadRequest) as exc:
            chat_request(body, tensor_entry=entry, limits=limits)
        problem = exc.value.problems[0]
        assert problem.where == where and what in problem.what, (where, what, problem)
        assert problem.fix, problem


# ---- on Ray: the Python API, the CLI and the server ------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_an_array_through_the_python_api_equals_onnxruntime_and_a_wrong_one_is_refused_first(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from orchestrator.api import Pipeline, prompt_label

    config, profile, art = _pipeline(tmp_path)
    vector, other = _vector(3), _vector(4)
    with Pipeline.from_config(config, profile=profile, record=None, calibration=False) as pipeline:
        bare = pipeline.run(vector, record=None)
        named = pipeline.run({"embedding": other}, record=None)
        with pytest.raises(BadRequest) as exc:
            pipeline.run(vector[:-1], record=None)
        assert pipeline.runtime.admission.in_flight == 0
        with pytest.raises(BadRequest) as text_exc:
            pipeline.run("The Moon.", record=None)
    ((proj,), (proj2,)) = bare.outputs["proj"], named.outputs["proj"]
    np.testing.assert_allclose(
        proj["projected"],
        cpu_outputs(art / "fp32.onnx", {"embedding": vector})["projected"],
        rtol=1e-6,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        proj2["projected"],
        cpu_outputs(art / "fp32.onnx", {"embedding": other})["projected"],
        rtol=1e-6,
        atol=1e-6,
    )
    assert bare.prompt == prompt_label(vector) == "(tensor: float32[384])"
    assert str(exc.value).startswith(
        "request (stage proj, kind exported_graph): embedding: a float32[383] array "
        "came; the graph takes embedding float32[384]"
    ), str(exc.value)
    assert str(text_exc.value).startswith(
        "request: text came, and proj (exported_graph), which takes the request, "
        "consumes tensor:embedding<float32>[384]"
    ), str(text_exc.value)


@pytest.mark.ray
@pytest.mark.slow
def test_an_array_through_omni_edge_run_input_equals_onnxruntime(tmp_path: Path) -> None:
    config, profile, art = _pipeline(tmp_path)
    vector = _vector(5)
    np.save(tmp_path / "v.npy", vector)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            str(config),
            "--profile",
            str(profile),
            "--input",
            "embedding=v.npy",
            "--json",
            "--no-calibration",
            "--record",
            str(tmp_path / "run.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    ((item,),) = [out["outputs"]["proj"]]
    np.testing.assert_allclose(
        np.asarray(item["projected"], np.float32),
        cpu_outputs(art / "fp32.onnx", {"embedding": vector})["projected"],
        rtol=1e-6,
        atol=1e-6,
    )
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["requests"][0]["prompt"] == "(tensor: embedding float32[384])"
    assert "proj: 1 items (tensor)" in proc.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_an_input_tensor_part_through_serve_and_the_openai_client_equals_onnxruntime(
    tmp_path: Path,
) -> None:
    openai = pytest.importorskip("openai")
    from tests.helpers.serve import ServeProcess

    config, profile, art = _pipeline(tmp_path)
    serve = ServeProcess(
        config, "--profile", str(profile), "--no-calibration", cwd=tmp_path, start_timeout_s=600
    )
    try:
        client = openai.OpenAI(
            base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        vector = _vector(6)
        reply = client.chat.completions.create(
            model="project-a-tensor", messages=[{"role": "user", "content": [_part(vector)]}]
        )
        message = reply.choices[0].message
        ((out,),) = [message.model_extra["outputs"]]
        assert out["stage"] == "proj" and set(out["tensors"]) == {"projected"}
        got = np.load(io.BytesIO(base64.b64decode(out["tensors"]["projected"])), allow_pickle=False)
        np.testing.assert_allclose(
            got,
            cpu_outputs(art / "fp32.onnx", {"embedding": vector})["projected"],
            rtol=1e-6,
            atol=1e-6,
        )
        streamed = [
            c
            for c in client.chat.completions.create(
                model="project-a-tensor",
                messages=[{"role": "user", "content": [_part(vector, None)]}],
                stream=True,
            )
        ]
        outs = [
            o
            for c in streamed
            if c.choices
            for o in (c.choices[0].delta.model_extra or {}).get("outputs", [])
        ]
        assert len(outs) == 1
        np.testing.assert_array_equal(
            np.load(io.BytesIO(base64.b64decode(outs[0]["tensors"]["projected"]))), got
        )
        for part, where, what in [
            (
                _part(vector.astype(np.float64)),
                "messages[0].content[0].input_tensor",
                "embedding: a float64[384] array came; the graph takes embedding float32[384]",
            ),
            (_part(vector[:10]), "messages[0].content[0].input_tensor", "a float32[10] array came"),
            (
                _part(_npy(_object_array(), allow_pickle=True)),
                "messages[0].content[0].input_tensor.data",
                OBJECT_NPY_MARK,
            ),
            (
                _part(_header_only([100_000, 100_000, 100])),
                "messages[0].content[0].input_tensor.data",
                "declares a float32 array of shape [100000, 100000, 100]: 4000000000000 bytes",
            ),
        ]:
            with pytest.raises(openai.BadRequestError) as exc:
                client.chat.completions.create(
                    model="project-a-tensor", messages=[{"role": "user", "content": [part]}]
                )
            err = exc.value.body
            assert (
                exc.value.status_code == 400 and err["param"] == where and what in err["message"]
            ), err
        status = client.get("/status", cast_to=object)
        assert status["queue"]["in_flight"] == 0
        assert [r["endpoint"] for r in status["recent"]] == ["chat", "chat"], (
            "the refused requests never ran"
        )
    finally:
        rc = serve.stop()
    assert rc == 0, serve.output()
