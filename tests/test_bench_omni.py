"""bench/omni.py run tiny, end to end (Ray, the tiny Qwen3-Omni and its exported code2wav): its
JSON carries every figure the docs quote, and its report is judged on the figures, not on
speed. The summary arithmetic is checked on hand-made rows (no run)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.bench import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("omni")


def row(
    ttfa: float, thinker: float, talker: float, code2wav: float, audio_s: float = 1.0
) -> dict[str, Any]:
    return {
        "ttfa": ttfa,
        "total": code2wav,
        "thinker_done": thinker,
        "talker_done": talker,
        "code2wav_done": code2wav,
        "audio_s": audio_s,
        "frames": 15,
    }


def test_the_summary_takes_medians_and_the_ratios_of_them(bench: ModuleType) -> None:
    runs = {
        "inproc_whole": [row(0.5, 0.1, 0.4, 0.5), row(0.7, 0.2, 0.6, 0.7), row(0.6, 0.1, 0.5, 0.6)],
        "inproc_chunked": [row(0.2, 0.1, 0.4, 0.6)] * 3,
        "ray_whole": [row(1.2, 0.3, 1.0, 1.2)] * 3,
        "ray_chunked": [row(0.3, 0.2, 0.9, 1.1)] * 3,
    }
    s = bench.summarise(runs)
    assert s["figures"]["inproc_whole"]["ttfa"] == pytest.approx(0.6)
    assert s["stage_s"]["inproc_whole"] == pytest.approx(
        {"thinker": 0.1, "talker": 0.4, "code2wav": 0.1}
    )
    assert s["overhead_ratio"]["thinker"] == pytest.approx(3.0) and s["overhead_ratio"][
        "total"
    ] == pytest.approx(2.0)
    assert s["ttfa_chunked_over_whole"] == pytest.approx({"in_process": 0.2 / 0.6, "ray": 0.25})
    assert s["same_audio_length"]
    runs["ray_chunked"] = [row(0.3, 0.2, 0.9, 1.1, audio_s=0.9)] * 3
    assert not bench.summarise(runs)["same_audio_length"]  # a variant that lost audio is caught


def test_a_variant_without_audio_is_n_a(bench: ModuleType) -> None:
    runs = {v: [row(0.5, 0.1, 0.4, 0.5)] for v in bench.VARIANTS}
    runs["ray_chunked"] = [{**row(0.5, 0.1, 0.4, 0.5), "ttfa": None}]
    s = bench.summarise(runs)
    assert s["ttfa_chunked_over_whole"]["ray"] is None
    text = "\n".join(bench.report(s, type("A", (), {"thinker_tokens": 8, "repeat": 1})()))
    line = next(x for x in text.splitlines() if x.startswith("first audio, chunked"))
    assert "n/a" in line and max(len(x) for x in text.splitlines()) <= 80


@pytest.mark.slow
def test_bench_omni_runs_tiny_and_writes_its_figures(
    bench: ModuleType, ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "omni.json"
    assert (
        bench.main(["--thinker-tokens", "4", "--frames", "12", "--repeat", "1", "--json", str(out)])
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["placement"]["code2wav"]["backend"].startswith("ort-")
    assert doc["placement"]["talker"]["backend"].startswith("transformers-")
    assert doc["chunk"] == {
        "chunked": {"frames": 25, "left_context": 25, "first_frames": 4},
        "whole": {"frames": None},
    }
    for variant in bench.VARIANTS:
        f = doc["figures"][variant]
        assert f["ttfa"] > 0 and f["total"] >= f["ttfa"] and f["audio_s"] > 0, variant
        assert len(doc["runs"][variant]) == 1
    assert set(doc["overhead_ratio"]) == {"thinker", "talker", "code2wav", "total"}
    assert all(v > 0 for v in doc["overhead_ratio"].values())
    assert doc["ttfa_chunked_over_whole"]["ray"] > 0 and doc["same_audio_length"] is True
    printed = capsys.readouterr()
    assert "first audio, chunked" in printed.out and "round 0 (warm-up)" in printed.err
