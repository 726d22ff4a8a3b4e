"""bench/calibration.py's report (no run): the targets are judged on the calibrated run,
an upper bound is not judged, and an overrun of an estimated budget is a finding."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.helpers.bench import load_bench

MiB = 2**20


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("calibration")


def run(
    budget: dict[str, int], peaks: dict[str, int], calibrated: bool, over: tuple[str, ...] = ()
) -> dict[str, Any]:
    cal = {
        "match": "exact",
        "provenance": {"samples": 1},
        "before_bytes": 2000 * MiB,
        "after_bytes": 0,
    }
    stages = {
        n: {"budget_bytes": b, "calibration": {**cal, "after_bytes": b} if calibrated else None}
        for n, b in budget.items()
    }
    cell_stages = {
        n: {
            "measured_peak_bytes": p,
            "budget_bytes": budget[n],
            "within_budget": n not in over,
            "upper_bound": False,
        }
        for n, p in peaks.items()
    }
    return {
        "start_s": 1.0,
        "stages": stages,
        "ray": {"planned_bytes": 900 * MiB, "planned_evidence": "E", "measured_bytes": 700 * MiB},
        "cells": [
            {
                "prompt": "long",
                "concurrency": 4,
                "seconds": 1.0,
                "longest_sentence_chars": 120,
                "stages": cell_stages,
            }
        ],
    }


def test_a_tight_safe_calibrated_run_passes(bench: ModuleType) -> None:
    first = run(
        {"thinker": 1500 * MiB, "voice": 760 * MiB},
        {"thinker": 1250 * MiB, "voice": 800 * MiB},
        False,
        over=("voice",),
    )
    second = run(
        {"thinker": 1320 * MiB, "voice": 880 * MiB},
        {"thinker": 1260 * MiB, "voice": 800 * MiB},
        True,
    )
    text, ok = bench.report([first, second])
    assert ok, text
    assert "finding: measured above the estimated budget in long@4" in text
    assert (
        "target voice: 1.00 <= budget/measured <= 1.15 after one calibration run: 1.1 PASS" in text
    )


@pytest.mark.parametrize(
    ("voice_budget", "why"),
    [(700, "FAIL: measured above its calibrated budget"), (1000, "1.25 FAIL")],
)
def test_an_unsafe_or_loose_calibrated_run_fails(
    bench: ModuleType, voice_budget: int, why: str
) -> None:
    first = run(
        {"thinker": 1500 * MiB, "voice": 760 * MiB},
        {"thinker": 1250 * MiB, "voice": 700 * MiB},
        False,
    )
    over = ("voice",) if voice_budget < 800 else ()
    second = run(
        {"thinker": 1320 * MiB, "voice": voice_budget * MiB},
        {"thinker": 1260 * MiB, "voice": 800 * MiB},
        True,
        over=over,
    )
    text, ok = bench.report([first, second])
    assert not ok and why in text, text
