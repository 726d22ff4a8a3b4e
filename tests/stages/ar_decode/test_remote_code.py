"""A checkpoint that needs its own Python code never runs it: its ``auto_map`` (in config.json,
a sub-config, the tokenizer's or processor's config) is refused at plan time with exit 2 naming
the file, and every transformers load says ``trust_remote_code=False``, so even a user
answering transformers' prompt with ``y`` runs nothing (``stages/ar_decode/remote_code.py``).

The checkpoint's ``evil.py`` writes a marker when imported; each test checks it is absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from stages.ar_decode import omni, prompt
from tests.helpers.checkpoints import llama_config, write_checkpoint
from tests.helpers.profiles import make_profile

EVIL = """import os
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "MARKER-evil"), "a").write("ran\\n")
from transformers import LlamaConfig as EvilConfig, LlamaTokenizerFast as EvilTokenizer
"""

AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
TOKENIZER_MAP = {"AutoTokenizer": ["evil.EvilTokenizer", None]}


def checkpoint(tmp_path: Path, where: str) -> Path:
    """A tiny checkpoint (real safetensors headers) with ``evil.py`` and an ``auto_map`` at
    ``where``: config.json, a sub-config, or tokenizer_config.json."""
    config = llama_config()
    if where == "config.json":
        config["auto_map"] = AUTO_MAP
    elif where == "thinker_config":
        config["thinker_config"] = {"auto_map": AUTO_MAP}
    tensors = {"model.embed_tokens.weight": ("BF16", [1000, 64])}
    d = write_checkpoint(tmp_path / "downloaded", config, tensors)
    if where == "tokenizer_config.json":
        (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": TOKENIZER_MAP}))
    (d / "evil.py").write_text(EVIL)
    return d


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ("config.json", "config.json: auto_map"),
        ("thinker_config", "config.json: thinker_config.auto_map"),
        ("tokenizer_config.json", "tokenizer_config.json: auto_map"),
    ],
)
def test_a_checkpoint_that_needs_its_own_code_is_refused_at_plan_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, key: str
) -> None:
    d = checkpoint(tmp_path, where)
    cfg = tmp_path / "p.yaml"
    stage = (
        f"{{name: thinker, kind: ar_decode, model: '{d}', devices: [cpu], backends: [vllm-cpu], "
        "max_model_len: 512, final_output: true}"
    )
    cfg.write_text(f"name: p\nstages:\n  - {stage}\n")
    profile = tmp_path / "profile.json"
    profile.write_text(make_profile().model_dump_json())
    assert main(["plan", str(cfg), "--profile", str(profile)]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert f"{d}/{key}: the checkpoint needs its own Python code" in err, err
    assert "omni-edge never runs a checkpoint's code" in err
    assert "how to fix: use a checkpoint of an architecture transformers implements itself" in err
    assert not (d / "MARKER-evil").exists()


def test_export_from_transformers_refuses_it_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = checkpoint(tmp_path, "config.json")
    out = tmp_path / "artifact"
    assert main(["export", "--from", "transformers", str(d), "-o", str(out)]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert f"{d}/config.json: auto_map: the checkpoint needs its own Python code" in err, err
    assert not out.exists() and not (d / "MARKER-evil").exists()


def _unknown_model_with_remote_code(tmp_path: Path) -> Path:
    """What transformers would import evil.py for: a model type it does not know, whose
    config and tokenizer name the checkpoint's own classes."""
    d = tmp_path / "downloaded"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model_type": "evil-lm", "auto_map": {**AUTO_MAP, **TOKENIZER_MAP}})
    )
    (d / "evil.py").write_text(EVIL)
    return d


@pytest.mark.parametrize(
    "load", [prompt._tokenizer_for, omni.tokenizer_for], ids=["vllm-runner", "transformers-runner"]
)
def test_a_tokenizer_load_never_runs_the_checkpoints_code_even_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load: Any
) -> None:
    """transformers asks on stdin whether to run a checkpoint's code when the caller leaves
    trust_remote_code unset; the user answers y here, and still nothing runs."""
    pytest.importorskip("transformers")
    d = _unknown_model_with_remote_code(tmp_path)
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "y")
    load.cache_clear()
    with pytest.raises(Exception):  # noqa: B017 - whatever transformers says, nothing may run
        load(str(d))
    assert asked == []  # told, not asked
    assert not (d / "MARKER-evil").exists()
