"""Qwen2.5-Omni's token2wav: the DiT step and BigVGAN as exported graphs (``kind``, ``runner``)."""

VOICES = "voices.npz"
"""The file of the DiT artifact that holds the checkpoint's voices (``<speaker>.cond``,
``<speaker>.ref_mel``): the kind reads its names to plan, the runner its arrays to load.
Here, not in ``kind``, so that the runner (which the kind loads by name) imports nothing of it."""
