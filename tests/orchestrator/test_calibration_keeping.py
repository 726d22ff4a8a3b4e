"""The measurement store keeps what it holds: `reset --all` removes only entries, and asks
first; an entry it cannot read is kept aside, never written over; an entry of a newer
format is left as it is; the plan says what happened; what a killed writer left is
removed when the store is next opened (a real process, SIGKILLed mid-rewrite)."""

from __future__ import annotations

import json
import logging
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import calibration as cal
from orchestrator.cli import main
from orchestrator.config import parse_config
from orchestrator.core.ledger import Reservation
from orchestrator.core.profile import HardwareProfile
from orchestrator.core.units import GiB, MiB
from orchestrator.planner import Candidate, candidate_key, plan_pipeline, stage_candidates
from stages.registry import get_kind
from tests.helpers import REPO
from tests.helpers.profiles import make_profile

ECHO = {
    "name": "keep",
    "stages": [
        {"name": "thinker", "kind": "echo", "mode": "words", "devices": ["cpu"]},
        {
            "name": "voice",
            "kind": "echo",
            "mode": "tone",
            "inputs": ["thinker"],
            "devices": ["cpu"],
            "final_output": True,
            "final_output_type": "audio",
        },
    ],
}


def key(label: str = "p-thinker") -> cal.Key:
    return cal.Key("stage", {"kind": "echo", "device": "cpu"}, label=label, pipeline="p")


def sample(run: str, peak: int = 100 * MiB) -> dict:
    return cal.sample(run=run, peak=peak, budget=None, calibrated=False, where="test:cpu")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["calibration", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def others(root: Path) -> dict[str, bytes]:
    """A directory of files that are not calibration entries (a mistyped store)."""
    files = {
        "package.json": b'{"name": "thesis"}\n',
        "tsconfig.json": b'{"compilerOptions": {}}\n',
        "notes-0123456789abcdef.json": b'{"format": "someone-else/1"}\n',  # an entry's name only
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


# -- reset --all -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["--store", "$OMNI_EDGE_CALIBRATION_DIR"])
def test_reset_all_removes_only_entries_and_names_what_it_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    root = tmp_path / "project"
    kept = others(root)
    entry = cal.CalibrationStore(root).record(key(), sample("r1"))
    assert entry is not None
    where = ["--store", str(root)] if how == "--store" else []
    if how != "--store":
        monkeypatch.setenv(cal.CALIBRATION_ENV, str(root))
    code, out, _ = cli(capsys, *where, "reset", "--all", "--yes")
    assert code == 0
    assert out.splitlines()[0] == f"removed 1 entry (every entry) from {root}"
    assert f"  {entry.name}" in out.splitlines()
    assert "  package.json (not an entry)" in out.splitlines()
    assert "  notes-0123456789abcdef.json (an entry's name, not its format)" in out.splitlines()
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.name != ".lock"} == kept
    code, out, _ = cli(capsys, *where, "reset", "--all", "--yes", "--json")
    doc = json.loads(out)
    assert doc["removed"] == [] and {Path(x["file"]).name for x in doc["left"]} == set(kept)


def test_reset_all_without_a_terminal_and_without_yes_exits_2_and_removes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = cal.CalibrationStore(tmp_path / "store")
    paths = [store.record(key(f"p-s{i}"), sample("r1")) for i in range(2)]
    code, out, err = cli(capsys, "--store", str(store.root), "reset", "--all")
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0] == "error: the input cannot be used:"
    assert "would remove 2 entries from" in lines[1] and "stdin is not a terminal" in lines[1]
    assert "pass --yes" in lines[2] and "omni-edge calibration reset --all --yes" in lines[2]
    assert all(p is not None and p.exists() for p in paths)


