"""Qwen2.5-Omni's token2wav: the DiT step and BigVGAN as exported graphs (``kind``, ``runner``)."""

from pathlib import Path

from stages.exported_graph.artifact import confined_file

VOICES = "voices.npz"
"""The file of the DiT artifact that holds the checkpoint's voices (``<speaker>.cond``,
``<speaker>.ref_mel``): the kind reads its names to plan, the runner its arrays to load.
Here, not in ``kind``, so that the runner (which the kind loads by name) imports nothing of it."""


def voices_file(dit_dir: str | Path) -> Path:
    """``dit_dir``'s ``voices.npz``, which must lie inside it (a link out is a ``ConfigError``,
    as for every file an artifact names: ``ExportedArtifact.file``)."""
    return confined_file(Path(dit_dir).resolve(), VOICES, f"{dit_dir}/{VOICES}")
