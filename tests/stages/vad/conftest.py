"""A private evidence cache per test: verdicts never leak between the vad tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache
