"""Fixtures and helpers every test directory can reach.

* tiny checkpoints written by the tests, inline profiles (below);
* ``private_cache`` and ``store``: a private OMNI_EDGE_CACHE_DIR per test, so
  evidence never leaks between tests (not autouse: the directories whose tests
  verify placements turn it on in their own conftest.py);
* ``private_calibration`` (autouse): an empty measurement store
  (OMNI_EDGE_CALIBRATION_DIR) per module and per test, so no plan depends on
  the peaks this machine measured before, nor on another test's run;
* ``ov_host``: one worker in the OpenVINO venv, shared by a module's tests;
* ``ray_cluster``: one local Ray cluster for the whole session.

Graph and artifact helpers are in ``tests/helpers/graphs.py``, the echo kind's
hand-written plans in ``tests/helpers/echo.py``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.profile import HardwareProfile, parse_profile
from orchestrator.units import GiB
from orchestrator.verify.evidence import EvidenceStore
from tests.helpers.graphs import OV_PYTHON

REPO = Path(__file__).resolve().parents[1]
TEST_DEVICES = ["cpu", "igpu:0", "npu:0", "gpu:0"]
"""The devices the test cluster's node declares resources for."""


def write_checkpoint(
    directory: Path,
    config: dict[str, Any],
    tensors: dict[str, tuple[str, list[int]]],
    *,
    files: int = 1,
) -> Path:
    """A checkpoint dir: config.json and safetensors files whose headers are real
    and whose data regions are sparse (the planner never reads them)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "F8_E4M3": 1}
    names = list(tensors)
    for i in range(files):
        part = names[i::files]
        header: dict[str, Any] = {}
        offset = 0
        for name in part:
            dtype, shape = tensors[name]
            n = sizes[dtype]
            for d in shape:
                n *= d
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
        raw = json.dumps(header).encode()
        path = directory / (f"model-{i + 1:05d}-of-{files:05d}.safetensors" if files > 1 else "model.safetensors")
        with path.open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(8 + len(raw) + offset)
    return directory


def llama_config(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": hidden * 4,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        **extra,
    }


def make_profile(*devices: dict[str, Any], ram_available: int = 16 * GiB, ram_total: int = 32 * GiB,
                 ram_limit: int | None = None, routes: list[dict[str, Any]] | None = None,
                 name: str = "test machine") -> HardwareProfile:
    cpu = {"id": "cpu", "kind": "cpu", "name": "test CPU", "backends": ["vllm-cpu", "ort-cpu"]}
    doc = {
        "format": "omni-edge.profile/1",
        "name": name,
        "host": {"os": "linux", "ram_total_bytes": ram_total, "ram_available_bytes": ram_available, "ram_limit_bytes": ram_limit},
        "devices": [cpu, *devices],
        "routes": routes or [{"name": "this-process"}],
    }
    return parse_profile(doc)


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    cfg = llama_config()
    tensors = {f"model.layers.{i}.mlp.weight": ("BF16", [64, 256]) for i in range(2)}
    tensors["model.embed_tokens.weight"] = ("BF16", [1000, 64])
    return write_checkpoint(tmp_path / "tiny", cfg, tensors)


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own OMNI_EDGE_CACHE_DIR: evidence never leaks between tests."""
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="module", autouse=True)
def _module_calibration(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty measurement store for a module's own fixtures (a pipeline started once per module)."""
    root = tmp_path_factory.mktemp("calibration")
    old = os.environ.get("OMNI_EDGE_CALIBRATION_DIR")
    os.environ["OMNI_EDGE_CALIBRATION_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("OMNI_EDGE_CALIBRATION_DIR", None)
    else:
        os.environ["OMNI_EDGE_CALIBRATION_DIR"] = old


@pytest.fixture(autouse=True)
def private_calibration(_module_calibration: Path, request: pytest.FixtureRequest,
                        monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own empty measurement store (created only when something records)."""
    root = _module_calibration / f"t{abs(hash(request.node.nodeid)):x}"
    monkeypatch.setenv("OMNI_EDGE_CALIBRATION_DIR", str(root))
    return root


@pytest.fixture
def store(private_cache: Path) -> EvidenceStore:
    return EvidenceStore()


@pytest.fixture(scope="module")
def ov_host() -> Iterator[object]:
    """One worker in the OpenVINO venv, shared by a module's tests (one interpreter start)."""
    if not OV_PYTHON.exists():
        pytest.skip(f"the OpenVINO route is missing: {OV_PYTHON} (scripts/bootstrap.sh creates it)")
    from orchestrator.ort.routes import resolve
    from orchestrator.ort.sessions import open_sessions
    from orchestrator.profile import Route

    host = open_sessions(resolve(Route(name="openvino", kind="interpreter", python=str(OV_PYTHON))))
    yield host
    host.shutdown()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster per test session: starting Ray costs ~5–10 s on a
    2-core box, so every test that needs one shares it
    (``orchestrator.runtime.cluster.connect``, which pipelines in the same process
    join). Its node declares the resources of every device the tests place
    stages on."""
    pytest.importorskip("ray")
    from orchestrator.runtime import cluster

    c = cluster.connect(TEST_DEVICES)
    yield c
    cluster.release()
