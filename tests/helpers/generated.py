"""Artifacts that scripts/bootstrap.sh generates on the machine, and whether they are here.

The int8 Piper voice (``python -m exports.piper_voice build``) is measured against fp32
on this CPU before it lands; where its error is over the exporter's ceiling the build is
refused and bootstrap keeps the end of its output in
``exports/piper-en-us-joe-medium-int8.refused``. That refusal is this CPU's answer, not a
missing set-up step: the tests that need the voice skip as a *capability* this machine
lacks (tests/helpers/skips.py), and only when the record is the exporter's refusal with
figures over the ceiling. A record of any other failure (bootstrap keeps whatever the
build printed) is a missing asset: those tests then skip as missing, which fails them
under ``--require-assets``; an artifact neither built nor refused fails them outright.
"""

from __future__ import annotations

import re

from exports.piper_voice import INT8_ARTIFACT_DIR
from orchestrator.exporter.build import CEILINGS
from tests.helpers.skips import CAPABILITY, MISSING, reason

INT8_VOICE_REFUSED = INT8_ARTIFACT_DIR.with_name(INT8_ARTIFACT_DIR.name + ".refused")
MEASURED = re.compile(
    r"the int8 graph loses too much: worst rel L2 (?P<rel_l2>\S+) \(at most \S+\) and "
    r"cosine (?P<cosine>\S+) \(at least \S+\)"
)
"""The exporter's numeric refusal (orchestrator/exporter/build.py), with what it measured."""


def over_ceiling(record: str) -> str | None:
    """The exporter's int8 refusal in ``record`` when its figures are over the ceiling, else None."""
    found = MEASURED.search(" ".join(record.split()))
    if found is None:
        return None
    try:
        rel_l2, cosine = float(found["rel_l2"]), float(found["cosine"])
    except ValueError:
        return None
    max_rel, min_cos = CEILINGS["int8"]
    return None if rel_l2 <= max_rel and cosine >= min_cos else found[0]  # NaN: over


def int8_voice_skip() -> str | None:
    """The skip reason for a test that needs the int8 voice, or None where it should run:
    built, or neither built nor refused (then the test fails on the missing artifact)."""
    if (INT8_ARTIFACT_DIR / "manifest.yaml").is_file() or not INT8_VOICE_REFUSED.is_file():
        return None
    record = INT8_VOICE_REFUSED.read_text(errors="replace")
    measured = over_ceiling(record)
    if measured is None:
        last = (record.strip().splitlines() or ["(no output)"])[-1]
        return reason(
            MISSING,
            f"the int8 voice's build failed for another reason than its measured error "
            f"({INT8_VOICE_REFUSED}): {last}; delete that file and rerun scripts/bootstrap.sh",
        )
    return reason(
        CAPABILITY,
        f"this CPU's int8 voice is over the exporter's ceiling ({INT8_VOICE_REFUSED.name}): "
        + measured,
    )
