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
from tests.helpers import REPO

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
    # today's upstream deploy files (deploy/: SOURCES.md), their topology from their pipeline
    "deploy/qwen2_5_omni": False,
    "deploy/qwen3_omni_moe": False,
    "deploy/overlay_duplex_cuda": False,
}
DEPLOY = FIXTURES / "deploy"
REAL_DEPLOY = {
    # upstream's Qwen-Omni deploy files: the topology they import as, and the checkpoint they plan with
    "qwen2_5_omni": "qwen2.5-omni",
    "qwen3_omni_moe": "qwen3-omni-moe",
    "qwen3_omni_moe_mori_intranode": "qwen3-omni-moe",
    "qwen3_omni_moe_thinking": "qwen3-omni-moe",
    "qwen3_omni_moe_multi_replicas": "qwen3-omni-moe",
}
WSL = REPO / "configs/profiles/strix-point-rtx5090-wsl.json"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def do_import(name: str, with_model: bool, out_dir: Path) -> tuple[int, dict, str]:
    out = out_dir / f"{name.replace('/', '_')}.yaml"
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
    for key in (
        "stage_args[0].engine_args.worker_cls",
        "stage_args[0].engine_args.scheduler_cls",
        "stage_args[1].custom_process_input_func",
        "stage_args[0].engine_args.gpu_memory_utilization",
        "stage_args[0].engine_args.trust_remote_code",
        "stage_args[1].default_sampling_params.stop_token_ids",
        "runtime.edges",
    ):
        assert why[key], key
    assert "custom_process_input_func" not in written and "worker_cls" not in written
    code, stdout, stderr = run_cli(
        [
            "import",
            "vllm-omni",
            str(FIXTURES / "qwen2_5_omni.yaml"),
            "--model",
            str(MODEL),
            "-o",
            str(tmp_path / "plain.yaml"),
        ]
    )
    assert code == 0
    assert "did you mean" not in (stdout + stderr).lower()
    assert "33 have no equivalent here" in stdout
    # every key of the file is accounted for: mapped or listed
    keys = {m["key"] for m in report["mapped"]} | set(why)
    for i, stage in enumerate(
        yaml.safe_load((FIXTURES / "qwen2_5_omni.yaml").read_text())["stage_args"]
    ):
        for k, v in stage.items():
            subs = (
                v.keys()
                if isinstance(v, dict)
                and k in ("engine_args", "runtime", "default_sampling_params")
                else [None]
            )
            for sub in subs:
                key = f"stage_args[{i}].{k}" + (f".{sub}" if sub else "")
                assert key in keys or (f"stage_args[{i}].{k}" in keys), key


def test_the_imported_qwen2_5_omni_config_maps_what_has_a_meaning(tmp_path: Path) -> None:
    _, report, written = do_import("qwen2_5_omni", True, tmp_path)
    assert report["topology"]["name"] == "qwen2.5-omni"
    assert "Qwen2_5OmniModel" in report["topology"]["selected_by"]
    cfg = yaml.safe_load(written)
    thinker, talker, code2wav = cfg["stages"]
    assert (thinker["kind"], thinker["model_stage"], thinker["devices"], thinker["inputs"]) == (
        "ar_decode",
        "thinker",
        ["gpu:0"],
        ["request"],
    )
    assert (talker["kind"], talker["model_stage"], talker["devices"]) == (
        "ar_decode",
        "talker",
        ["gpu:1"],
    )
    # engine_input_source: [0] is the thinker; thinker2talker carries its hidden states and its text: two ports
    assert (talker["inputs"], talker["join"]) == (["thinker.hidden_states", "thinker.text"], "all")
    assert (code2wav["kind"], code2wav["inputs"], code2wav["final_output_type"]) == (
        "exported_graph",
        ["talker"],
        "audio",
    )
    assert talker["sampling"] == {
        "temperature": 0.9,
        "top_p": 0.8,
        "top_k": 40,
        "max_tokens": 2048,
        "seed": 42,
        "repetition_penalty": 1.05,
    }
    assert thinker["max_model_len"] == 32768 and thinker["max_num_seqs"] == 1
    assert thinker["final_output"] is True and thinker["final_output_type"] == "text"


def test_a_deploy_file_takes_its_topology_from_the_model_and_its_overlay_merges_by_stage_id(
    tmp_path: Path,
) -> None:
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
    code, _, stderr = run_cli(
        [
            "import",
            "vllm-omni",
            str(FIXTURES / "deploy_qwen2_5_omni.yaml"),
            "-o",
            str(tmp_path / "o.yaml"),
        ]
    )
    assert code == 2
    assert "pass --model DIR" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "o.yaml").exists()


