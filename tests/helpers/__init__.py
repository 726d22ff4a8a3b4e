"""Helpers the tests import (fixtures stay in the conftest.py files).

``REPO`` is the repository root; the modules hold the rest: ``checkpoints``
(tiny checkpoints whose headers are real), ``profiles`` (inline hardware
profiles), ``graphs`` (ONNX graphs, artifacts, placements), ``echo`` (the echo
kind's hand-written plans) and the others named by what they serve.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
