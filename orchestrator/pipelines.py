"""Pipelines by name: the shipped ones, what a command's pipeline argument names, and the
models a pipeline needs that are not downloaded.

* **Shipped pipelines** are the repository's ``configs/`` (the default voice assistant, the
  examples, the metadata-only models and recorded profiles they name), installed with the
  package as ``omni_edge_configs`` beside ``exports`` (``setup.py``), so the relative paths
  inside them (``../exports/…``, ``../models/…``) resolve against the pipeline's own file in a
  checkout and in an installed wheel alike. Each is named by its file's stem
  (``voice-assistant``, ``voice-chat``): :func:`shipped`.
* **A pipeline argument** (:func:`locate`): a file that exists wins; then a shipped pipeline's
  name; then a model's Hugging Face Hub id (``Qwen/Qwen3-0.6B``, ``ORG/NAME-GGUF:Q4_K_M``), which
  becomes a pipeline of one decode stage (:func:`model_pipeline`). Anything else is a
  ``ConfigError`` listing the shipped names.
* **Models not downloaded** (:func:`require_downloaded`): a run never downloads; a stage whose
  model (named by Hub id) the HF cache lacks is exit 2 naming ``omni-edge pull``, read from the
  cache alone before anything starts.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.hub import HubRef, hub_cache, parse_hub_ref
from orchestrator.core.settings import INSTALL_ROOT
from stages.registry import get_kind

SHIPPED_PACKAGE = "omni_edge_configs"
"""The installed name of the repository's ``configs/`` (``setup.py`` maps it)."""
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
MODEL_CONTEXT = 4096
"""The context of a pipeline made from a model's id alone (llama.cpp's default ``n_ctx``)."""


def shipped_dir() -> Path | None:
    """Where the shipped pipelines are: the installed ``omni_edge_configs`` package (found
    without importing it), else the ``configs/`` of the checkout this code runs from; None
    when neither is there."""
    try:
        spec = importlib.util.find_spec(SHIPPED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    checkout = INSTALL_ROOT / "configs"
    return checkout if (checkout / "voice-assistant.yaml").is_file() else None


def shipped() -> dict[str, Path]:
    """Each shipped pipeline by name (its file's stem): those at the top of the directory first,
    then ``examples/``; a name taken at the top is not taken again."""
    root = shipped_dir()
    if root is None:
        return {}
    found: dict[str, Path] = {}
    for folder in (root, root / "examples"):
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def locate(arg: str) -> Path | HubRef:
    """What a pipeline argument names (see the module docstring)."""
    path = Path(arg).expanduser()
    if path.exists():
        return path
    named = shipped()
    if arg in named:
        return named[arg]
    ref = None if arg.lower().endswith(CONFIG_SUFFIXES) else parse_hub_ref(arg)
    if ref is not None:
        return ref
    if "/" in arg or "\\" in arg or arg.lower().endswith(CONFIG_SUFFIXES):
        return path  # the reader says "file not found", as for any path
    raise ConfigError.single(
        arg,
        "no such file, and no shipped pipeline of that name",
        f"name a config file, a shipped pipeline ({', '.join(named) or 'none installed'}: "
        "omni-edge pipelines lists them) or a model's Hub id (ORG/NAME)",
    )


def model_pipeline(ref: HubRef) -> dict[str, object]:
    """A pipeline of one decode stage for a model named by its Hub id on the command line: text
    in, text out, the GPU first, then the CPU, a context of :data:`MODEL_CONTEXT` tokens."""
    name = ref.repo.split("/", 1)[1][:64].rstrip(".-_") or "model"
    return {
        "name": name,
        "description": f"{ref.text}: one decode stage, made from the model's Hub id",
        "stages": [
            {
                "name": "llm",
                "kind": "ar_decode",
                "model": ref.text,
                "devices": ["gpu:0", "cpu"],
                "max_model_len": MODEL_CONTEXT,
                "final_output": True,
                "final_output_type": "text",
            }
        ],
    }


def shipped_name(source: str) -> str | None:
    """The shipped pipeline a config file is, by name (None for any other file)."""
    try:
        resolved = Path(source).resolve()
    except (OSError, ValueError):
        return None
    return next((n for n, p in shipped().items() if p.resolve() == resolved), None)


def require_downloaded(config: Any, given_as: str = "") -> None:
    """``ConfigError`` (exit 2) naming every stage whose model, named by Hub id, the HF cache
    lacks (``StageKind.not_downloaded``, read without the network), and the ``omni-edge pull``
    that fetches them; nothing is downloaded here."""
    target = given_as or shipped_name(config.source) or config.source
    problems = [
        Problem(
            f"{config.source}: stages.{stage.name}.model",
            f"{ref} is not in the Hugging Face cache ({hub_cache()}), and a run never downloads",
            f"omni-edge pull {_quoted(target)} (omni-edge plan {_quoted(target)} says how much it "
            "downloads), then run again",
        )
        for stage in config.stages
        for ref in get_kind(stage.kind).not_downloaded(stage)
    ]
    if problems:
        raise ConfigError(problems)


def _quoted(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z0-9._/:@+=,-]+", text) else repr(text)