def test_a_file_for_another_model_than_model_is_refused(tmp_path: Path) -> None:
    code, _, stderr = run_cli(
        [
            "import",
            "vllm-omni",
            str(FIXTURES / "qwen3_omni_moe.yaml"),
            "--model",
            str(MODEL),
            "-o",
            str(tmp_path / "o.yaml"),
        ]
    )
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
            (GOLDEN / f"{name}.json").parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / f"{name}.json").write_text(
                json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
            )
            print(name, "exit", code, "loads", report["loads"])


if __name__ == "__main__":
    regenerate()


@pytest.mark.parametrize("name", ["qwen2_5_omni", "qwen3_omni_moe", "deploy_qwen2_5_omni"])
def test_planning_a_vllm_omni_file_directly_names_the_importer(name: str) -> None:
    """`omni-edge plan` on an upstream file: one problem that says what the file is and the
    command that converts it — not one per foreign key, never a "did you mean"."""
    code, _, stderr = run_cli(
        [
            "plan",
            str(FIXTURES / f"{name}.yaml"),
            "--profile",
            str(REPO / "configs/profiles/cpu-only-linux.json"),
        ]
    )
    assert code == 2
    assert "this is a vLLM-Omni stage config" in stderr
    assert "omni-edge import vllm-omni" in stderr and "--model CHECKPOINT_DIR -o CONFIG" in stderr
    assert "did you mean" not in stderr.lower() and "Traceback" not in stderr
    assert stderr.count("how to fix") == 1


# ---- today's upstream deploy schema (Qwen-Omni's current deploy files) ----------------------------


@pytest.fixture(scope="module")
def tiny_qwen3() -> tuple[Path, Path]:
    """The tiny Qwen3-Omni checkpoint and its exported code2wav (the bootstrap builds both)."""
    from exports import omni_tiny, qwen3_omni_code2wav

    omni_tiny.ensure_built()
    if not (qwen3_omni_code2wav.ARTIFACT_DIR / "manifest.yaml").is_file():
        assert qwen3_omni_code2wav.build() == 0
    return omni_tiny.QWEN3_OMNI_DIR, qwen3_omni_code2wav.ARTIFACT_DIR


def import_json(src: Path, out: Path, *extra: str) -> tuple[int, dict, str]:
    code, stdout, stderr = run_cli(
        ["import", "vllm-omni", str(src), "-o", str(out), "--json", *extra]
    )
    return code, (json.loads(stdout) if code == 0 else {}), stderr


def plan_json(config: Path, profile: Path = WSL) -> tuple[int, dict]:
    code, stdout, stderr = run_cli(["plan", str(config), "--profile", str(profile), "--json"])
    assert code in (0, 3), stderr  # admitted, or refused by name: never a config error (2)
    return code, json.loads(stdout)


@pytest.mark.parametrize("name", sorted(REAL_DEPLOY))
def test_each_real_qwen_omni_deploy_file_imports_without_model_and_its_config_plans(
    name: str, tmp_path: Path, tiny_qwen3: tuple[Path, Path]
) -> None:
    """Upstream's deploy files name no model: the file's ``pipeline:`` key, else its name (vLLM-Omni
    names its deploy files by pipeline), selects the topology. The written config loads; with
    the checkpoint in place of MODEL_DIR (the note says to) it plans: admitted or refused by
    name on the RTX 5090 laptop, never a config error."""
    src = DEPLOY / f"{name}.yaml"
    code, report, stderr = import_json(src, tmp_path / "bare.yaml")
    assert code == 0, stderr
    assert report["topology"]["name"] == REAL_DEPLOY[name]
    by = report["topology"]["selected_by"]
    assert (
        ("pipeline: qwen3_omni_moe in the file" in by)
        if name.endswith("thinking")
        else (f"the file name {name}.yaml" in by)
    )
    assert report["loads"] is True and report["problems"] == []
    assert any("MODEL_DIR" in n for n in report["notes"])

    # the same file with the checkpoint: Qwen2.5-Omni-3B's metadata, or the tiny Qwen3-Omni
    model = MODEL if REAL_DEPLOY[name] == "qwen2.5-omni" else tiny_qwen3[0]
    out = tmp_path / "with-model.yaml"
    code, report, stderr = import_json(src, out, "--model", str(model))
    assert code == 0, stderr
    assert report["loads"] is True, report["problems"]
    assert (
        "--model's architectures" in report["topology"]["selected_by"]
        and "agree" in report["topology"]["selected_by"]
    )
    cfg = yaml.safe_load(out.read_text())
    for stage in cfg["stages"]:
        if stage["kind"] == "exported_graph" and REAL_DEPLOY[name] == "qwen3-omni-moe":
            stage["artifact"] = str(
                tiny_qwen3[1]
            )  # the placeholder a user replaces with their export
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    _, plan = plan_json(out)
    for stage in plan["stages"]:
        assert stage["device"] is not None or [r["code"] for r in stage["refusals"]], stage["name"]


def test_a_deploy_file_for_a_pipeline_the_importer_does_not_know_is_exit_2_with_the_known_ones(
    tmp_path: Path,
) -> None:
    # step_audio_2_asr.yaml says pipeline: step_audio_2_asr
    code, _, stderr = import_json(DEPLOY / "step_audio_2_asr.yaml", tmp_path / "o.yaml")
    assert code == 2 and "Traceback" not in stderr
    assert "step_audio_2_asr.yaml: pipeline" in stderr  # where
    assert (
        "vLLM-Omni pipeline 'step_audio_2_asr' is not one the importer has a topology for" in stderr
    )  # what
    assert (
        "the importer knows the pipelines qwen2_5_omni (qwen2.5-omni), qwen3_omni_moe (qwen3-omni-moe)"
        in stderr
    )  # fix
    assert not (tmp_path / "o.yaml").exists()


def test_fish_speech_s_deploy_file_is_not_imported_as_qwen_omni_even_with_a_qwen_model(
    tmp_path: Path,
) -> None:
    """fish_qwen3_omni.yaml is Fish Speech's (slow_ar → dac_decoder), named after its HF model_type;
    before, with --model, its two stages became a Qwen2.5-Omni thinker and talker that did not load."""
    for extra in ([], ["--model", str(MODEL)]):
        code, _, stderr = import_json(DEPLOY / "fish_qwen3_omni.yaml", tmp_path / "o.yaml", *extra)
        assert code == 2 and "Traceback" not in stderr
        assert (
            "vLLM-Omni pipeline 'fish_qwen3_omni' (by the file name fish_qwen3_omni.yaml" in stderr
        )
        assert "qwen3_omni_moe (qwen3-omni-moe)" in stderr
        assert not (tmp_path / "o.yaml").exists()


def test_a_file_s_pipeline_and_another_model_are_refused(tmp_path: Path) -> None:
    code, _, stderr = import_json(
        DEPLOY / "qwen3_omni_moe.yaml", tmp_path / "o.yaml", "--model", str(MODEL)
    )
    assert code == 2
    assert "the file is for pipeline qwen3_omni_moe (qwen3-omni-moe" in stderr
    assert "Qwen2_5OmniModel (qwen2.5-omni)" in stderr


def test_max_tokens_at_the_context_imports_as_the_largest_value_that_loads(
    tmp_path: Path, tiny_qwen3: tuple[Path, Path]
) -> None:
    """qwen3_omni_moe.yaml asks the thinker for 2048 tokens and the talker for 4096; the tiny
    checkpoint's context is 2048, so upstream means "up to the context". Before, the written
    config did not load (max_tokens must be below max_model_len)."""
    out = tmp_path / "o.yaml"
    code, report, stderr = import_json(
        DEPLOY / "qwen3_omni_moe.yaml", out, "--model", str(tiny_qwen3[0])
    )
    assert code == 0, stderr
    assert report["loads"] is True, report["problems"]
    cfg = {s["name"]: s for s in yaml.safe_load(out.read_text())["stages"]}
    assert (cfg["thinker"]["max_model_len"], cfg["thinker"]["sampling"]["max_tokens"]) == (
        2048,
        2047,
    )
    assert (cfg["talker"]["max_model_len"], cfg["talker"]["sampling"]["max_tokens"]) == (2048, 2047)
    notes = [
        n for n in report["notes"] if ".sampling.max_tokens: 2047, the largest that loads" in n
    ]
    assert len(notes) == 2
    assert "the file's 4096 is at or above max_model_len 2048" in notes[1]
    assert "gets what its prompt leaves of the context" in notes[1]


