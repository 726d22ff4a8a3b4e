"""`omni-edge import vllm-omni`: vLLM-Omni's legacy stage_args files (kept as upstream wrote
them, tests/orchestrator/vllm_omni_fixtures/SOURCES.md) and the deploy YAML turned into
omni-edge configs, compared with committed output (the written config and the --json
report), plus the properties a user relies on: every key is mapped or listed with why,
never a "did you mean"; the topology is named; bad input is exit 2 with where/what/fix.

After an intended change, regenerate and review the diff:

    python -m tests.orchestrator.test_import_vllm_omni
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from tests.conftest import REPO

FIXTURES = Path(__file__).parent / "vllm_omni_fixtures"
GOLDEN = FIXTURES / "golden"
MODEL = REPO / "configs/models/qwen2.5-omni-3b"
CASES = {
    # fixture: with --model (the Qwen2.5-Omni-3B metadata) or not
    "qwen2_5_omni": True,
    "qwen2_5_omni_multiconnector_head": True,
    "qwen3_omni_moe": False,
    "deploy_qwen2_5_omni": True,
    "deploy_overlay": True,
}


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def do_import(name: str, with_model: bool, out_dir: Path) -> tuple[int, dict, str]:
    out = out_dir / f"{name}.yaml"
    argv = ["import", "vllm-omni", str(FIXTURES / f"{name}.yaml"), "-o", str(out), "--json"]
    if with_model:
        argv += ["--model", str(MODEL)]
    code, stdout, _ = run_cli(argv)
    text = stdout.replace(str(out_dir), "<out>").replace(str(REPO), "<repo>")
    written = out.read_text().replace(str(out_dir), "<out>").replace(str(REPO), "<repo>")
    return code, json.loads(text), written


@pytest.mark.parametrize("name", sorted(CASES))
def test_import_is_unchanged(name: str, tmp_path: Path) -> None:
    code, report, written = do_import(name, CASES[name], tmp_path)
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    assert code == expected["exit_code"] == 0
    assert report == expected["report"]
    assert written == expected["config"]


def test_every_foreign_key_is_listed_with_why_and_none_is_a_misspelling(tmp_path: Path) -> None:
    _, report, written = do_import("qwen2_5_omni", True, tmp_path)
    why = {f["key"]: f["why"] for f in report["no_equivalent"]}
    for key in ("stage_args[0].engine_args.worker_cls", "stage_args[0].engine_args.scheduler_cls",
                "stage_args[1].custom_process_input_func", "stage_args[0].engine_args.gpu_memory_utilization",
                "stage_args[0].engine_args.trust_remote_code", "stage_args[1].default_sampling_params.stop_token_ids",
                "runtime.edges"):
        assert why[key], key
    assert "custom_process_input_func" not in written and "worker_cls" not in written
    code, stdout, stderr = run_cli(["import", "vllm-omni", str(FIXTURES / "qwen2_5_omni.yaml"),
                                    "--model", str(MODEL), "-o", str(tmp_path / "plain.yaml")])
    assert code == 0
    assert "did you mean" not in (stdout + stderr).lower()
    assert "33 have no equivalent here" in stdout
    # every key of the file is accounted for: mapped or listed
    keys = {m["key"] for m in report["mapped"]} | set(why)
    for i, stage in enumerate(yaml.safe_load((FIXTURES / "qwen2_5_omni.yaml").read_text())["stage_args"]):
        for k, v in stage.items():
            subs = v.keys() if isinstance(v, dict) and k in ("engine_args", "runtime", "default_sampling_params") else [None]
            for sub in subs:
                key = f"stage_args[{i}].{k}" + (f".{sub}" if sub else "")
                assert key in keys or (f"stage_args[{i}].{k}" in keys), key


def test_the_imported_qwen2_5_omni_config_maps_what_has_a_meaning(tmp_path: Path) -> None:
    _, report, written = do_import("qwen2_5_omni", True, tmp_path)
    assert report["topology"]["name"] == "qwen2.5-omni"
    assert "Qwen2_5OmniModel" in report["topology"]["selected_by"]
    cfg = yaml.safe_load(written)
    thinker, talker, code2wav = cfg["stages"]
    assert (thinker["kind"], thinker["model_stage"], thinker["devices"], thinker["inputs"]) == ("ar_decode", "thinker", ["gpu:0"], ["request"])
    assert (talker["kind"], talker["model_stage"], talker["devices"]) == ("ar_decode", "talker", ["gpu:1"])
    # engine_input_source: [0] is the thinker; thinker2talker carries its hidden states and its text: two ports
    assert (talker["inputs"], talker["join"]) == (["thinker.hidden_states", "thinker.text"], "all")
    assert (code2wav["kind"], code2wav["inputs"], code2wav["final_output_type"]) == ("exported_graph", ["talker"], "audio")
    assert talker["sampling"] == {"temperature": 0.9, "top_p": 0.8, "top_k": 40, "max_tokens": 2048, "seed": 42,
                                  "repetition_penalty": 1.05}
    assert thinker["max_model_len"] == 32768 and thinker["max_num_seqs"] == 1
    assert thinker["final_output"] is True and thinker["final_output_type"] == "text"


def test_a_deploy_file_takes_its_topology_from_the_model_and_its_overlay_merges_by_stage_id(tmp_path: Path) -> None:
    _, base, _ = do_import("deploy_qwen2_5_omni", True, tmp_path)
    _, over, written = do_import("deploy_overlay", True, tmp_path)
    assert base["shape"] == over["shape"] == "deploy"
    cfg = yaml.safe_load(written)
    assert [s["name"] for s in cfg["stages"]] == ["thinker", "talker", "code2wav"]
    assert cfg["stages"][0]["sampling"]["max_tokens"] == 4096  # the overlay's
    assert cfg["stages"][0]["sampling"]["temperature"] == 0.0  # the base's, kept
    assert cfg["stages"][1]["devices"] == ["gpu:0"]  # the overlay moved the talker
    assert cfg["stages"][2]["final_output_type"] == "audio"  # the topology's final output
    assert {"platforms.npu", "platforms.rocm"} <= {f["key"] for f in over["no_equivalent"]}


def test_a_deploy_file_without_a_model_is_refused_with_the_fix(tmp_path: Path) -> None:
    code, _, stderr = run_cli(["import", "vllm-omni", str(FIXTURES / "deploy_qwen2_5_omni.yaml"), "-o", str(tmp_path / "o.yaml")])
    assert code == 2
    assert "pass --model DIR" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "o.yaml").exists()


def test_a_file_for_another_model_than_model_is_refused(tmp_path: Path) -> None:
    code, _, stderr = run_cli(["import", "vllm-omni", str(FIXTURES / "qwen3_omni_moe.yaml"), "--model", str(MODEL),
                               "-o", str(tmp_path / "o.yaml")])
    assert code == 2
    assert "Qwen3OmniMoeForConditionalGeneration (qwen3-omni-moe)" in stderr
    assert "Qwen2_5OmniModel (qwen2.5-omni)" in stderr


def test_not_a_vllm_omni_file_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nstages: [{name: a}]\n")
    code, _, stderr = run_cli(["import", "vllm-omni", str(bad), "-o", str(tmp_path / "o.yaml")])
    assert code == 2
    assert "neither a vLLM-Omni stage_args: file nor a deploy YAML" in stderr


def regenerate() -> None:
    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, with_model in sorted(CASES.items()):
            code, report, written = do_import(name, with_model, Path(tmp))
            doc = {"exit_code": code, "report": report, "config": written}
            (GOLDEN / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
            print(name, "exit", code, "loads", report["loads"])


if __name__ == "__main__":
    regenerate()


@pytest.mark.parametrize("name", ["qwen2_5_omni", "qwen3_omni_moe", "deploy_qwen2_5_omni"])
def test_planning_a_vllm_omni_file_directly_names_the_importer(name: str) -> None:
    """`omni-edge plan` on an upstream file: one problem that says what the file is and the
    command that converts it — not one per foreign key, never a "did you mean"."""
    code, _, stderr = run_cli(["plan", str(FIXTURES / f"{name}.yaml"), "--profile",
                               str(REPO / "configs/profiles/cpu-only-linux.json")])
    assert code == 2
    assert "this is a vLLM-Omni stage config" in stderr
    assert "omni-edge import vllm-omni" in stderr and "--model CHECKPOINT_DIR -o CONFIG" in stderr
    assert "did you mean" not in stderr.lower() and "Traceback" not in stderr
    assert stderr.count("how to fix") == 1
