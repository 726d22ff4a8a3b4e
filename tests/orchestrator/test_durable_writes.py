"""What a user keeps is flushed to the disk before it is renamed into place, and its directory
after: the measurement store, gate evidence, run records, `plan --out`, the `--out` WAV (the
export's artifact: tests/orchestrator/exporter/test_export_force.py). Caches that are cheap to rebuild
(graph statistics) are not. A power loss cannot be staged in a test; what is checked is
that each file and then its directory reach ``fsync``, in that order."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from orchestrator import calibration as cal
from orchestrator.cli import main
from orchestrator.core.units import GiB, MiB
from orchestrator.runtime import record as rec
from orchestrator.runtime.audio import WavStreamWriter
from orchestrator.verify.evidence import EvidenceStore
from stages.exported_graph.graph_stats import _memo_path, describe_graph
from tests.helpers.profiles import make_profile
from tests.orchestrator.verify.test_evidence import KEY, MEASUREMENT
from tests.stages.exported_graph.test_graph_stats_memo import big_graph

ECHO = """name: durable
stages:
  - {name: thinker, kind: echo, mode: words, devices: [cpu], final_output: true, final_output_type: text}
"""


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every file or directory ``os.fsync`` is called on, in order."""
    paths: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


def flushed(synced: list[str], target: Path, kind: str = "tmp") -> bool:
    """Whether ``target`` was written durably: its temporary file fsynced, then its directory."""
    tmp = re.compile(rf"^\.{re.escape(target.name)}\.{os.getpid()}\.[0-9a-f]{{8}}\.{kind}$")
    files = [
        i
        for i, s in enumerate(synced)
        if Path(s).parent == target.parent and tmp.match(Path(s).name)
    ]
    dirs = [i for i, s in enumerate(synced) if s == str(target.parent)]
    return bool(files and dirs and dirs[-1] > files[-1])


def _calibration(tmp_path: Path) -> Path:
    key = cal.Key("stage", {"kind": "echo"}, label="p-s")
    path = cal.CalibrationStore(tmp_path / "store").record(
        key, cal.sample(run="r", peak=100 * MiB, budget=None, calibrated=False, where="w")
    )
    assert path is not None
    return path


def _evidence(tmp_path: Path) -> Path:
    return EvidenceStore(tmp_path / "evidence").save(KEY, MEASUREMENT)


def _record(tmp_path: Path) -> Path:
    return rec.write({"pipeline": "p"}, tmp_path / "runs", request_id="run")


def _plan_out(tmp_path: Path) -> Path:
    cfg, prof, out = tmp_path / "p.yaml", tmp_path / "profile.json", tmp_path / "plan.json"
    cfg.write_text(ECHO)
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    assert main(["plan", str(cfg), "--profile", str(prof), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(
    "write",
    [_calibration, _evidence, _record, _plan_out],
    ids=["calibration store", "evidence", "run record", "plan --out"],
)
def test_what_a_user_keeps_is_fsynced_then_its_directory(
    tmp_path: Path,
    private_cache: Path,
    synced: list[str],
    write: Callable[[Path], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = write(tmp_path)
    assert target.is_file() and flushed(synced, target), synced


def test_the_wav_at_out_is_fsynced_then_its_directory(tmp_path: Path, synced: list[str]) -> None:
    target = tmp_path / "reply.wav"
    w = WavStreamWriter(target, 16000)
    w.write(np.zeros(160, dtype=np.float32))
    w.close()
    assert flushed(synced, target, "partial"), synced


def test_a_new_directory_is_fsynced_into_its_parent(tmp_path: Path, synced: list[str]) -> None:
    target = rec.write({"pipeline": "p"}, tmp_path / "a" / "b", request_id="run")
    assert str(tmp_path / "a") in synced and str(tmp_path) in synced  # b into a, a into tmp
    assert flushed(synced, target)


def test_a_cache_that_is_cheap_to_rebuild_is_not_fsynced(
    tmp_path: Path, private_cache: Path, synced: list[str]
) -> None:
    graph = big_graph(tmp_path / "g.onnx")
    describe_graph(graph)
    memo = _memo_path(graph.resolve())
    assert memo.is_file() and not any(str(memo.parent) in s for s in synced), synced
