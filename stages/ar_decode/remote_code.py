"""A checkpoint that needs its own Python code is refused before anything loads.

transformers imports a checkpoint's own modules when its ``config.json`` (or its tokenizer's
or processor's config) has an ``auto_map`` and the caller allows ``trust_remote_code``. A
checkpoint is data someone else made: omni-edge passes ``trust_remote_code=False`` to every
transformers and vLLM load, and :func:`refuse_remote_code` says so at plan time (exit 2, naming
the file and the key) instead of a failure deep inside a load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.core.errors import ConfigError

REMOTE_CODE_FILES = (
    "config.json",
    "tokenizer_config.json",
    "processor_config.json",
    "preprocessor_config.json",
)
"""The files of a checkpoint whose ``auto_map`` makes transformers import the checkpoint's own
Python modules (``trust_remote_code``): a model, a tokenizer, a processor."""


def refuse_remote_code(model_dir: str | Path) -> None:
    """``ConfigError`` (exit 2) naming the file when the checkpoint needs its own Python code:
    an ``auto_map`` in one of :data:`REMOTE_CODE_FILES`, at any depth (an Omni checkpoint's
    sub-configs too). omni-edge never runs a checkpoint's code; transformers and vLLM are
    always told so (``trust_remote_code=False``), and this says it before anything loads."""
    d = Path(model_dir)
    for name in REMOTE_CODE_FILES:
        path = d / name
        if not path.is_file():
            continue
        data = _read_json_quietly(path)
        where = _auto_map(data)
        if where is not None:
            raise ConfigError.single(
                f"{path}: {where}",
                "the checkpoint needs its own Python code (auto_map names modules of the "
                "checkpoint that transformers would import and run); omni-edge never runs a "
                "checkpoint's code",
                "use a checkpoint of an architecture transformers implements itself (its "
                "config.json has no auto_map; most models have one, often in the same repository "
                "or a '-hf' variant)",
            )


def _read_json_quietly(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # not this check's business: whoever reads it says what is wrong


def _auto_map(data: Any, at: str = "", depth: int = 0) -> str | None:
    """Where an ``auto_map`` key is in ``data`` (``auto_map``, ``thinker_config.auto_map``)."""
    if not isinstance(data, dict) or depth > 8:
        return None
    if "auto_map" in data:
        return f"{at}auto_map"
    for key, value in data.items():
        found = _auto_map(value, f"{at}{key}.", depth + 1)
        if found is not None:
            return found
    return None