def test_async_chunk_maps_to_code2wav_chunks_from_the_connector_and_to_the_talker_s_join(
    tmp_path: Path,
) -> None:
    # Qwen3-Omni, async_chunk: true: code2wav decodes windows with the connector's sizes
    code, report, _ = import_json(DEPLOY / "qwen3_omni_moe.yaml", tmp_path / "q3.yaml")
    cfg = {s["name"]: s for s in yaml.safe_load((tmp_path / "q3.yaml").read_text())["stages"]}
    assert code == 0
    assert cfg["code2wav"]["chunk"] == {"frames": 25, "left_context": 25, "first_frames": 4}
    assert cfg["talker"]["join"] == "all"  # Qwen3-Omni's talker refuses join: latest
    mapped = {m["key"]: m["to"] for m in report["mapped"]}
    assert (
        mapped["connectors.connector_of_shared_memory.extra.initial_codec_chunk_frames"]
        == "stages.code2wav.chunk.first_frames"
    )
    assert mapped["async_chunk"] == "stages.code2wav.chunk"
    assert "async_chunk" not in {f["key"] for f in report["no_equivalent"]}
    # the Mori file gives no initial_codec_chunk_frames: upstream's default, no smaller first chunk
    import_json(DEPLOY / "qwen3_omni_moe_mori_intranode.yaml", tmp_path / "mori.yaml")
    mori = {s["name"]: s for s in yaml.safe_load((tmp_path / "mori.yaml").read_text())["stages"]}
    assert mori["code2wav"]["chunk"] == {"frames": 25, "left_context": 25, "first_frames": 0}
    # Qwen2.5-Omni: async_chunk: false keeps the whole hand-over; true streams the talker
    _, report, _ = import_json(DEPLOY / "qwen2_5_omni.yaml", tmp_path / "q25.yaml")
    q25 = {s["name"]: s for s in yaml.safe_load((tmp_path / "q25.yaml").read_text())["stages"]}
    assert q25["talker"]["join"] == "all" and "chunk" not in q25["code2wav"]
    _, report, written = do_import("deploy_qwen2_5_omni", True, tmp_path)
    streaming = {s["name"]: s for s in yaml.safe_load(written)["stages"]}
    assert streaming["talker"]["join"] == "latest"
    assert {"key": "async_chunk", "to": "stages.talker.join", "value": "latest"} in report["mapped"]


def test_num_replicas_other_platforms_and_the_duplex_keys_are_listed_and_cuda_s_overrides_applied(
    tmp_path: Path,
) -> None:
    code, report, _ = import_json(DEPLOY / "overlay_duplex_cuda.yaml", tmp_path / "o.yaml")
    assert code == 0 and report["topology"]["name"] == "qwen3-omni-moe"
    assert "the name of its base_config qwen3_omni_moe.yaml" in report["topology"]["selected_by"]
    why = {f["key"]: f["why"] for f in report["no_equivalent"]}
    assert "full-duplex" in why["session_mode"] and "full-duplex" in why["duplex_session"]
    assert "active_stream_window" in why
    # num_replicas is the stage's replicas now (stage replicas): mapped, no longer listed or noted
    assert "stages[1].num_replicas" not in why
    assert {
        "key": "stages[1].num_replicas",
        "to": "stages.talker.replicas",
        "value": 2,
    } in report["mapped"]
    assert not any("num_replicas" in n for n in report["notes"])
    assert "no MUSA backend" in why["platforms.musa"]
    assert "platforms.cuda" not in why
    talker = yaml.safe_load((tmp_path / "o.yaml").read_text())["stages"][1]
    assert talker["replicas"] == 2
    assert (
        talker["max_num_seqs"],
        talker["sampling"]["max_tokens"],
        talker["sampling"]["top_k"],
    ) == (2, 1024, 50)
    assert "platforms.cuda.stages[0].max_num_seqs" in {m["key"] for m in report["mapped"]}


