"""What `omni-edge run` keeps, with real processes: two runs with the same `--out` never mix
their samples (the last to finish wins whole, and the other is told); two runs stopped at
once leave two records, each naming the signal that came; a signal while the stages load
closes the run as one during a reply does (exit 143, never SIGABRT).

The runs are ordered by construction, never by time: the echo kind's `gate_file` holds
each run's last item until the test opens its gate, `waiting_file` says it got there."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.units import GiB
from orchestrator.runtime import audio as audio_mod
from orchestrator.runtime import record as rec
from tests.helpers import REPO
from tests.helpers.echo import SAMPLE_RATE
from tests.helpers.profiles import make_profile

pytestmark = pytest.mark.ray

CONFIG = """name: keep
stages:
  - {{name: thinker, kind: echo, mode: words, devices: [cpu], final_output: true, final_output_type: text}}
  - {{name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [cpu], final_output: true, final_output_type: audio{voice}}}
"""
DEADLINE_S = 300.0
"""How long a state may take to come (two pipelines starting on a loaded 2-core machine)."""


class Run:
    """``omni-edge run`` in a fresh interpreter, its output read as it comes."""

    def __init__(
        self, tmp_path: Path, name: str, prompt: str, voice: str, *extra: str, command: str = "run"
    ) -> None:
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(CONFIG.format(voice=voice))
        prof = tmp_path / "profile.json"
        prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
        asked = ["--prompt", prompt] if command == "run" else []
        argv = [command, str(cfg), *asked, "--profile", str(prof), *extra]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", *argv],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.out = ""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in iter(lambda: self.proc.stdout.read(1), ""):  # type: ignore[union-attr]
            self.out += chunk

    def finish(self) -> int:
        try:
            code = self.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.reader.join(timeout=30)
        return code


def until(what: str, ready: Any, runs: list[Run]) -> None:
    """Poll for a state (never a sleep as synchronisation); fail with the runs' output."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if ready():
            return
        if any(r.proc.poll() is not None for r in runs):
            break
        time.sleep(0.05)
    for r in runs:
        if r.proc.poll() is None:
            r.proc.kill()
    pytest.fail(f"never came: {what}\n" + "\n----\n".join(r.out for r in runs))


def gated(tmp_path: Path, name: str) -> tuple[str, Path, Path]:
    gate, waiting = tmp_path / f"{name}.gate", tmp_path / f"{name}.waiting"
    return (
        f", gate_file: {gate}, waiting_file: {waiting}, gate_timeout_s: {DEADLINE_S}",
        gate,
        waiting,
    )


def wav_is_whole(path: Path) -> tuple[bool, int]:
    """Whether the WAV's header declares exactly the bytes it holds; its data bytes."""
    data = path.read_bytes()
    riff, declared = struct.unpack("<I", data[4:8])[0], struct.unpack("<I", data[40:44])[0]
    return riff == len(data) - 8 and declared == len(data) - 44, declared


def test_two_runs_with_the_same_out_never_mix_and_the_last_to_finish_wins_whole(
    tmp_path: Path,
) -> None:
    out = tmp_path / "reply.wav"
    voice_a, gate_a, waiting_a = gated(tmp_path, "a")
    voice_b, gate_b, waiting_b = gated(tmp_path, "b")
    records = ["--record", str(tmp_path / "runs")]
    a = Run(
        tmp_path,
        "a",
        "a much longer prompt than the other one",
        voice_a,
        "--out",
        str(out),
        *records,
    )
    b = Run(tmp_path, "b", "short", voice_b, "--out", str(out), *records)
    runs = [a, b]

    def both_writing() -> bool:
        partials = list(tmp_path.glob(".reply.wav.*.partial"))
        return (
            waiting_a.exists()
            and waiting_b.exists()
            and len(partials) == 2
            and all(p.stat().st_size > audio_mod.WAV_HEADER_BYTES for p in partials)
        )

    until("both runs writing their own partial file of reply.wav", both_writing, runs)
    gate_b.touch()  # b finishes first, while a is still writing
    assert b.finish() == 0, b.out
    assert "audio: " in b.out
    assert f"another process (pid {a.proc.pid}) is writing it too" in b.out, b.out
    whole_b, _ = wav_is_whole(out)
    b_sha = hashlib.sha256(out.read_bytes()).hexdigest()
    gate_a.touch()
    assert a.finish() == 0, a.out
    assert "another process" not in a.out
    whole, declared = wav_is_whole(out)
    assert whole_b and whole, "a header that does not declare what the file holds"
    a_record = json.loads(Path(a.out.split("record: ")[-1].split()[0]).read_text())
    b_record = json.loads(Path(b.out.split("record: ")[-1].split()[0]).read_text())
    # the file at --out is a's, whole: the bytes its record names, its own samples only
    final = out.read_bytes()
    assert a_record["output"]["wav_sha256"] == hashlib.sha256(final).hexdigest()
    assert a_record["output"]["wav_bytes"] == len(final)
    assert abs(declared / 2 / SAMPLE_RATE - a_record["requests"][0]["audio_seconds"]) < 0.01
    # b's record names what b wrote (replaced since), and who was still writing
    assert b_record["output"]["wav_sha256"] == b_sha != a_record["output"]["wav_sha256"]
    assert b_record["output"]["wav_others_writing"] == [a.proc.pid]
    assert list(tmp_path.glob(".reply.wav*")) == []  # no partial file left


