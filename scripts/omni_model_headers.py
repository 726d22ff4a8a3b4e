"""Write a metadata-only checkpoint directory: safetensors files that hold their headers only.

    python scripts/omni_model_headers.py configs/models/qwen3-omni-30b-a3b

Planning reads a checkpoint's ``config.json`` and the first 8 + N bytes of each safetensors
file (``stages.ar_decode.checkpoint``), never the weights. For a checkpoint whose weights
cannot be had here, this writes those bytes alone: transformers' own model class for the
directory's ``config.json`` (``architectures[0]``) is built on the meta device (no memory, no
weights), and each tensor of its state dict is listed with the checkpoint's dtype (the config's
``dtype``) and its shape, filled into shards of at most ``SHARD_CAP_BYTES`` in state-dict order as
``save_pretrained`` does, with ``model.safetensors.index.json`` beside them. A file that holds its
header only is named so by the manifest reader ("header only"), and no engine can load it.

The names are transformers' module names at the installed version: a mixture-of-experts layer's
experts are one fused tensor per projection ([experts, …]) where the published files store each
expert separately — the same bytes.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

SHARD_CAP_BYTES = 5 * 10**9
"""transformers' ``save_pretrained`` default ``max_shard_size`` ("5GB") before version 5."""
DTYPES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}
NOTE = (
    "header only: tensor names, dtypes and shapes for planning, no weights (scripts/omni_model_headers.py "
    "from config.json with transformers {version})"
)


def tensors(config: dict) -> list[tuple[str, list[int]]]:
    """(name, shape) of every tensor the model class holds for ``config``, in state-dict order."""
    import torch
    import transformers

    cls = getattr(transformers, config["architectures"][0])
    cfg = cls.config_class(**{k: v for k, v in config.items() if k != "architectures"})
    with torch.device("meta"):
        model = cls(cfg)
    return [(name, list(t.shape)) for name, t in model.state_dict().items()]


def write(directory: Path) -> dict:
    import transformers

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    dtype, size = DTYPES[str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")]
    shards: list[list[tuple[str, list[int], int]]] = [[]]
    filled = 0
    for name, shape in tensors(config):
        n = size
        for d in shape:
            n *= d
        if shards[-1] and filled + n > SHARD_CAP_BYTES:
            shards.append([])
            filled = 0
        shards[-1].append((name, shape, n))
        filled += n
    for old in directory.glob("*.safetensors"):
        old.unlink()
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        header: dict = {
            "__metadata__": {
                "format": "pt",
                "omni_edge": NOTE.format(version=transformers.__version__),
            }
        }
        offset = 0
        for name, shape, n in shard:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = fname
        total += offset
        body = json.dumps(header, separators=(",", ":")).encode()
        body += b" " * (-len(body) % 8)
        (directory / fname).write_bytes(struct.pack("<Q", len(body)) + body)
    index = {
        "metadata": {
            "total_size": total,
            "omni_edge_header_only": NOTE.format(version=transformers.__version__),
        },
        "weight_map": dict(sorted(weight_map.items())),
    }
    (directory / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2) + "\n", encoding="utf-8"
    )
    return {"shards": len(shards), "tensors": len(weight_map), "total_size": total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "directory", type=Path, help="a directory holding the checkpoint's config.json"
    )
    args = parser.parse_args(argv)
    if not (args.directory / "config.json").is_file():
        print(
            f"{args.directory}: no config.json; put the checkpoint's config.json there first",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(write(args.directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
