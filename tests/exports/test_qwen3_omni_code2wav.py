"""Qwen3-Omni's code2wav (the tiny one, exports/qwen3_omni_code2wav.py) as an exported
stage: the export, its gates on the CPU EP and in the OpenVINO route, and chunked
decoding as vLLM-Omni's ``async_chunk`` runs it.

Model outputs are compared only where both sides are computed here from the same
weights: the graph against transformers' own ``Qwen3OmniMoeCode2Wav.forward``, and
the chunked stage against the same graph on the whole sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from exports import qwen3_omni_code2wav as c2w
from orchestrator.cli import main
from orchestrator.core.errors import ConfigError, StageFailed
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.placement import verify_placement
from stages.exported_graph.chunking import FrameChunker, Window, new_samples
from stages.exported_graph.kind import ExportedGraphConfig, ExportedGraphKind
from tests.helpers.graphs import machine_profile, placement

pytestmark = [pytest.mark.ort]

FRAMES = 90
"""Frames of codes the talker stand-in streams (7.2 s of audio): a first chunk of 4 and
four more windows at vLLM-Omni's 25 frames."""
TAIL = 555
"""Samples the code2wav ConvNet returns fewer than frames × 1,920 (vLLM-Omni's figure for
Qwen3-Omni; the same layout here)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The artifact, exported here (``omni-edge export`` with the bootstrap's arguments)."""
    out = tmp_path_factory.mktemp("code2wav") / "qwen3-omni-code2wav-tiny"
    assert main(c2w.export_args(out)) == 0
    return out


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    # codes: [codebooks 4, frames 90], what the tiny talker's codec can emit
    return np.random.default_rng(7).integers(
        0, c2w.TINY_CODEBOOK_SIZE, (c2w.TINY_CODEBOOKS, FRAMES), dtype=np.int64
    )


@pytest.fixture(scope="module")
def transformers_waveform(codes: np.ndarray) -> np.ndarray:
    """transformers' own forward of the same weights on the same codes: float32 [samples]."""
    import torch

    with torch.no_grad():
        return c2w.tiny_code2wav()(torch.from_numpy(codes)[None]).numpy().reshape(-1)


def _config(artifact: Path, chunk: dict[str, Any] | None) -> Any:
    """A pipeline of the code2wav stage alone. Built without the graph check: a request
    carries no codes, so a real pipeline feeds it from a talker; the stage is what is tested."""
    from orchestrator.config import PipelineConfig

    stage = ExportedGraphConfig.model_validate(
        {
            "name": "code2wav",
            "kind": "exported_graph",
            "artifact": str(artifact),
            "devices": ["cpu"],
            "backends": ["ort-cpu"],
            "final_output": True,
            **({"chunk": chunk} if chunk is not None else {}),
        }
    )
    return PipelineConfig.model_construct(name="p", description="", stages=[stage], source="t.yaml")


def _runner(artifact: Path, tmp_path: Path, chunk: dict[str, Any] | None) -> Any:
    from orchestrator.planner import plan_pipeline

    config = _config(artifact, chunk)
    plan = plan_pipeline(config, machine_profile(), runtime=False)
    assert plan.stage("code2wav").engine_kwargs.get(
        "chunk"
    ) == (  # the plan says how the graph is called
        None if chunk is None else {"frames": 25, "left_context": 25, "first_frames": 4, **chunk}
    )
    runner = ExportedGraphKind().runner(plan.stage("code2wav"), config.stage("code2wav"))
    runner.load()
    return runner


async def _frames(codes: np.ndarray) -> AsyncIterator[list[int]]:
    """One frame at a time, as the talker streams them (a list of one int per codebook)."""
    for f in range(codes.shape[1]):
        yield [int(x) for x in codes[:, f]]


def _decode(runner: Any, codes: np.ndarray) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [x async for x in runner.stream("r1", _frames(codes))]

    try:
        return asyncio.run(collect())
    finally:
        runner.close()


def _within(got: np.ndarray, ref: np.ndarray, tol: dict[str, float]) -> dict[str, float]:
    """The numeric gate's three measures; asserts each is within the tolerance."""
    assert got.shape == ref.shape
    err = {
        "rel_l2": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
        "max_abs": float(np.max(np.abs(got - ref))),
        "cosine": float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref))),
    }
    assert (
        err["rel_l2"] <= tol["rel_l2"]
        and err["max_abs"] <= tol["max_abs"]
        and err["cosine"] >= tol["cosine_min"]
    ), err
    return err


# ---- the export --------------------------------------------------------------------------


def test_the_traced_forward_is_transformers_forward() -> None:
    """The module the exporter traces (its own mask, plain causal padding) computes what
    transformers' forward does, at lengths other than the traced one."""
    import torch

    ref, traced = c2w.tiny_code2wav(), c2w.traceable(c2w.tiny_code2wav())
    for frames in (1, 6, 33):
        codes = torch.randint(
            0,
            c2w.TINY_CODEBOOK_SIZE,
            (1, c2w.TINY_CODEBOOKS, frames),
            generator=torch.Generator().manual_seed(frames),
        )
        with torch.no_grad():
            a, b = ref(codes), traced(codes)
        assert a.shape == b.shape == (1, 1, frames * c2w.SAMPLES_PER_FRAME - TAIL)
        assert torch.equal(a, b)


def test_a_checkpoints_code2wav_tensors_load_into_the_module(tmp_path: Path) -> None:
    """A checkpoint directory (config.json's code2wav_config, code2wav.* safetensors beside
    other tensors) loads into the same module; a missing tensor is named."""
    import json

    import torch
    from safetensors.torch import save_file

    model = c2w.tiny_code2wav()
    (tmp_path / "config.json").write_text(
        json.dumps({"code2wav_config": c2w.tiny_code2wav_config().to_dict()})
    )
    tensors = {f"code2wav.{k}": v.contiguous() for k, v in model.state_dict().items()}
    save_file(
        {"talker.x": torch.zeros(2), **dict(list(tensors.items())[:10])},
        str(tmp_path / "model-1.safetensors"),
    )
    save_file(dict(list(tensors.items())[10:]), str(tmp_path / "model-2.safetensors"))
    codes = torch.randint(
        0,
        c2w.TINY_CODEBOOK_SIZE,
        (1, c2w.TINY_CODEBOOKS, 12),
        generator=torch.Generator().manual_seed(1),
    )
    with torch.no_grad():
        assert torch.equal(c2w.load_code2wav(tmp_path)(codes), model(codes))
    (tmp_path / "model-1.safetensors").unlink()
    with pytest.raises(ValueError, match="code2wav tensors missing"):
        c2w.load_code2wav(tmp_path)


def test_the_manifest_consumes_codes_and_produces_24khz_audio(built: Path) -> None:
    manifest = yaml.safe_load((built / "manifest.yaml").read_text())
    assert manifest["consumes"] == ["token_ids"] and manifest["produces"] == ["audio@24000"]
    assert manifest["inputs"] == [
        {"name": "codes", "dtype": "int64", "shape": [1, c2w.TINY_CODEBOOKS, "frames"]}
    ]
    assert manifest["metadata"]["samples_per_frame"] == 1920
    assert (
        manifest["metadata"]["export"]["precisions"]["fp32"]["measured_on_cpu_ep"]["rel_l2"] < 1e-4
    )


def test_the_cpu_ep_gate_passes(built: Path, store: EvidenceStore) -> None:
    from orchestrator.ort.sessions import open_sessions, this_process

    result = verify_placement(
        placement(built, backend="ort-cpu"), open_sessions(this_process()), store=store
    )
    assert result.status == "passed", [r.message for r in result.refusals]
    for m in result.record["numeric"]["outputs"].values():  # type: ignore[index]
        assert m["rel_l2"] < 1e-4 and m["cosine"] > 0.99999


@pytest.mark.openvino
@pytest.mark.slow
def test_the_openvino_route_takes_every_node_and_passes_the_gates(
    built: Path, ov_host: Any, store: EvidenceStore
) -> None:
    """One partition, no CPU fallback: the mask is a comparison and a Where, the padding constant."""
    result = verify_placement(placement(built), ov_host, store=store)
    assert result.status == "passed", [r.message for r in result.refusals]
    record: dict[str, Any] = result.record  # type: ignore[assignment]
    assert record["coverage"]["fraction"] == 1.0 and record["coverage"]["partitions"] == 1
    for m in record["numeric"]["outputs"].values():
        assert m["rel_l2"] < 1e-3 and m["cosine"] > 0.9999


# ---- chunked decoding ------------------------------------------------------------------


def test_chunked_audio_equals_the_whole_sequence_and_transformers(
    built: Path,
    tmp_path: Path,
    codes: np.ndarray,
    transformers_waveform: np.ndarray,
) -> None:
    """vLLM-Omni's windows (4 frames first, then 25 with 25 of left context): the chunks'
    new samples, concatenated, are the graph's whole-sequence waveform (one call on all 90
    frames) and transformers' forward, within the artifact's gate tolerance."""
    tol = yaml.safe_load((built / "manifest.yaml").read_text())["tolerance"]
    chunks = _decode(
        _runner(built, tmp_path, {"frames": 25, "left_context": 25, "first_frames": 4}), codes
    )
    whole = _decode(_runner(built, tmp_path, {"frames": None}), codes)

    assert [len(c["audio"]) for c in chunks] == [4 * 1920 - TAIL] + [25 * 1920] * 3 + [11 * 1920]
    assert {c["sample_rate"] for c in chunks} == {24000}
    assert len(whole) == 1 and len(whole[0]["audio"]) == FRAMES * 1920 - TAIL
    chunked = np.concatenate([c["audio"] for c in chunks])
    _within(chunked, whole[0]["audio"], tol)
    _within(chunked, transformers_waveform, tol)
    _within(whole[0]["audio"], transformers_waveform, tol)


def test_a_left_context_shorter_than_the_decoders_reach_shows(
    built: Path, tmp_path: Path, codes: np.ndarray
) -> None:
    """The comparison above can fail: with 2 frames of left context the windows miss what the
    sliding-window transformer (2 layers × 7 frames back) and the ConvNet reach, and the
    chunked waveform leaves the tolerance — as the real model's 8 × 71 frames do with 25."""
    tol = yaml.safe_load((built / "manifest.yaml").read_text())["tolerance"]
    short = _decode(
        _runner(built, tmp_path, {"frames": 25, "left_context": 2, "first_frames": 4}), codes
    )
    whole = _decode(_runner(built, tmp_path, {"frames": None}), codes)
    chunked = np.concatenate([c["audio"] for c in short])
    assert chunked.shape == whole[0]["audio"].shape
    with pytest.raises(AssertionError):
        _within(chunked, whole[0]["audio"], tol)


def test_audio_starts_before_the_talker_has_finished(
    built: Path, tmp_path: Path, codes: np.ndarray
) -> None:
    """The talker stand-in sends its first 4 frames, then waits until audio has come out
    before it sends the rest: a stage that waited for the end would never answer (the
    wait below fails it after a minute; a streaming stage answers after one call)."""
    runner = _runner(built, tmp_path, {"frames": 25, "left_context": 25, "first_frames": 4})
    heard = asyncio.Event()
    sent_before_audio: list[int] = []

    async def talker() -> AsyncIterator[list[int]]:
        for f in range(codes.shape[1]):
            if f == 4:
                sent_before_audio.append(f)
                await heard.wait()
            yield [int(x) for x in codes[:, f]]

    async def listen() -> list[dict[str, Any]]:
        out = []
        async for item in runner.stream("r1", talker()):
            out.append(item)
            heard.set()
        return out

    try:
        items = asyncio.run(asyncio.wait_for(listen(), timeout=60))
    finally:
        runner.close()
    assert sent_before_audio == [4]
    assert len(items) == 5 and len(items[0]["audio"]) == 4 * 1920 - TAIL


# ---- bad input -------------------------------------------------------------------------


def test_a_code_outside_the_codebook_fails_the_request_naming_it(
    built: Path, tmp_path: Path, codes: np.ndarray
) -> None:
    bad = codes.copy()
    bad[2, 10] = c2w.TINY_CODEBOOK_SIZE + 5
    with pytest.raises(StageFailed) as err:
        _decode(
            _runner(built, tmp_path, {"frames": 25, "left_context": 25, "first_frames": 4}), bad
        )
    msg = str(err.value)
    assert "code2wav" in msg and f"code {c2w.TINY_CODEBOOK_SIZE + 5} (codebook 2, frame" in msg
    assert f"outside the codebook [0, {c2w.TINY_CODEBOOK_SIZE})" in msg


