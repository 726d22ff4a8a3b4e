"""`omni-edge plan` as a user runs it: exit codes, JSON contract, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator.cli import main
from orchestrator.core.units import GiB
from tests.helpers import REPO
from tests.helpers.checkpoints import llama_config, write_checkpoint

PROFILE = {
    "format": "omni-edge.profile/1",
    "name": "cli box",
    "host": {"os": "linux", "ram_total_bytes": 32 * GiB, "ram_available_bytes": 16 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "cpu", "backends": ["vllm-cpu", "ort-cpu"]}],
}


def setup(tmp_path: Path, max_model_len: int = 1024, ram: int = 16 * GiB) -> tuple[Path, Path]:
    ckpt = write_checkpoint(tmp_path / "m", llama_config(), {"w": ("BF16", [64, 64])})
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"name: cli\nstages:\n  - {{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], max_model_len: {max_model_len}, final_output: true}}\n"
    )
    prof = tmp_path / "profile.json"
    prof.write_text(
        json.dumps({**PROFILE, "host": {**PROFILE["host"], "ram_available_bytes": ram}})
    )
    return cfg, prof


def test_admitted_plan_exits_0_and_json_is_the_contract(tmp_path, capsys):
    cfg, prof = setup(tmp_path)
    assert main(["plan", str(cfg), "--profile", str(prof), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "omni-edge.plan/1" and doc["admitted"] is True
    stage = doc["stages"][0]
    assert {
        "name",
        "kind",
        "admitted",
        "device",
        "backend",
        "reservations",
        "refusals",
        "engine_kwargs",
        "kv_cache",
    } <= set(stage)
    assert set(stage["reservations"][0]) >= {
        "pool",
        "purpose",
        "bytes",
        "lifetime",
        "evidence",
        "note",
    }
    assert set(stage["kv_cache"]) >= {
        "bytes_per_token",
        "bytes_total",
        "bytes_total_flat",
        "full_attention_layers",
        "sliding_window_layers",
    }
    assert set(doc["pools"][0]) >= {"id", "capacity_bytes", "peak_bytes", "contributors"}


def test_refused_plan_exits_3_and_prints_code_and_remedy(tmp_path, capsys):
    cfg, prof = setup(tmp_path, ram=2 * GiB)
    assert main(["plan", str(cfg), "--profile", str(prof)]) == 3
    out = capsys.readouterr().out
    assert "REFUSED" in out and "budget_exceeds_device" in out


def test_bad_input_exits_2_without_traceback(tmp_path):
    cfg, prof = setup(tmp_path)
    cfg.write_text(cfg.read_text().replace("max_model_len", "max_modle_len"))
    run = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", str(cfg), "--profile", str(prof)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert (
        "unknown key 'max_modle_len'" in run.stderr
        and "how to fix: did you mean 'max_model_len'" in run.stderr
    )


def test_missing_checkpoint_and_bad_profile_exit_2(tmp_path, capsys):
    cfg, prof = setup(tmp_path)
    prof.write_text('{"format": "omni-edge.profile/1", "name": 3}')
    assert main(["plan", str(cfg), "--profile", str(prof)]) == 2
    err = capsys.readouterr().err
    assert "profile.json: name" in err and "host" in err
    cfg2 = tmp_path / "q.yaml"
    cfg2.write_text(
        "name: q\nstages:\n  - {name: t, kind: ar_decode, model: nowhere, devices: [cpu], max_model_len: 64, sampling: {max_tokens: 8}, final_output: true}\n"
    )
    assert (
        main(["plan", str(cfg2), "--profile", str(REPO / "configs/profiles/cpu-only-linux.json")])
        == 2
    )
    assert "checkpoint directory not found" in capsys.readouterr().err


def test_plan_imports_no_heavy_module(tmp_path):
    cfg, prof = setup(tmp_path)
    code = (
        f"import sys; from orchestrator.cli import main; rc = main(['plan', {str(cfg)!r}, '--profile', {str(prof)!r}, '--json']);"
        "heavy = sorted(m for m in ('torch', 'vllm', 'onnxruntime', 'ray', 'transformers', 'huggingface_hub') if m in sys.modules);"
        "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stderr


def test_out_writes_the_plan_file(tmp_path, capsys):
    cfg, prof = setup(tmp_path)
    out = tmp_path / "plans" / "plan.json"
    out.parent.mkdir()  # a missing directory is refused (tests/test_bad_inputs.py)
    assert main(["plan", str(cfg), "--profile", str(prof), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["pipeline"] == "cli"


def test_plan_shows_each_stages_restart_policy_and_its_fallback(tmp_path, capsys):
    """The default policy is said in the human plan and left out of the JSON (plans of stages
    that keep it are unchanged); a policy the config sets, and a fallback, are in both."""
    cfg, prof = setup(tmp_path)
    assert main(["plan", str(cfg), "--profile", str(prof)]) == 0
    assert "Restarts: thinker up to 5 in 600 s, back-off 1-30 s" in capsys.readouterr().out
    assert main(["plan", str(cfg), "--profile", str(prof), "--json"]) == 0
    stage = json.loads(capsys.readouterr().out)["stages"][0]
    assert "restart" not in stage and "on_device_loss" not in stage
    text = cfg.read_text().replace(
        "final_output: true}", "final_output: true, restart: {max: 2, window_s: 60}}"
    )
    cfg.write_text(text)
    assert main(["plan", str(cfg), "--profile", str(prof), "--json"]) == 0
    stage = json.loads(capsys.readouterr().out)["stages"][0]
    assert stage["restart"] == {"max": 2, "window_s": 60.0, "backoff_s": 1.0, "backoff_max_s": 30.0}
    cfg.write_text(text.replace("restart: {max: 2, window_s: 60}", "restart: never"))
    assert main(["plan", str(cfg), "--profile", str(prof)]) == 0
    assert "Restarts: thinker never restarted" in capsys.readouterr().out
    assert main(["plan", str(cfg), "--profile", str(prof), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stages"][0]["restart"] == "never"


def test_a_cpu_share_that_is_no_policy_exits_2_before_any_work(tmp_path, capsys, monkeypatch):
    """A typo in OMNI_EDGE_CPU_SHARE is refused by the command, naming the policies, not met
    later in a device actor (nor taken silently for the default)."""
    cfg, prof = setup(tmp_path)
    monkeypatch.setenv("OMNI_EDGE_CPU_SHARE", "folow")
    assert main(["plan", str(cfg), "--profile", str(prof), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert "OMNI_EDGE_CPU_SHARE" in err and "'folow'" in err
    assert "prefill, follow, static" in err
