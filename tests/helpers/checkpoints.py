"""Tiny checkpoints the planner reads: a real ``config.json`` and safetensors headers
over sparse data regions (the planner never reads the weights)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


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
        path = directory / (
            f"model-{i + 1:05d}-of-{files:05d}.safetensors" if files > 1 else "model.safetensors"
        )
        with path.open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(8 + len(raw) + offset)
    return directory


def llama_config(
    layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, **extra: Any
) -> dict[str, Any]:
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
