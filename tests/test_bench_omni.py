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


def test_vllm_omnis_figures_are_medians_of_each_requests_ttfp_rtf_and_e2e(
    bench: ModuleType,
) -> None:
    one = {
        "inproc_whole": [row(0.5, 0.1, 0.4, 0.5, audio_s=2.0)] * 3,
        "inproc_chunked": [row(0.2, 0.1, 0.4, 0.6, audio_s=2.0)] * 3,
        "ray_whole": [row(1.0, 0.2, 0.8, 1.0, audio_s=2.0)] * 3,
        "ray_chunked": [row(0.4, 0.2, 0.8, 1.2, audio_s=2.0)] * 3,
    }
    four = {v: [row(0.8, 0.2, 0.6, 1.6, audio_s=2.0)] * 4 for v in bench.VARIANTS}
    four["ray_chunked"] = [row(0.4, 0.2, 0.6, 0.8, audio_s=2.0)] * 4
    f = bench.vllm_omni_figures({"1": one, "4": four}, bench.QWEN3)
    c1 = f["concurrency"]["1"]
    assert c1["figures"]["ray_whole"] == pytest.approx(
        {"ttfp_s": 1.0, "rtf": 0.5, "e2e_s": 1.0, "requests": 3}
    )
    assert c1["chunked_over_whole"]["in_process"] == pytest.approx(
        {"ttfp_s": 0.4, "rtf": 1.2, "e2e_s": 1.2}
    )
    assert c1["pipeline_over_one_process"]["chunked"] == pytest.approx(
        {"ttfp_s": 2.0, "rtf": 2.0, "e2e_s": 2.0}
    )
    c4 = f["concurrency"]["4"]
    assert c4["figures"]["ray_chunked"]["requests"] == 4
    assert c4["chunked_over_whole"]["ray"] == pytest.approx(
        {"ttfp_s": 0.5, "rtf": 0.5, "e2e_s": 0.5}
    )
    # each stage's share of the stages' time, whole hand-over, c 1: 0.1, 0.3, 0.1 in process
    assert f["stage_share"]["in_process"] == pytest.approx(
        {"thinker": 0.2, "talker": 0.6, "code2wav": 0.2}
    )
    assert f["same_audio_length"]
    four["inproc_whole"] = [row(0.8, 0.2, 0.6, 1.6, audio_s=1.5)] * 4
    assert not bench.vllm_omni_figures({"1": one, "4": four}, bench.QWEN3)["same_audio_length"]


def test_a_pipeline_without_a_chunked_hand_over_has_no_chunked_ratios(bench: ModuleType) -> None:
    def t2w(ttfa: float, total: float) -> dict[str, Any]:
        return {
            "ttfa": ttfa,
            "total": total,
            "thinker_done": 0.1,
            "talker_done": 0.3,
            "token2wav_done": total,
            "audio_s": 1.0,
            "frames": 15,
        }

    runs = {"1": {"inproc_whole": [t2w(0.5, 0.5)], "ray_whole": [t2w(1.0, 1.0)]}}
    f = bench.vllm_omni_figures(runs, bench.QWEN2_5)
    c1 = f["concurrency"]["1"]
    assert c1["chunked_over_whole"] == {"in_process": None, "ray": None}
    assert c1["pipeline_over_one_process"]["chunked"] is None
    assert c1["pipeline_over_one_process"]["whole"] == pytest.approx(
        {"ttfp_s": 2.0, "rtf": 2.0, "e2e_s": 2.0}
    )
    assert f["stage_share"]["in_process"] == pytest.approx(
        {"thinker": 0.2, "talker": 0.4, "token2wav": 0.4}
    )
    lines = bench.omni_report(bench.QWEN2_5, f)
    assert not any(x.startswith("chunked / whole") for x in lines)
    assert any("no chunked hand-over" in x for x in lines)
    assert max(len(x) for x in lines) <= 80


def test_concurrency_without_one_is_refused_before_anything_loads(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--concurrency", "4"])
    assert exit_.value.code == 2
    assert "--concurrency" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_omni_runs_tiny_and_writes_its_figures(
    bench: ModuleType, ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "omni.json"
    assert (
        bench.main(
            [
                "--thinker-tokens",
                "4",
                "--frames",
                "12",
                "--repeat",
                "1",
                "--concurrency",
                "1",
                "2",
                "--json",
                str(out),
            ]
        )
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
    # vLLM-Omni's figures for both tiny Omni pipelines, at each concurrency
    omni = doc["vllm_omni"]
    assert set(omni) == {"qwen3-omni-tiny", "qwen2_5-omni-tiny"} and doc["concurrency"] == [1, 2]
    assert omni["qwen2_5-omni-tiny"]["placement"]["token2wav"]["backend"].startswith("ort-")
    for model, variants in (
        ("qwen3-omni-tiny", bench.VARIANTS),
        ("qwen2_5-omni-tiny", ("inproc_whole", "ray_whole")),
    ):
        got = omni[model]
        assert got["same_audio_length"] is True, model
        assert set(got["concurrency"]) == {"1", "2"}
        for c, per in got["concurrency"].items():
            assert set(per["figures"]) == set(variants)
            for v in variants:
                f = per["figures"][v]
                rows = got["runs"][c][v]
                assert f["requests"] == len(rows) == int(c), (model, c, v)
                assert 0 < f["ttfp_s"] <= f["e2e_s"], (model, c, v)
                # RTF is each request's E2E over its audio's length (one length for all)
                assert f["rtf"] == pytest.approx(f["e2e_s"] / rows[0]["audio_s"]), (model, c, v)
            ratio = per["pipeline_over_one_process"]["whole"]
            assert ratio["ttfp_s"] == pytest.approx(
                per["figures"]["ray_whole"]["ttfp_s"] / per["figures"]["inproc_whole"]["ttfp_s"]
            )
        shares = got["stage_share"]
        for where in ("in_process", "ray"):
            assert sum(shares[where].values()) == pytest.approx(1.0)
            assert all(v > 0 for v in shares[where].values())
    assert omni["qwen3-omni-tiny"]["concurrency"]["1"]["chunked_over_whole"]["ray"]["ttfp_s"] == (
        pytest.approx(doc["ttfa_chunked_over_whole"]["ray"])
    )
    assert omni["qwen2_5-omni-tiny"]["concurrency"]["2"]["chunked_over_whole"]["ray"] is None
    printed = capsys.readouterr()
    assert "first audio, chunked" in printed.out and "round 0 (warm-up)" in printed.err
    assert "qwen2_5-omni-tiny in vLLM-Omni's terms" in printed.out
    assert max(len(x) for x in printed.out.splitlines()) <= 80
