"""bench/durable_writes.py: each kind of write is timed durable and not, through the code a run
uses, and only the durable ones reach fsync (so the two columns measure what they say)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.bench import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("durable_writes")


def test_durable_writes_fsync_and_the_others_do_not(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    for name, make, module in (
        ("store", lambda: bench.store_writer(tmp_path / "s", 3), bench.calibration_store),
        ("record", lambda: bench.record_writer(tmp_path / "r"), bench.rec),
    ):
        write = make()
        monkeypatch.setattr(os, "fsync", fsync)
        for durable, expected in ((False, 0), (True, 2)):  # the file, then its directory
            synced.clear()
            undo = bench.with_durability(module, durable)
            try:
                write(7 + int(durable))
            finally:
                undo()
            assert len(synced) == expected, (name, durable, synced)
        monkeypatch.setattr(os, "fsync", real)


def test_the_report_has_both_writes_side_by_side(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "durable.json"
    assert (
        bench.main(["--writes", "3", "--samples", "5", "--dir", str(tmp_path), "--json", str(out)])
        == 0
    )
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"calibration store", "run record"}
    for r in doc["results"].values():
        assert r["durable"]["median_ms"] > 0 and r["not_durable"]["median_ms"] > 0
        assert r["ratio"] == round(r["durable"]["median_ms"] / r["not_durable"]["median_ms"], 2)
    assert doc["record_bytes"] >= bench.RECORD_BYTES
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2].startswith("durability adds") and printed[-1].startswith("durability adds")
    assert all(len(line) <= 80 for line in printed if str(tmp_path) not in line)
