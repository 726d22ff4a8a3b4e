"""Modules whose import takes a while and notes when it ran (for the device actor's import test)."""

SPANS: list[tuple[str, float, float]] = []
