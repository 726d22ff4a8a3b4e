"""Silero VAD (v6, MIT) as an exported artifact: the reference data, made by code.

The graphs ship inside the ``silero-vad`` PyPI package; two artifacts point at
them with ``package://`` locations and hold only the reference files this
module writes:

* ``exports/silero-vad``: ``silero_vad/data/silero_vad.onnx``, the plain
  opset-16 graph (the network inside an ``If`` whose branches have dynamic-rank
  outputs: the CPU EP runs it, OpenVINO's CPU plug-in refuses it);
* ``exports/silero-vad-op18``: ``silero_vad/data/silero_vad_op18_ifless.onnx``,
  the same weights without the dynamic-rank ``If`` (OpenVINO compiles it).

The ``vad`` stage kind (``stages/vad``) runs either one window by window.

One call of the graph scores one chunk of 16 kHz audio. Its inputs, as the
package's own ``OnnxWrapper`` feeds them:

* ``input`` float32 ``[batch, 64 + 512]``: the last 64 samples of the previous
  chunk (zeros for the first) followed by the 512-sample chunk;
* ``sr`` int64, a **0-d** scalar: the sample rate (16000 or 8000);
* ``state`` float32 ``[2, batch, 128]``: the recurrent state, zeros at the start.

Outputs: ``output`` ``[batch, 1]`` (speech probability) and ``stateN`` (the next
state). Regenerate an artifact's reference files (its own graph, from its
manifest) with::

    python -m exports.silero_vad exports/silero-vad-op18
    python -m exports.silero_vad exports/silero-vad

The inputs are a fixed synthetic chunk (no randomness, no audio file); the
outputs are the CPU EP's answer on this interpreter's onnxruntime, so the
numeric gate compares every other EP with the CPU EP on the same inputs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.core.packages import resolve_package_location
from stages.exported_graph.artifact import save_npz

if TYPE_CHECKING:
    import numpy as np

GRAPH = "package://silero_vad/data/silero_vad_op18_ifless.onnx"
SAMPLE_RATE = 16000
CHUNK_SAMPLES = 512
"""Samples per call at 16 kHz (32 ms); the package refuses any other count."""
CONTEXT_SAMPLES = 64
"""Samples of the previous chunk prepended to each call at 16 kHz."""
STATE_SHAPE = (2, 1, 128)
F0_HZ = 140.0
"""Fundamental of the synthetic voiced chunk (a low adult voice)."""
FORMANTS_HZ = (700.0, 1200.0, 2600.0)
"""Formants of an open vowel (/a/): the harmonics near them are loudest."""


def synthetic_chunk() -> Any:
    """512 samples of a vowel-like sound at 16 kHz, peak 0.5, float32.

    Harmonics of ``F0_HZ`` up to 4 kHz, each weighted by its distance to the
    nearest formant, so the chunk looks like voiced speech to the VAD (it
    scores it about 0.62) while being exactly reproducible from code.
    """
    import numpy as np

    t = np.arange(CHUNK_SAMPLES, dtype=np.float64) / SAMPLE_RATE
    chunk = np.zeros(CHUNK_SAMPLES, dtype=np.float64)
    k = 1
    while k * F0_HZ < 4000.0:
        f = k * F0_HZ
        weight = max(1.0 / (1.0 + ((f - fm) / 150.0) ** 2) for fm in FORMANTS_HZ) + 0.05 / k
        chunk += weight * np.sin(2.0 * np.pi * f * t)
        k += 1
    chunk *= 0.5 / np.max(np.abs(chunk))
    return chunk.astype(np.float32)


def reference_feeds() -> dict[str, np.ndarray]:
    """The feed dict of the first call on ``synthetic_chunk()``: zero context, zero state."""
    import numpy as np

    audio = np.concatenate([np.zeros(CONTEXT_SAMPLES, dtype=np.float32), synthetic_chunk()])
    return {
        "input": audio[np.newaxis, :],
        "sr": np.array(SAMPLE_RATE, dtype=np.int64),  # 0-d, as the graph declares it
        "state": np.zeros(STATE_SHAPE, dtype=np.float32),
    }


def cpu_outputs(graph: str | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs on the CPU EP of this interpreter's onnxruntime."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # the graph carries unused initializers ORT warns about
    session = ort.InferenceSession(
        str(graph), sess_options=options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def manifest_graph(directory: str | Path) -> str:
    """The fp32 graph an artifact directory's manifest names (a ``package://`` location
    resolved, a relative path taken from the directory), or ``GRAPH`` without a manifest."""
    manifest = Path(directory) / "manifest.yaml"
    if not manifest.is_file():
        return str(resolve_package_location(GRAPH))
    where = str(yaml.safe_load(manifest.read_text())["precisions"]["fp32"])
    return str(
        resolve_package_location(where)
        if where.startswith("package://")
        else Path(directory) / where
    )


def write_reference(directory: str | Path, graph: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``reference_inputs.npz`` and ``reference_outputs.npz`` into ``directory``: the
    fixed feeds, and ``graph``'s outputs on them (default: the graph its manifest names)."""
    d = Path(directory)
    feeds = reference_feeds()
    outputs = cpu_outputs(graph or manifest_graph(d), feeds)
    return (
        save_npz(d / "reference_inputs.npz", feeds, deflate=False),
        save_npz(d / "reference_outputs.npz", outputs, deflate=False),
    )


if __name__ == "__main__":  # python -m exports.silero_vad exports/silero-vad[-op18]
    for written in write_reference(sys.argv[1] if len(sys.argv) > 1 else "."):
        print(written)