def test_two_runs_stopped_while_loading_leave_two_records_each_naming_sigterm(
    tmp_path: Path,
) -> None:
    records = tmp_path / "runs"
    loading = ", load_s: 600"  # the voice's load outlasts the test: the signal lands in it
    runs = [
        Run(tmp_path, "one", "hi", loading, "--record", str(records)),
        Run(tmp_path, "two", "hi", loading, "--record", str(records)),
    ]
    # the thinker loaded, the voice loading: the driver waits in Ray for the voice's load,
    # where Ray's signal check used to turn the SIGTERM into a bare KeyboardInterrupt
    until(
        "both runs loading their voice after their thinker",
        lambda: all("voice: loading" in r.out and "thinker: loaded" in r.out for r in runs),
        runs,
    )
    for r in runs:  # both stopped at once: their records are named in the same second
        r.proc.send_signal(signal.SIGTERM)
    codes = [r.finish() for r in runs]
    for r, code in zip(runs, codes, strict=True):
        assert code == 128 + signal.SIGTERM, r.out  # not 130 (SIGINT), not -6 (SIGABRT)
        assert "interrupted by SIGTERM: closed the pipeline" in r.out
        assert "Traceback" not in r.out and "Exception ignored" not in r.out
    written = sorted(records.glob("*.json"))
    assert len(written) == 2, [p.name for p in written]
    said = {r.out.split("record: ")[-1].split()[0] for r in runs}
    assert said == {str(p) for p in written}  # each run names its own record
    for path in written:
        error = json.loads(path.read_text())["error"]
        assert error == {
            "type": "Interrupted",
            "message": "interrupted by SIGTERM",
            "signal": "SIGTERM",
        }


@pytest.mark.parametrize(("command", "extra"), [("serve", ("--port", "0")), ("chat", ())])
def test_serve_and_chat_stopped_while_loading_exit_143_naming_sigterm(
    tmp_path: Path, command: str, extra: tuple[str, ...]
) -> None:
    r = Run(tmp_path, command, "", ", load_s: 600", *extra, command=command)
    until(
        f"{command} loading its voice after its thinker",
        lambda: "voice: loading" in r.out and "thinker: loaded" in r.out,
        [r],
    )
    r.proc.send_signal(signal.SIGTERM)
    assert r.finish() == 128 + signal.SIGTERM, r.out  # not 130: the signal that came
    assert "interrupted by SIGTERM" in r.out and "Traceback" not in r.out


def test_records_filed_in_one_second_under_one_name_never_replace_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rec.time, "strftime", lambda fmt, *a: "20250101-000000")
    paths = [rec.write({"pipeline": "p", "n": i}, tmp_path, request_id="run") for i in range(3)]
    assert [p.name for p in paths] == [
        "p-20250101-000000-run.json",
        "p-20250101-000000-run-2.json",
        "p-20250101-000000-run-3.json",
    ]
    assert [json.loads(p.read_text())["n"] for p in paths] == [0, 1, 2]


WRITER = """
import sys, numpy as np
from orchestrator.runtime.audio import WavStreamWriter
w = WavStreamWriter(sys.argv[1], 16000)
w.write(np.zeros(1600, dtype=np.float32))
print(w.partial, flush=True)
sys.stdin.read()
"""


def test_a_partial_wav_whose_writer_was_killed_is_removed_by_the_next_writer(
    tmp_path: Path,
) -> None:
    target = tmp_path / "reply.wav"
    other = tmp_path / ".notes.txt.123.0123abcd.partial"  # another target's: not this writer's
    other.write_bytes(b"x")
    killed = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert killed.stdout is not None
    left = Path(killed.stdout.readline().strip())
    alive = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert alive.stdout is not None
    writing = Path(alive.stdout.readline().strip())
    killed.kill()
    killed.wait(timeout=30)
    try:
        assert left.exists() and writing.exists()
        w = audio_mod.WavStreamWriter(target, 16000)  # the next writer of reply.wav
        assert not left.exists()  # its writer is gone
        assert writing.exists() and other.exists()  # a live writer's, another target's
        w.write(audio_mod.np.zeros(160, dtype=audio_mod.np.float32))
        assert w.close() == target and w.others_writing == [alive.pid]
    finally:
        alive.communicate("", timeout=30)


def test_a_symlink_planted_where_the_partial_file_goes_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    target = tmp_path / "reply.wav"
    # the name a writer used to take, and the name this one will take (its random part fixed)
    (tmp_path / ".reply.wav.partial").symlink_to(victim)
    monkeypatch.setattr("orchestrator.core.fileio.secrets.token_hex", lambda n: "0123abcd")
    planted = tmp_path / f".reply.wav.{os.getpid()}.0123abcd.partial"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        audio_mod.WavStreamWriter(target, 16000)
    assert victim.read_text() == "keep me\n" and not target.exists()
    planted.unlink()
    w = audio_mod.WavStreamWriter(target, 16000)
    w.write(audio_mod.np.zeros(160, dtype=audio_mod.np.float32))
    w.close()
    assert victim.read_text() == "keep me\n" and audio_mod.read_wav(target)[0].size == 160
