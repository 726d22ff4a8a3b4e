"""Every test here gets its own evidence cache (``private_cache`` in tests/conftest.py):
what one test verifies or memoises is never read by another."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache
