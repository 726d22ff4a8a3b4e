"""Bounded fuzzing of the readers that take files from outside: any bytes give a
parsed result or a ``ConfigError`` (exit 2 at the CLI), never another exception.

Deterministic for CI: ``derandomize=True`` and a fixed example budget. The
strategies start from valid files and damage them (flipped, cut, spliced
bytes) as well as drawing raw bytes, so the fuzzer reaches past the first
check of each reader.
"""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import ConfigError
from stages.ar_decode.checkpoint import read_gguf, read_safetensors_header
from stages.exported_graph.artifact import load_artifact
from tests.test_bad_inputs import MANIFEST_OK, gguf

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_counter = itertools.count()


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


def damaged(valid: bytes) -> st.SearchStrategy[bytes]:
    """``valid`` with bytes flipped, cut short, or with random bytes spliced in; or raw bytes."""
    flip = st.lists(
        st.tuples(st.integers(0, max(len(valid) - 1, 0)), st.integers(0, 255)), max_size=8
    ).map(lambda edits: bytes(_apply(valid, edits)))
    cut = st.integers(0, len(valid)).map(lambda n: valid[:n])
    splice = st.tuples(st.integers(0, len(valid)), st.binary(max_size=64)).map(
        lambda t: valid[: t[0]] + t[1] + valid[t[0] :]
    )
    return st.one_of(flip, cut, splice, st.binary(max_size=512))


def _apply(data: bytes, edits: list[tuple[int, int]]) -> bytearray:
    out = bytearray(data)
    for i, b in edits:
        if out:
            out[i % len(out)] = b
    return out


def _fresh(tmp_path: Path, suffix: str) -> Path:
    return tmp_path / f"case{next(_counter)}{suffix}"


SAFETENSORS_OK = (lambda body: struct.pack("<Q", len(body)) + body)(
    json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]},
        }
    ).encode()
)

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["dtype", "shape", "data_offsets", "x"]), inner, max_size=4
        )
    ),
    max_leaves=12,
)


def _reads_or_refuses(fn: Any, path: Path) -> Any:
    try:
        return fn(path)
    except ConfigError as exc:
        assert exc.problems and all(p.where and p.what for p in exc.problems)
        return None


@FUZZ
@given(data=damaged(SAFETENSORS_OK))
def test_safetensors_header_reader_never_raises_anything_else(tmp_path: Path, data: bytes) -> None:
    path = _fresh(tmp_path, ".safetensors")
    path.write_bytes(data)
    header = _reads_or_refuses(read_safetensors_header, path)
    if header is not None:
        for name, entry in header.items():
            if name != "__metadata__":
                start, end = entry["data_offsets"]
                assert 0 <= start <= end


@FUZZ
@given(header=st.dictionaries(st.text(max_size=6), _json_values, max_size=4))
def test_safetensors_headers_of_any_json_shape_are_read_or_refused(
    tmp_path: Path, header: dict[str, Any]
) -> None:
    body = json.dumps(header).encode()
    path = _fresh(tmp_path, ".safetensors")
    path.write_bytes(struct.pack("<Q", len(body)) + body)
    _reads_or_refuses(read_safetensors_header, path)


@FUZZ
@given(data=damaged(gguf()))
def test_gguf_header_reader_never_raises_anything_else(tmp_path: Path, data: bytes) -> None:
    path = _fresh(tmp_path, ".gguf")
    path.write_bytes(data)
    manifest = _reads_or_refuses(read_gguf, path)
    if manifest is not None:
        assert manifest.weight_bytes >= 0


@FUZZ
@given(data=damaged(MANIFEST_OK.encode()))
def test_manifest_loader_never_raises_anything_else(tmp_path: Path, data: bytes) -> None:
    art = _fresh(tmp_path, "")
    art.mkdir()
    (art / "model.onnx").write_bytes(b"")
    (art / "ref.npz").write_bytes(b"")
    (art / "manifest.yaml").write_bytes(data)
    _reads_or_refuses(load_artifact, art)


_config_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "stages",
                    "kind",
                    "model",
                    "devices",
                    "inputs",
                    "max_model_len",
                    "artifact",
                    "stage_args",
                    "engine_args",
                    "engine_input_source",
                    "stage_id",
                    "final_output",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=16,
)


@FUZZ
@given(data=_config_values)
def test_pipeline_config_of_any_shape_is_parsed_or_refused(tmp_path: Path, data: Any) -> None:
    from orchestrator.config import parse_config

    try:
        parse_config(data, where="p.yaml", base_dir=tmp_path)
    except ConfigError as exc:
        assert exc.problems and all(p.where and p.what for p in exc.problems)


@FUZZ
@given(data=_config_values)
def test_profile_of_any_shape_is_parsed_or_refused(data: Any) -> None:
    from orchestrator.core.profile import parse_profile

    try:
        parse_profile(data, where="profile.json")
    except ConfigError as exc:
        assert exc.problems and all(p.where and p.what for p in exc.problems)
