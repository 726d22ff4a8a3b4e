"""The cache directory follows each platform's convention, and exclusive_lock works
on POSIX (flock, for real) and on Windows (msvcrt.locking, through a stand-in).

There is no Windows here: the Windows lock is exercised with a fake ``msvcrt``
that keeps byte-range locks per file the way the C runtime does (a second
``LK_NBLCK`` on a locked byte fails with ``OSError``; ``LK_UNLCK`` frees it) —
it checks the branch's logic (seek to byte 0, retry while held, unlock on
exit), not Windows itself.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.core import fileio, settings
from orchestrator.core.fileio import exclusive_lock
from orchestrator.core.settings import cache_root, default_cache_root
from tests.helpers.waiting import NEVER_HANGS_S, wait_until

HOME = Path("/home/me")


def test_linux_follows_xdg_cache_home_when_absolute() -> None:
    assert default_cache_root("linux", {}, HOME) == HOME / ".cache" / "omni-edge"
    assert default_cache_root("linux", {"XDG_CACHE_HOME": "/var/cache/me"}, HOME) == Path(
        "/var/cache/me/omni-edge"
    )
    # the XDG spec: a relative value is invalid and ignored
    assert (
        default_cache_root("linux", {"XDG_CACHE_HOME": "rel/cache"}, HOME)
        == HOME / ".cache" / "omni-edge"
    )


def test_windows_uses_localappdata_and_macos_library_caches() -> None:
    win = default_cache_root("win32", {"LOCALAPPDATA": r"C:\Users\me\AppData\Local"}, HOME)
    assert win.parts[-2:] == ("omni-edge", "cache") and str(win).startswith(
        r"C:\Users\me\AppData\Local"
    )
    assert (
        default_cache_root("win32", {}, HOME) == HOME / "AppData" / "Local" / "omni-edge" / "cache"
    )
    assert (
        default_cache_root("darwin", {"XDG_CACHE_HOME": "/x"}, HOME)
        == HOME / "Library" / "Caches" / "omni-edge"
    )


def test_the_env_override_wins_and_the_default_is_this_platforms(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(settings.CACHE_ENV, str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv(settings.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = (
        tmp_path / "xdg" / "omni-edge" if sys.platform.startswith("linux") else default_cache_root()
    )
    assert cache_root() == expected


class FakeMsvcrt:
    """``msvcrt.locking`` as the C runtime documents it, for one machine's open files:
    locks are byte ranges of a file (keyed by inode), held by a descriptor."""

    LK_UNLCK, LK_LOCK, LK_NBLCK = 0, 1, 2

    def __init__(self) -> None:
        self.held: dict[tuple[int, int], int] = {}
        self.guard = threading.Lock()
        self.refusals = 0
        self.offsets: list[int] = []

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        offset = os.lseek(fd, 0, os.SEEK_CUR)
        self.offsets.append(offset)
        key = (os.fstat(fd).st_ino, offset)
        with self.guard:
            if mode == self.LK_UNLCK:
                if self.held.get(key) != fd:
                    raise OSError(errno.EACCES, "unlocking a byte this descriptor does not hold")
                del self.held[key]
            elif mode == self.LK_NBLCK:
                if key in self.held:
                    self.refusals += 1
                    raise OSError(errno.EACCES, "Permission denied")
                self.held[key] = fd
            else:
                raise AssertionError(f"mode {mode} not expected")


def test_windows_branch_waits_for_the_holder_and_unlocks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeMsvcrt()
    monkeypatch.setattr(fileio, "fcntl", None)
    monkeypatch.setattr(fileio, "msvcrt", fake)
    monkeypatch.setattr(fileio, "LOCK_RETRY_S", 0.01)
    lock = tmp_path / ".lock"
    events: list[str] = []
    inside = threading.Event()

    def holder() -> None:
        with exclusive_lock(lock):
            events.append("a in")
            inside.set()
            # a holds on until b has been refused at least once: b tried while a held it
            wait_until(lambda: fake.refusals >= 1, "b refused while a holds the lock")
            events.append("a out")

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(NEVER_HANGS_S)
    with exclusive_lock(lock):
        events.append("b in")
    t.join(NEVER_HANGS_S)
    assert events == ["a in", "a out", "b in"]
    assert fake.refusals >= 1  # b was refused while a held it, and retried
    assert fake.held == {} and set(fake.offsets) == {0}


def _blocked_on(path: Path, pid: int) -> bool:
    """Whether process ``pid`` waits for a lock on ``path`` (a ``->`` line of /proc/locks)."""
    inode = f":{path.stat().st_ino} "
    return any(
        line.split()[1] == "->" and line.split()[5] == str(pid) and inode in line
        for line in Path("/proc/locks").read_text().splitlines()
    )


def test_posix_flock_excludes_another_process(tmp_path: Path) -> None:
    if fileio.fcntl is None:
        pytest.skip("platform: no fcntl on this platform")
    if not Path("/proc/locks").is_file():
        pytest.skip("platform: no /proc/locks on this platform (it shows the waiter blocked)")
    lock, release, out = tmp_path / ".lock", tmp_path / "release", tmp_path / "child-out"
    # the child holds the lock until ``release`` exists and notes ``out`` just before it lets go
    code = (
        "import pathlib, time; from orchestrator.core.fileio import exclusive_lock\n"
        f"with exclusive_lock({str(lock)!r}):\n"
        "    print('in', flush=True)\n"
        f"    while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.01)\n"
        f"    pathlib.Path({str(out)!r}).touch()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    entered: list[bool] = []  # whether the child had let go when this process got in

    def take() -> None:
        with exclusive_lock(lock):
            entered.append(out.exists())

    taker = threading.Thread(target=take)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "in"
        taker.start()
        wait_until(lambda: _blocked_on(lock, os.getpid()), "this process blocked on the lock")
        assert entered == []  # blocked, not in
        release.touch()
        taker.join(NEVER_HANGS_S)
    finally:
        release.touch()
        child.wait(NEVER_HANGS_S)
    assert entered == [True]  # in only once the child had let go