def _answer(root: Path, reply: str) -> tuple[int, str]:
    """`omni-edge calibration reset --all` in a real process on a terminal (a pty): what it
    printed until it asked, then ``reply`` typed; its exit code and all it printed."""
    parent, child = pty.openpty()
    argv = ["calibration", "--store", str(root), "reset", "--all"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *argv],
        cwd=REPO,
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "COLUMNS": "80"},
    )
    os.close(child)
    seen = b""
    deadline = time.monotonic() + 120
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([parent], [], [], 1.0)
        if ready:
            try:
                seen += os.read(parent, 4096)
            except OSError:
                break
    asked = b"[y/N]" in seen
    if asked:
        os.write(parent, reply.encode() + b"\n")
    while True:  # the rest, until the process closes the terminal
        ready, _, _ = select.select([parent], [], [], 60.0)
        if not ready:
            break
        try:
            chunk = os.read(parent, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    code = proc.wait(timeout=60)
    os.close(parent)
    assert asked, seen.decode(errors="replace")
    return code, seen.decode(errors="replace").replace("\r\n", "\n")


def test_reset_all_on_a_terminal_lists_what_will_go_and_asks_first(tmp_path: Path) -> None:
    root = tmp_path / "store"
    others(root)
    entry = cal.CalibrationStore(root).record(key(), sample("r1"))
    assert entry is not None
    code, said = _answer(root, "n")
    assert code == 0
    assert f"this removes 1 entry from {root}:\n  {entry.name}\n" in said
    assert "  package.json (not an entry)" in said and "nothing removed" in said
    assert entry.exists()
    code, said = _answer(root, "y")
    assert code == 0 and f"removed 1 entry (every entry) from {root}" in said
    assert not entry.exists() and (root / "package.json").exists()


# -- entries that cannot be used ------------------------------------------------------------


def test_a_truncated_entry_is_kept_aside_with_its_history_and_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = cal.CalibrationStore(tmp_path / "store")
    k = key()
    for i in range(14):
        path = store.record(k, sample(f"r{i}", (100 + i) * MiB))
    assert path is not None
    cut = path.read_bytes()[:3000]  # a crash left the first 3000 bytes of 14 samples
    path.write_bytes(cut)
    fresh = cal.CalibrationStore(store.root)
    with caplog.at_level(logging.WARNING, logger="orchestrator.calibration"):
        assert fresh.record(k, sample("next", 200 * MiB)) == path
    aside = sorted(store.root.glob(f"{path.name}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == cut  # the history, byte for byte
    warning = next(r.getMessage() for r in caplog.records if "kept aside" in r.getMessage())
    assert str(path) in warning and aside[0].name in warning
    assert "repair it and move it back over" in warning  # the remedy
    entry = cal.CalibrationStore(store.root).load(k)
    assert entry is not None and [s["run"] for s in entry.samples] == ["next"]
    # a second damaged entry in the same second does not replace the first one kept aside
    path.write_bytes(b"{")
    cal.CalibrationStore(store.root).record(k, sample("again"))
    kept = sorted(p.read_bytes() for p in store.root.glob(f"{path.name}.corrupt-*"))
    assert kept == sorted([cut, b"{"])


def test_an_entry_that_cannot_be_read_eio_is_kept_aside_not_written_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # reading /proc/self/mem at offset 0 fails with EIO (for root too): a real read error
    store = cal.CalibrationStore(tmp_path / "store")
    k = key()
    store.root.mkdir()
    store.path(k).symlink_to("/proc/self/mem")
    with caplog.at_level(logging.WARNING, logger="orchestrator.calibration"):
        assert store.record(k, sample("r1")) == store.path(k)
    aside = list(store.root.glob(f"{store.path(k).name}.corrupt-*"))
    assert len(aside) == 1 and os.readlink(aside[0]) == "/proc/self/mem"
    assert any("Input/output error" in r.getMessage() for r in caplog.records)
    entry = cal.CalibrationStore(store.root).load(k)
    assert entry is not None and [s["run"] for s in entry.samples] == ["r1"]


def _newer(path: Path) -> bytes:
    doc = json.loads(path.read_text())
    doc["format"] = "omni-edge.calibration/2"
    doc["samples"] = [{"shape": "of a later version"}] * 14
    path.write_text(json.dumps(doc))
    return path.read_bytes()


def test_an_entry_of_a_newer_format_is_never_written_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = cal.CalibrationStore(tmp_path / "store")
    k = key()
    path = store.record(k, sample("r1"))
    assert path is not None
    newer = _newer(path)
    fresh = cal.CalibrationStore(store.root)
    with caplog.at_level(logging.WARNING, logger="orchestrator.calibration"):
        assert fresh.record(k, sample("r2")) is None  # nothing recorded
    assert path.read_bytes() == newer and not list(store.root.glob("*.corrupt-*"))
    assert fresh.load(k) is None and fresh.unusable[path].kind == "newer"
    assert any(
        "not recording" in r.getMessage() and "newer format" in r.getMessage()
        for r in caplog.records
    )


def _plan_keys(store: cal.CalibrationStore, profile: HardwareProfile) -> dict[str, cal.Key]:
    """Each echo stage's measurement recorded under the key its placement plans with."""
    config = parse_config(ECHO, where="keep.yaml", base_dir=REPO)
    keys = {}
    for stage in config.stages:
        kind = get_kind(stage.kind)
        info = kind.describe(stage)
        cand = next(
            c
            for c in stage_candidates(stage, kind, info, profile, frozenset())
            if isinstance(c, Candidate)
        )
        metadata = kind.reservations(stage, info, cand.device, cand.backend, cand.device.pool)
        keys[stage.name] = candidate_key(cand, metadata, profile, config.name)
        store.record(keys[stage.name], sample("recorded", 200 * MiB), metadata)
    return keys


@pytest.mark.parametrize("damage", ["truncated", "newer"])
def test_the_plan_says_what_happened_to_an_entry_it_could_not_use(
    tmp_path: Path, private_cache: Path, damage: str
) -> None:
    profile = make_profile(ram_available=8 * GiB)
    store = cal.CalibrationStore(tmp_path / "store")
    keys = _plan_keys(store, profile)
    path = store.path(keys["thinker"])
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:
        _newer(path)
    plan = plan_pipeline(
        parse_config(ECHO, where="keep.yaml", base_dir=REPO),
        profile,
        calibration=cal.CalibrationStore(store.root),
    )
    assert plan.admitted and plan.stage("voice").calibration is not None
    assert plan.stage("thinker").calibration is None
    said = next(n for n in plan.notes if n.startswith("thinker: its measurements"))
    assert path.name in said
    if damage == "truncated":
        assert "could not be used (unreadable" in said and f"{path.name}.corrupt-<time>" in said
    else:
        assert "newer format" in said and "leave that entry as it is" in said
    assert not any("no measurement yet" in n for n in plan.notes)


def test_a_stage_with_no_entry_is_still_said_to_have_no_measurement_yet(
    tmp_path: Path, private_cache: Path
) -> None:
    profile = make_profile(ram_available=8 * GiB)
    store = cal.CalibrationStore(tmp_path / "store")
    keys = _plan_keys(store, profile)
    store.path(keys["thinker"]).unlink()
    plan = plan_pipeline(
        parse_config(ECHO, where="keep.yaml", base_dir=REPO),
        profile,
        calibration=cal.CalibrationStore(store.root),
    )
    assert any(n.startswith("thinker: no measurement yet") for n in plan.notes), plan.notes


# -- what a killed writer leaves -------------------------------------------------------------

REWRITER = """
import sys
from pathlib import Path
from orchestrator import calibration as cal
from orchestrator.core.ledger import Reservation
root = Path(sys.argv[1])
store = cal.CalibrationStore(root)
key = cal.Key("stage", {"kind": "echo"}, label="big")
# a 5 MB entry: its basis notes are long, so each rewrite takes a while
basis = [Reservation("host_ram", f"part{i}", 1 << 20, "session", "E", "x" * 50_000) for i in range(100)]
for i in range(10_000):
    store.record(key, cal.sample(run=f"r{i}", peak=1 << 30, budget=None, calibrated=False, where="w"), basis)
    if i == 0:
        print("written", flush=True)
"""


def _kill_mid_rewrite(root: Path) -> list[Path]:
    """Start a process rewriting a 5 MB entry over and over, SIGKILL it while a temporary file
    of its is on disk, and return the temporary files it left (tries again when the kill
    landed between two rewrites)."""
    for _ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", REWRITER, str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline() == "written\n"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(root.glob(".*.tmp")):
            pass  # poll for the state: a rewrite in progress
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        left = list(root.glob(".*.tmp"))
        if left:
            return left
    raise AssertionError("no kill landed during a rewrite in 20 tries")


def test_a_writer_killed_mid_rewrite_leaves_a_whole_entry_and_its_temporary_file_goes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    left = _kill_mid_rewrite(root)
    assert all(p.name.startswith(".big-") and p.name.endswith(".tmp") for p in left)
    store = cal.CalibrationStore(root)  # opening it removes what the killed writer left
    assert not any(p.exists() for p in left)
    assert sorted(p.name for p in store.orphans_removed) == sorted(p.name for p in left)
    entries, bad = store.entries()
    assert bad == [] and len(entries) == 1 and entries[0].samples  # the entry is whole
    assert len(entries[0].basis) == 100 and isinstance(entries[0].basis[0], Reservation)


def test_a_temporary_file_whose_writer_is_alive_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    # a writer that is alive (this process) and one that holds its file locked (a writer in
    # another PID namespace: its process id means nothing here)
    mine = root / f".e.json.{os.getpid()}.0123abcd.tmp"
    mine.write_bytes(b"x")
    held = root / ".e.json.999999999.0123abcd.tmp"  # above any pid_max: no such process here
    held.write_bytes(b"y")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(held),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline() == "held\n"
        store = cal.CalibrationStore(root)
        assert store.orphans_removed == [] and mine.exists() and held.exists()
    finally:
        holder.communicate("", timeout=30)
    # once nothing holds it and no process has its id, it goes
    assert cal.CalibrationStore(root).orphans_removed == [held]
    assert mine.exists() and not held.exists()
