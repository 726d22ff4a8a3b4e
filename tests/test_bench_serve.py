"""bench/serve.py's report: targets judged on the figures measured, ``n/a`` (and no
verdict) where a reply had no audio. Only the report is exercised (no server)."""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.bench import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("serve")


def row(ttft: float, ttfa: float | None, total: float) -> dict[str, Any]:
    return {"ttft": ttft, "ttfa": ttfa, "total": total}


def figures(bench: ModuleType, http_ttfa: float | None) -> dict[str, Any]:
    http = [row(0.060, http_ttfa, 1.0)]
    api = [row(0.057, 0.700, 0.98)]
    out: dict[str, Any] = {"server_cold_start_s": 12.5, "server_exit": 0}
    for name, rows in (("http", http), ("http_raw", http), ("in_process", api)):
        out[name] = {
            k: bench.med(rows, k) for k in ("ttft", "ttfa", "total", "ttft_added", "ttfa_added")
        }
        out[name]["rows"] = rows
    for name, rps, busy in (("serial", 1.0, 1.25), ("concurrent", 1.5, 1.9)):
        out[name] = {
            "throughput_rps": rps,
            "ttfa_p50": 0.8,
            "ttfa_p95": 1.2,
            "answered": 8,
            "cores_busy": busy,
        }
    out["cores"] = 2
    return out


ARGS = argparse.Namespace(repeat=1, clients=8, tokens=32)


def test_deltas_are_judged_against_the_targets(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.report(figures(bench, 0.750), ARGS)
    out = capsys.readouterr().out
    assert "time to first token       60.0ms    57.0ms     3.0ms      +5ms  met" in out
    assert "time to first audio      750.0ms   700.0ms    50.0ms     +10ms  MISSED" in out
    assert "throughput ratio (at once / one by one): 1.50x" in out
    assert "one by one 1.25, at once 1.90 of 2" in out
    assert "at once, at most 2 / 1.25 = 1.60x one by one" in out  # the ceiling on 2 cores
    assert max(len(line) for line in out.splitlines()) <= 80


def test_no_audio_is_na_and_not_judged(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.report(figures(bench, None), ARGS)
    line = next(
        x for x in capsys.readouterr().out.splitlines() if "time to first audio" in x and "ms" in x
    )
    assert "n/a" in line and "met" not in line and "MISSED" not in line


def test_percentiles_and_medians(bench: ModuleType) -> None:
    assert bench.pct([3.0, 1.0, 2.0, 4.0], 0.5) in (2.0, 3.0) and bench.pct([], 0.5) is None
    assert bench.pct([1.0, 2.0, 3.0, 4.0, 100.0], 0.95) == 100.0
    assert bench.med([{"x": 1.0}, {"x": None}, {"x": 3.0}], "x") == 2.0
