"""bench/turn_scores.py: the groups it scores are the voice-latency bench's questions, each
eagerness's counts are its threshold applied to the printed scores, and a missing config is
exit 2 before the model loads. Nothing here reads what the model scored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.bench import load_bench

pytest.importorskip("llama_cpp")


def test_the_report_counts_each_threshold_over_its_own_scores() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench/turn_scores.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    doc = json.loads(out)
    voice_latency = load_bench("voice_latency")
    n_finished = len(voice_latency.QUESTIONS) + len(voice_latency.PAUSED)
    groups = doc["groups"]
    assert (groups["finished"]["n"], groups["cut"]["n"]) == (n_finished, len(voice_latency.PAUSED))
    for g in groups.values():
        assert len(g["scores"]) == g["n"] and all(0.0 <= s <= 1.0 for s in g["scores"])
        assert g["min"] <= g["median"] <= g["max"]
    for e in doc["eagerness"].values():
        for name in ("finished", "cut"):
            taken = sum(s >= e["threshold"] for s in groups[name]["scores"])
            assert e[f"{name}_taken"] == taken


def test_a_missing_config_is_exit_2_naming_it(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "bench/turn_scores.py"), "--config", str(tmp_path / "no.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
