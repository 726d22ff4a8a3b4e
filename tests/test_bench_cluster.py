"""bench/cluster.py: its summary (medians, ratios to the relay), its 80-column table, its
refusal of bad arguments before a cluster starts, and one tiny run on three real Ray nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import REPO
from tests.helpers.bench import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("cluster")


def _runs(bench: ModuleType, nodes: int) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """Three runs per case: per-item ms 10/20/30 for the relay, half for relay-ref, a tenth
    for direct; the driver's CPU ms a half of that; across nodes twice within."""
    scale = {"relay": 1.0, "relay-ref": 0.5, "direct": 0.1}
    ms, cpu = {}, {}
    for layout in bench.LAYOUTS[nodes]:
        far = 2.0 if layout != "within one node" else 1.0
        for kind in bench.PAYLOADS:
            for mode in bench.MODES:
                ms[(layout, kind, mode)] = [x * scale[mode] * far for x in (30.0, 10.0, 20.0)]
                cpu[(layout, kind, mode)] = [x / 2 for x in ms[(layout, kind, mode)]]
    return ms, cpu


def test_the_summary_takes_medians_and_ratios_to_the_relay(bench: ModuleType) -> None:
    s = bench.summarise(2, 200, 3, *_runs(bench, 2))
    across = s["results"]["across nodes"]["audio"]
    assert across["relay"]["ms_per_item"] == 40.0 and across["relay"]["ms_vs_relay"] == 1.0
    assert across["relay-ref"]["ms_per_item"] == 20.0 and across["relay-ref"]["ms_vs_relay"] == 0.5
    assert across["direct"]["driver_cpu_ms_per_item"] == 2.0
    assert across["direct"]["cpu_vs_relay"] == 0.1
    assert across["direct"]["runs_ms"] == [6.0, 2.0, 4.0]
    assert s["rows"]["text"] == {"within_ms": 20.0, "across_ms": 40.0, "ratio": 2.0}


def test_three_nodes_put_producer_and_consumer_off_the_drivers_node(bench: ModuleType) -> None:
    s = bench.summarise(3, 200, 3, *_runs(bench, 3))
    assert s["layouts"] == {
        "across, via the driver's node": {"producer": "second", "consumer": "third"}
    }
    assert "rows" not in s
    assert set(s["results"]["across, via the driver's node"]["text"]) == set(bench.MODES)


@pytest.mark.parametrize("nodes", [2, 3])
def test_the_table_names_every_mode_in_80_columns(bench: ModuleType, nodes: int) -> None:
    text = bench.render(bench.summarise(nodes, 200, 3, *_runs(bench, nodes)))
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 80
    # one row per mode, payload and layout
    for mode in bench.MODES:
        rows = [x for x in lines if mode in x.split() and "ms" in x.split()]
        assert len(rows) == len(bench.PAYLOADS) * len(bench.LAYOUTS[nodes]), mode
    assert "driver CPU" in text and "x relay" in text
    if nodes == 2:
        assert "across nodes: producer on second, consumer on head" in text
        assert "relay: within one node against across nodes" in text
    else:
        assert "producer on second, consumer on third" in text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--items", "0"], "--items (0) and --repeat (3) must be at least 1"),
        (["--repeat", "0"], "--items (200) and --repeat (0) must be at least 1"),
        (["--nodes", "4"], "invalid choice: 4"),
    ],
)
def test_bad_arguments_exit_2_before_a_cluster_starts(
    bench: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    said: str,
) -> None:
    def no_cluster(count: int) -> None:
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(bench, "Nodes", no_cluster)
    with pytest.raises(SystemExit) as exit_:
        bench.main(args)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.slow
def test_a_tiny_run_on_three_nodes_writes_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["--nodes", "3", "--items", "4", "--repeat", "1", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "bench/cluster.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert (doc["nodes"], doc["items"], doc["repeat"]) == (3, 4, 1)
    for kind, modes in doc["results"]["across, via the driver's node"].items():
        assert list(modes) == ["relay", "relay-ref", "direct"], kind
        for mode, r in modes.items():
            assert r["ms_per_item"] > 0 and r["driver_cpu_ms_per_item"] >= 0, (kind, mode)
            assert len(r["runs_ms"]) == 1
    assert "producer on second, consumer on third" in done.stdout
