"""Exported artifacts: the manifest contract (``artifact.py``), shipped artifacts, and their hooks."""
