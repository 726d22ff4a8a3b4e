"""``omni-edge run`` under signals, a dead ledger, and output paths it cannot write.

The bar: a signal ends the run like Ctrl-C (close, record, one line, exit
128+N, no traceback, no Ray process left); a dead ledger is named and the
record still written; a path that cannot be written is refused before any
work, and a result that cannot be written at the end is kept elsewhere."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.cli import main
from orchestrator.runtime import audio as audio_mod
from orchestrator.runtime.runtime import Runtime
from tests.helpers import REPO
from tests.orchestrator.commands.test_run import write


def _run_until_text(args: list[str]) -> tuple[subprocess.Popen[str], list[str], list[int]]:
    """Start ``omni-edge run`` in a fresh interpreter; return once the reply has
    started streaming, with the lines read so far and the run's child processes
    (Ray's) at that moment."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert p.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "You said" not in seen:
        ch = p.stdout.read(1)  # the reply streams without a newline until it ends
        if not ch:
            break
        seen += ch
    assert "You said" in seen, seen
    lines = [seen]
    children = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
    return p, lines, children


def _gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [
            pid
            for pid in pids
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


@pytest.mark.ray
@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGTERM, id="SIGTERM"),
        pytest.param(signal.SIGHUP, id="SIGHUP", marks=pytest.mark.slow),
    ],
)
def test_a_signal_mid_request_closes_writes_the_record_and_exits_128_plus_n(
    tmp_path: Path, sig: int
) -> None:
    # One word a second: the request is still running when the signal comes.
    cfg, prof = write(tmp_path, thinker=", delay_s: 1.0")
    rec = tmp_path / "record.json"
    p, lines, children = _run_until_text(
        ["run", str(cfg), "--prompt", "hi", "--profile", str(prof), "--record", str(rec)]
    )
    assert children, "the run started a local Ray cluster"
    p.send_signal(sig)
    rest, _ = p.communicate(timeout=90)
    out = "".join(lines) + rest
    assert p.returncode == 128 + sig, out
    assert "Traceback" not in out and "*** SIG" not in out
    assert f"interrupted by {signal.Signals(sig).name}" in out
    doc = json.loads(rec.read_text())
    assert doc["error"]["type"] == "Interrupted" and doc["requests"] == []
    assert doc["ledger"]["held_bytes"] == 0  # the ledger after close: nothing leaked
    assert _gone(children, 30) == []


@pytest.mark.ray
def test_a_dead_ledger_is_named_and_the_record_is_still_written(
    ray_cluster: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    started = Runtime.start

    def start_then_kill_the_ledger(self: Runtime, *args: Any, **kwargs: Any) -> None:
        started(self, *args, **kwargs)
        ray.kill(self.ledger, no_restart=True)

    monkeypatch.setattr(Runtime, "start", start_then_kill_the_ledger)
    cfg, prof = write(tmp_path)
    rec = tmp_path / "record.json"
    rc = main(["run", str(cfg), "--prompt", "hi", "--profile", str(prof), "--record", str(rec)])
    captured = capsys.readouterr()
    assert rc == 4
    assert "ledger actor" in captured.err and "is gone" in captured.err
    assert "device actor for cpu" not in captured.err + captured.out  # not blamed on a device
    doc = json.loads(rec.read_text())
    assert doc["error"]["type"] == "LedgerLost" and doc["ledger_lost"]
    assert doc["requests"][0]["text"].startswith("You said hi.")  # the request itself succeeded


def test_out_and_record_paths_that_cannot_be_written_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*a: Any, **k: Any) -> None:
        raise AssertionError("planned or started despite an unwritable output path")

    monkeypatch.setattr("orchestrator.planner.plan_pipeline", never)
    cfg, prof = write(tmp_path)
    cases = [
        (["--out", "/proc/x/r.wav"], "--out /proc/x/r.wav"),
        (["--out", str(tmp_path / "no-such-dir" / "r.wav")], "does not exist"),
        (["--record", "/proc/x/r.json"], "--record /proc/x/r.json"),
        (["--record", "/proc/x/runs"], "--record"),
        (["--out", str(tmp_path)], "this is a directory"),
    ]
    for extra, expected in cases:
        rc = main(["run", str(cfg), "--prompt", "hi", "--profile", str(prof), *extra])
        err = capsys.readouterr().err
        assert rc == 2, (extra, err)
        assert expected in err and "how to fix" in err and "Traceback" not in err
    assert sorted(x.name for x in tmp_path.iterdir()) == [
        "echo.yaml",
        "profile.json",
    ]  # nothing written


@pytest.mark.ray
def test_audio_that_cannot_be_written_is_kept_and_named(
    ray_cluster: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = tmp_path / "reply.wav"

    def disk_full(self: Any, audio: Any) -> None:  # the disk fills while the reply is written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(audio_mod.WavStreamWriter, "write", disk_full)
    cfg, prof = write(tmp_path)
    rec = tmp_path / "record.json"
    rc = main(
        [
            "run",
            str(cfg),
            "--prompt",
            "hi",
            "--profile",
            str(prof),
            "--out",
            str(target),
            "--record",
            str(rec),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert (
        f"--out {target}" in err
        and "No space left on device" in err
        and "the audio is kept in" in err
    )
    kept = Path(err.split("the audio is kept in ")[1].split()[0])
    assert kept.exists() and audio_mod.read_wav(kept)[0].size > 0
    assert not target.exists() and list(tmp_path.glob("*.partial")) == []
    doc = json.loads(rec.read_text())
    assert doc["output"]["wav"] == str(kept)


def test_a_signal_before_the_pipeline_starts_exits_128_plus_n_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.commands.run import Interrupted

    def terminated(*a: Any, **k: Any) -> None:
        raise Interrupted(
            signal.SIGTERM
        )  # what the handler raises when SIGTERM lands while weights are prepared

    monkeypatch.setattr("orchestrator.api.prepare_models", terminated)
    cfg, prof = write(tmp_path)
    rc = main(
        [
            "run",
            str(cfg),
            "--prompt",
            "hi",
            "--profile",
            str(prof),
            "--record",
            str(tmp_path / "r.json"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 143
    assert "interrupted by SIGTERM before the pipeline started" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.ray
def test_a_signal_while_the_wav_is_being_written_leaves_nothing_at_out(tmp_path: Path) -> None:
    """The WAV grows under a temporary name while the reply is spoken; a SIGTERM
    then removes it: no half-written file at --out, no temporary file left."""
    cfg, prof = write(tmp_path, thinker=", delay_s: 0.5")
    wav = tmp_path / "reply.wav"
    p, lines, _ = _run_until_text(
        [
            "run",
            str(cfg),
            "--prompt",
            "hi",
            "--profile",
            str(prof),
            "--out",
            str(wav),
            "--record",
            str(tmp_path / "record.json"),
        ]
    )
    deadline = time.monotonic() + 60
    partials: list[Path] = []
    while not partials and time.monotonic() < deadline:
        partials = list(tmp_path.glob(".reply.wav.*.partial"))  # this writer's own name
        time.sleep(0.05)
    assert partials, "the first sentence's audio is written while the reply goes on"
    partial = partials[0]
    assert audio_mod.read_wav(partial)[0].size > 0  # a valid WAV already
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=90)
    assert p.returncode == 128 + signal.SIGTERM, "".join(lines) + rest
    assert not wav.exists() and not partial.exists()
    assert list(tmp_path.glob(".reply.wav*")) == []
