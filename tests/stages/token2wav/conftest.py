"""The tiny Qwen2.5-Omni's token2wav artifacts (built once, from the checkpoint as it is) and a
private evidence cache per test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


@pytest.fixture(scope="session")
def token2wav_graphs() -> dict[str, Path]:
    """``{"dit": dir, "vocoder": dir}``, exported from exports/qwen2_5-omni-tiny as it is now."""
    from exports import omni_tiny
    from exports import qwen2_5_omni_token2wav as t2w

    omni_tiny.ensure_built()
    t2w.ensure_built()
    return {"dit": t2w.DIT_DIR, "vocoder": t2w.BIGVGAN_DIR}
