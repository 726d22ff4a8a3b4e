"""``omni-edge pull`` and the commands around it, against a Hub on loopback
(``tests/helpers/hub_server.py``): only the files the stages read are downloaded, a cut
connection resumes where it stopped, a file whose hash does not match is removed and refused,
a plan that is refused downloads nothing (no weight byte requested), and a model that is not
downloaded makes ``run`` exit 2 naming ``pull`` without a request to the Hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.packages import resolve_package_location
from tests.helpers import REPO
from tests.helpers.hub_server import (
    TEST_TOKEN,
    HubFile,
    HubRepo,
    cache_files,
    directory_repo,
    header_only_repo,
    serving,
)
from tests.stages.ar_decode.test_hub_model import SMOLLM2, tiny_checkpoint

CPU_ONLY = str(REPO / "configs/profiles/cpu-only-linux.json")
TINY = "omni-edge-tests/tiny-llama"
QWEN3_OMNI = "Qwen/Qwen3-Omni-30B-A3B-Instruct"
GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
NEEDED = [
    "config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer_config.json",
]


def test_a_download_the_disk_cannot_hold_is_exit_2_before_any_byte_arrives(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The disk's free space is set by the test: less than the download plus the margin."""
    with serving(repos, monkeypatch, tmp_path):
        monkeypatch.setattr("orchestrator.core.hub.free_bytes", lambda directory=None: 1024)
        assert main(pull(TINY)) == 2
    err = capsys.readouterr().err
    assert "the download needs" in err and "is free there" in err
    assert "how to fix: free space on that disk, or point HF_HUB_CACHE" in err
    assert cache_files(tmp_path) == []


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, HubRepo]:
    tiny = directory_repo(tiny_checkpoint(tmp_path / "src" / "tiny"))
    for extra in ("pytorch_model.bin", "onnx/model.onnx", "original/consolidated.safetensors"):
        tiny.files[extra] = HubFile(data=b"not read by any stage " * 64)
    tiny.files["README.md"] = HubFile(data=b"# tiny\n")
    return {
        TINY: tiny,
        "omni-edge-tests/gated-llama": directory_repo(
            tmp_path / "src" / "tiny", gated=True, tokens=(TEST_TOKEN,)
        ),
        QWEN3_OMNI: header_only_repo(REPO / "configs/models/qwen3-omni-30b-a3b"),
        GGUF_REPO: HubRepo(
            {"SmolLM2-135M-Instruct.Q4_1.gguf": HubFile(disk=resolve_package_location(SMOLLM2))}
        ),
    }


def pull(*args: str) -> list[str]:
    return ["pull", *args, "--profile", CPU_ONLY]


def test_pull_downloads_only_the_files_the_stage_reads_verified_into_the_hf_cache(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(repos, monkeypatch, tmp_path) as hub:
        assert main([*pull(TINY), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (model,) = doc["models"]
    commit = repos[TINY].commit
    assert (model["repo"], model["commit"], model["revision"]) == (TINY, commit, "main")
    assert [f["path"] for f in model["files"]] == NEEDED
    assert {f["status"] for f in model["files"]} == {"downloaded, verified"}
    assert doc["downloaded_bytes"] == sum(repos[TINY].files[n].size for n in NEEDED)
    fetched = sorted({e.path.rsplit("/", 1)[-1] for e in hub.log if e.method == "GET"})
    assert "pytorch_model.bin" not in fetched and "model.onnx" not in fetched
    assert "consolidated.safetensors" not in fetched and "README.md" not in fetched
    snapshot = f"models--omni-edge-tests--tiny-llama/snapshots/{commit}"
    assert [f for f in cache_files(tmp_path) if f.startswith(snapshot)] == [
        f"{snapshot}/{n}" for n in NEEDED
    ]
    assert (tmp_path / "hf-cache/models--omni-edge-tests--tiny-llama/refs/main").read_text() == (
        commit
    )


def test_after_pull_the_model_is_found_offline_and_a_second_pull_fetches_nothing(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(repos, monkeypatch, tmp_path) as hub:
        assert main(pull(TINY)) == 0
        capsys.readouterr()
        before = len(hub.log)
        assert main([*pull(TINY), "--json"]) == 0
        assert [e for e in hub.log[before:] if e.method == "GET" and "/resolve/" in e.path] == []
    again = json.loads(capsys.readouterr().out)
    assert {f["status"] for f in again["models"][0]["files"]} == {"already here"}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert main(["plan", TINY, "--profile", CPU_ONLY, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    hub_record = plan["stages"][0]["artifact"]["hub"]
    assert (hub_record["evidence"], hub_record["commit"]) == ("cache", repos[TINY].commit)
    assert plan["stages"][0]["artifact"]["path"].endswith(f"snapshots/{repos[TINY].commit}")


def test_a_connection_cut_mid_file_resumes_where_it_stopped(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The SmolLM2 GGUF (98 MB) cut after 45 MB: huggingface_hub keeps what it wrote (whole
    10 MiB chunks) and asks for the rest by range, so the file is not fetched twice."""
    from huggingface_hub import constants

    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    size = repos[GGUF_REPO].files[name].size
    cut = 45_000_000
    with serving(repos, monkeypatch, tmp_path) as hub:
        hub.cut_once[name] = cut
        assert main(pull(f"{GGUF_REPO}:Q4_1")) == 0
    kept = cut // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
    assert kept > 0
    downloads = [(g.range, g.sent) for g in hub.fetched(".gguf") if g.range != "bytes=0-4194303"]
    assert downloads == [(None, cut), (f"bytes={kept}-", size - kept)]
    assert "downloaded and verified" in capsys.readouterr().out
    blob = tmp_path / "hf-cache/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/blobs"
    assert [p.name for p in blob.iterdir()] == [repos[GGUF_REPO].hashes(name)[0]]


def test_a_file_whose_hash_does_not_match_is_removed_and_refused(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shard = "model-00002-of-00002.safetensors"
    with serving(repos, monkeypatch, tmp_path) as hub:
        hub.corrupt.add(shard)
        assert main(pull(TINY)) == 2
    err = capsys.readouterr().err
    sha = repos[TINY].hashes(shard)[0]
    assert f"{shard} arrived with SHA-256" in err and f"the Hub lists {sha}" in err
    assert "it was removed from the cache" in err
    assert "how to fix: run the same omni-edge pull again" in err
    assert "Traceback" not in err
    assert not [f for f in cache_files(tmp_path) if f.endswith((shard, f"blobs/{sha}"))]


@pytest.mark.parametrize(
    ("model", "token", "said"),
    [
        ("omni-edge-tests/gated-llama", None, "is a gated repository and no token was sent"),
        (
            "omni-edge-tests/gated-llama",
            "hf_notTheRightToken0123456789abcdef",
            "is a gated repository and a token was sent and it has no access (HTTP 403)",
        ),
        ("omni-edge-tests/no-such-model", None, "no repository omni-edge-tests/no-such-model"),
    ],
    ids=["gated", "gated-wrong-token", "missing"],
)
def test_pull_of_a_repository_that_cannot_be_read_is_exit_2_with_the_remedy(
    model: str,
    token: str | None,
    said: str,
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(repos, monkeypatch, tmp_path):
        if token is not None:
            monkeypatch.setenv("HF_TOKEN", token)
        assert main(pull(model)) == 2
    err = capsys.readouterr().err
    assert f"stages.llm.model: {model}" in err or said in err
    assert said in err and "how to fix:" in err
    assert "Traceback" not in err and (token is None or token not in err)
    assert cache_files(tmp_path) == []


def test_pull_with_a_token_reaches_a_gated_repository_and_never_prints_it(
    repos: dict[str, HubRepo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a fresh interpreter at -vv (every logger at DEBUG, huggingface_hub's and httpx's
    included): the plan, the pull's JSON and every log line are free of the token."""
    with serving(repos, monkeypatch, tmp_path) as hub:
        env = {**os.environ, "HF_TOKEN": TEST_TOKEN}
        outputs: list[tuple[str, str]] = []
        for args in (
            ["plan", "omni-edge-tests/gated-llama", "--profile", CPU_ONLY, "--json"],
            [*pull("omni-edge-tests/gated-llama"), "--json"],
        ):
            proc = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "-vv", *args],
                capture_output=True,
                text=True,
                timeout=300,
                env=env,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            outputs.append((proc.stdout, proc.stderr))
    plan = json.loads(outputs[0][0])
    assert plan["stages"][0]["artifact"]["hub"]["repo"] == "omni-edge-tests/gated-llama"
    assert json.loads(outputs[1][0])["downloaded_bytes"] > 0
    assert "DEBUG" in outputs[1][1]  # the logs were on
    assert all(e.token for e in hub.log if "gated-llama" in e.path)  # the token was sent
    for out, err in outputs:
        assert TEST_TOKEN not in out + err


def test_a_model_that_cannot_run_here_is_refused_before_any_weight_is_requested(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Qwen3-Omni-30B-A3B's real headers (configs/models), served at their full 66 GB: planned
    for the recorded CPU-only machine from the headers alone, its thinker refused with the plan's
    codes and numbers; pull refuses the same way; no byte past a header was asked for."""
    with serving(repos, monkeypatch, tmp_path) as hub:
        assert main(["plan", "qwen3-omni-30b-a3b", "--profile", CPU_ONLY, "--json"]) == 3
        plan = json.loads(capsys.readouterr().out)
        assert main(["pull", "qwen3-omni-30b-a3b", "--profile", CPU_ONLY]) == 3
        out, err = capsys.readouterr()
    thinker = plan["stages"][0]
    record = thinker["artifact"]["hub"]
    total = sum(
        f.size for name, f in repos[QWEN3_OMNI].files.items() if name.endswith(".safetensors")
    )
    assert (record["repo"], record["evidence"], record["downloaded"]) == (
        QWEN3_OMNI,
        "hub-metadata",
        False,
    )
    assert record["download_bytes"] > total  # every shard, plus config and index
    assert not thinker["admitted"]
    (budget,) = [r for r in thinker["refusals"] if r["code"] == "budget_exceeds_device"]
    assert (
        budget["message"].startswith("thinker needs ") and "weights 59.08 GiB" in budget["message"]
    )
    assert "[budget_exceeds_device] thinker on cpu" in out and "weights 59.08 GiB" in out
    assert "pull refused" in err and "--force downloads it anyway" in err
    weight_gets = hub.fetched(".safetensors")
    assert weight_gets, "the headers were read from the Hub"
    for get in weight_gets:  # huggingface_hub's header reads: ranges from the start, ≤ 100 kB
        assert get.range is not None and get.range.startswith(("bytes=0-", "bytes=8-"))
        assert get.sent <= 200_000
    assert sum(g.sent for g in weight_gets) < total / 10_000
    assert not [f for f in cache_files(tmp_path) if f.endswith(".safetensors")]


def test_the_plan_of_a_shipped_omni_pipeline_states_the_download_before_any_weight_byte(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``omni-edge plan qwen3-omni-30b-a3b`` as a person reads it: each stage's model line names
    the repository, the commit it resolved to and exactly what ``pull`` would fetch (the sum of
    the files that stage reads, as the Hub lists them), the thinker is refused with its numbers,
    and not one weight byte past the safetensors headers left the Hub."""
    from orchestrator.core.units import fmt_bytes

    served = repos[QWEN3_OMNI]
    for extra in ("README.md", "pytorch_model.bin", "onnx/model.onnx"):  # read by no stage
        served.files[extra] = HubFile(data=b"not read by any stage " * 64)
    monkeypatch.setenv("COLUMNS", "400")  # one model line per stage, unwrapped
    with serving(repos, monkeypatch, tmp_path) as hub:
        assert main(["plan", "qwen3-omni-30b-a3b", "--profile", CPU_ONLY, "--json"]) == 3
        plan = json.loads(capsys.readouterr().out)
        assert main(["plan", "qwen3-omni-30b-a3b", "--profile", CPU_ONLY]) == 3
        out = capsys.readouterr().out
    for stage in plan["stages"]:
        record = stage["artifact"]["hub"]
        wanted = {f["path"] for f in record["files"]}
        assert wanted and wanted < set(served.files)  # the stage's files, not the repository
        exact = sum(served.files[p].size for p in wanted)
        assert record["download_bytes"] == exact
        line = (
            f"{stage['name']}: {QWEN3_OMNI} @ {served.commit[:12]} (main), not downloaded: "
            f"planned from the Hub's metadata; omni-edge pull fetches {fmt_bytes(exact)} into "
        )
        assert line in " ".join(out.split()), out
    assert "[budget_exceeds_device] thinker on cpu" in out and "weights 59.08 GiB" in out
    reads = hub.fetched(".safetensors")
    assert reads and all(g.range is not None and g.sent <= 200_000 for g in reads)
    assert not [f for f in cache_files(tmp_path) if f.endswith(".safetensors")]


def test_force_passes_the_refusal_and_dry_run_says_what_would_download(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(repos, monkeypatch, tmp_path):
        args = ["pull", "qwen3-omni-30b-a3b", "--profile", CPU_ONLY, "--force", "--dry-run"]
        assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["admitted"], doc["forced"], doc["dry_run"], doc["downloaded_bytes"]) == (
        False,
        True,
        True,
        0,
    )
    (model,) = doc["models"]  # thinker and talker read one repository: one pull
    assert model["stages"] == ["thinker", "talker"]
    assert {f["status"] for f in model["files"]} == {"would download"}
    assert cache_files(tmp_path) == []


def test_run_of_a_model_not_downloaded_is_exit_2_naming_pull_without_asking_the_hub(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(repos, monkeypatch, tmp_path) as hub:
        code = main(["run", "qwen2.5-omni-3b", "--profile", CPU_ONLY, "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "stages.thinker.model: Qwen/Qwen2.5-Omni-3B is not in the Hugging Face cache" in err
    assert "a run never downloads" in err
    assert "how to fix: omni-edge pull qwen2.5-omni-3b" in err
    assert hub.log == []  # not even the metadata was asked for


@pytest.mark.ray
@pytest.mark.slow
def test_a_pulled_model_runs_offline_from_the_cache_and_the_record_names_its_commit(
    repos: dict[str, HubRepo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A user's config over the shipped voice assistant, its thinker named by Hub id and a
    quantization tag: pulled from the Hub on loopback, then run in a fresh interpreter with the
    Hub gone and HF_HUB_OFFLINE set — the model comes from the HF cache, and the run record's
    plan names the repository, the commit and the file."""
    config = tmp_path / "voice-from-the-hub.yaml"
    config.write_text(
        "extends: voice-assistant\nname: voice-from-the-hub\nstages:\n"
        f"  - name: thinker\n    model: {GGUF_REPO}:Q4_1\n"
    )
    with serving(repos, monkeypatch, tmp_path):
        assert main(["pull", str(config)]) == 0
    capsys.readouterr()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    wav = tmp_path / "reply.wav"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            str(config),
            "--prompt",
            "Hello.",
            "--out",
            str(wav),
            "--record",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(Path(json.loads(proc.stdout)["record"]).read_text())
    thinker = next(s for s in record["plan"]["stages"] if s["name"] == "thinker")
    hub = thinker["artifact"]["hub"]
    assert (hub["repo"], hub["commit"], hub["evidence"]) == (
        GGUF_REPO,
        repos[GGUF_REPO].commit,
        "cache",
    )
    assert [f["path"] for f in hub["files"]] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert thinker["artifact"]["path"].startswith(str(tmp_path / "hf-cache"))
    assert thinker["backend"].startswith("llamacpp")
