"""Artifacts that scripts/bootstrap.sh generates on the machine, and whether they are here.

The int8 Piper voice (``python -m exports.piper_voice build``) is measured against fp32
on this CPU before it lands; where its error is over the exporter's ceiling the build is
refused and bootstrap keeps the reason in ``exports/piper-en-us-joe-medium-int8.refused``.
Tests that need it skip with that reason, and only then: an artifact that is neither
built nor refused is a missing set-up step, and the tests fail on it.
"""

from __future__ import annotations

from exports.piper_voice import INT8_ARTIFACT_DIR

INT8_VOICE_REFUSED = INT8_ARTIFACT_DIR.with_name(INT8_ARTIFACT_DIR.name + ".refused")


def int8_voice_refused() -> str | None:
    """Why the int8 voice was refused on this machine, or None when it was not refused
    (built, or not attempted — the latter fails the tests that need it)."""
    if (INT8_ARTIFACT_DIR / "manifest.yaml").is_file() or not INT8_VOICE_REFUSED.is_file():
        return None
    last = INT8_VOICE_REFUSED.read_text(errors="replace").strip().splitlines()[-1:] or [
        "(no output)"
    ]
    return f"the int8 voice was refused on this machine ({INT8_VOICE_REFUSED.name}): {last[0]}"