def test_an_item_that_is_not_codes_fails_the_request_naming_it(built: Path, tmp_path: Path) -> None:
    runner = _runner(built, tmp_path, {"frames": 25})

    async def text() -> AsyncIterator[str]:
        yield "hello"

    async def collect() -> list[Any]:
        return [x async for x in runner.stream("r1", text())]

    try:
        with pytest.raises(
            StageFailed,
            match=r"after 0 frame\(s\) of codes: an item of <U5 shape \[\] is not frames of codes",
        ):
            asyncio.run(collect())
    finally:
        runner.close()


def test_chunk_on_an_artifact_without_samples_per_frame_is_refused_before_loading(
    built: Path, tmp_path: Path
) -> None:
    from orchestrator.planner import plan_pipeline

    copy = tmp_path / "art"
    copy.mkdir()
    for f in built.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    manifest = yaml.safe_load((copy / "manifest.yaml").read_text())
    del manifest["metadata"]["samples_per_frame"]
    (copy / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(ConfigError) as err:
        plan_pipeline(_config(copy, {"frames": 25}), machine_profile(), runtime=False)
    text = str(err.value)
    assert (
        "stages.code2wav.chunk" in text
        and "metadata.samples_per_frame" in text
        and "remove `chunk`" in text
    )


def test_a_left_context_of_zero_is_a_config_error(tmp_path: Path, built: Path) -> None:
    """A later window needs a frame of context to re-decode the previous window's tail."""
    from orchestrator.config import parse_config

    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "name": "p",
                "stages": [
                    {
                        "name": "code2wav",
                        "kind": "exported_graph",
                        "artifact": str(built),
                        "devices": ["cpu"],
                        "chunk": {"frames": 25, "left_context": 0},
                        "final_output": True,
                    }
                ],
            },
            where="t.yaml",
            base_dir=tmp_path,
        )
    assert "stages[0].chunk.left_context" in str(err.value) or "chunk.left_context" in str(
        err.value
    )


# ---- the windows -----------------------------------------------------------------------


def _windows(chunker: FrameChunker, frames: int) -> Iterator[tuple[int, int, int]]:
    for f in range(frames):
        for w in chunker.add(np.full(4, f)):
            yield (int(w.codes[0, 0]), w.context, w.new)
    for w in chunker.finish():
        yield (int(w.codes[0, 0]), w.context, w.new)


def test_the_windows_are_vllm_omnis() -> None:
    """(first frame in the window, context, new): 4 first, then 25 with up to 25 behind."""
    assert list(_windows(FrameChunker(25, 25, 4), 60)) == [
        (0, 0, 4),
        (0, 4, 25),
        (4, 25, 25),
        (29, 25, 6),
    ]
    assert list(_windows(FrameChunker(25, 25, 0), 50)) == [(0, 0, 25), (0, 25, 25)]
    assert list(_windows(FrameChunker(None, 25, 4), 30)) == [(0, 0, 30)]
    assert list(_windows(FrameChunker(10, 3, 0), 0)) == []


def test_the_kept_samples_refill_the_previous_windows_tail() -> None:
    """A window of 2 + 3 frames at 10 samples a frame whose decoder returns 46 samples (tail 4)
    keeps [16, 46): 30 samples, the 3 new frames' worth, starting 4 early. A context too short
    for the tail is refused."""
    codes = np.zeros((4, 5), dtype=np.int64)
    assert new_samples(np.zeros((1, 1, 46)), Window(codes, 2, 3), 10) == (16, 46)
    assert new_samples(np.zeros((1, 1, 26)), Window(codes[:, :3], 0, 3), 10) == (
        0,
        26,
    )  # the first window
    with pytest.raises(ValueError, match="a left context of 1 frame"):
        new_samples(np.zeros((1, 1, 25)), Window(codes[:, :4], 1, 3), 10)  # tail 15 > 1 × 10