def test_the_multi_replica_deploy_imports_its_replicas_and_plans_one_a_gpu(
    tmp_path: Path, tiny_qwen3: tuple[Path, Path]
) -> None:
    """Upstream's Qwen3-Omni multi-replica deploy (talker and code2wav ``num_replicas: 2`` on
    devices "1,2") imports as ``replicas: 2`` and plans each replica on its own GPU, on a
    machine with three (the RTX 5090 laptop's profile with two more of its GPU)."""
    out = tmp_path / "multi.yaml"
    src = DEPLOY / "qwen3_omni_moe_multi_replicas.yaml"
    code, report, stderr = import_json(src, out, "--model", str(tiny_qwen3[0]))
    assert code == 0 and report["loads"] is True, stderr
    for i, stage in ((1, "talker"), (2, "code2wav")):
        row = {"key": f"stages[{i}].num_replicas", "to": f"stages.{stage}.replicas", "value": 2}
        assert row in report["mapped"]
    assert not any(f["key"].endswith("num_replicas") for f in report["no_equivalent"])
    cfg = yaml.safe_load(out.read_text())
    stages = {s["name"]: s for s in cfg["stages"]}
    assert (stages["talker"]["replicas"], stages["talker"]["devices"]) == (2, ["gpu:1", "gpu:2"])
    assert (stages["code2wav"]["replicas"], stages["code2wav"]["devices"]) == (
        2,
        ["gpu:1", "gpu:2"],
    )
    assert "replicas" not in stages["thinker"]
    stages["code2wav"]["artifact"] = str(tiny_qwen3[1])  # the user's export
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    profile = json.loads(WSL.read_text())
    gpu = next(d for d in profile["devices"] if d["id"] == "gpu:0")
    profile["devices"] += [{**gpu, "id": f"gpu:{n}"} for n in (1, 2)]
    three = tmp_path / "three-gpus.json"
    three.write_text(json.dumps(profile))
    code, plan = plan_json(out, three)
    assert code == 0, [s["refusals"] for s in plan["stages"]]
    by_name = {s["name"]: s for s in plan["stages"]}
    assert by_name["thinker"]["device"] == "gpu:0" and "replicas" not in by_name["thinker"]
    for stage in ("talker", "code2wav"):
        placed = [(r["holder"], r["device"]) for r in by_name[stage]["replicas"]]
        assert placed == [(f"{stage}#0", "gpu:1"), (f"{stage}#1", "gpu:2")]
    pools = {p["id"]: p["contributors"] for p in plan["pools"]}
    assert {"talker#0", "code2wav#0"} <= set(pools["vram:gpu:1"])
    assert {"talker#1", "code2wav#1"} <= set(pools["vram:gpu:2"])


def test_a_chunked_code2wav_that_is_not_exported_is_refused_by_name_not_a_config_error(
    tmp_path: Path, tiny_qwen3: tuple[Path, Path]
) -> None:
    """A Qwen3-Omni checkpoint directory whose code2wav manifest says not_exported (as
    configs/models/qwen2.5-omni-3b/code2wav's does): the imported chunked stage is refused
    with no_exported_graph. Before, the chunk's samples_per_frame check came first: exit 2."""
    model = tmp_path / "qwen3-omni"
    model.mkdir()
    for f in tiny_qwen3[0].iterdir():
        (model / f.name).symlink_to(f)
    manifest = yaml.safe_load((MODEL / "code2wav/manifest.yaml").read_text())
    (model / "code2wav").mkdir()
    (model / "code2wav/manifest.yaml").write_text(
        yaml.safe_dump({**manifest, "name": "qwen3-omni-code2wav"})
    )
    out = tmp_path / "o.yaml"
    code, _, stderr = import_json(DEPLOY / "qwen3_omni_moe.yaml", out, "--model", str(model))
    assert code == 0, stderr
    cfg = yaml.safe_load(out.read_text())
    assert cfg["stages"][2]["chunk"]["frames"] == 25
    cfg["stages"][2]["devices"] = ["gpu:0", "cpu"]  # the file's gpu:1 is not on the laptop
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    _, plan = plan_json(out)
    code2wav = next(s for s in plan["stages"] if s["name"] == "code2wav")
    assert "no_exported_graph" in [r["code"] for r in code2wav["refusals"]]


def test_a_qwen3_omni_checkpoint_without_audio_output_imports_its_thinker_alone(
    tmp_path: Path, tiny_qwen3: tuple[Path, Path]
) -> None:
    """vLLM-Omni resolves qwen3_omni_moe to its thinker-only pipeline for a checkpoint with
    enable_audio_output: false (the Captioner); before, the talker and code2wav it lacks were imported."""
    model = tmp_path / "captioner"
    model.mkdir()
    for f in tiny_qwen3[0].iterdir():
        if f.name != "config.json":
            (model / f.name).symlink_to(f)
    config = json.loads((tiny_qwen3[0] / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "enable_audio_output": False}))
    out = tmp_path / "o.yaml"
    code, report, stderr = import_json(DEPLOY / "qwen3_omni_moe.yaml", out, "--model", str(model))
    assert code == 0, stderr
    assert report["topology"]["name"] == "qwen3-omni-moe-thinker-only"
    assert "enable_audio_output: false" in report["topology"]["selected_by"]
    assert [s["name"] for s in yaml.safe_load(out.read_text())["stages"]] == ["thinker"]
    why = {f["key"]: f["why"] for f in report["no_equivalent"]}
    assert (
        "runs its thinker alone" in why["stages[1]"]
        and "runs its thinker alone" in why["stages[2]"]
    )
    assert report["loads"] is True
    plan_json(out)
