"""``omni-edge serve`` as a user runs it: a subprocess on a loopback port it picks itself.

:class:`ServeProcess` starts ``python -m orchestrator.cli serve CONFIG --port 0
ARGS...``, reads its stderr in a thread, learns the port from the line
``serving ... on http://127.0.0.1:PORT/v1`` and waits for ``/health`` (sent with
``headers``: a key); ``env`` is added to the process's environment; ``stop``
sends a signal and returns the exit code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SERVING = re.compile(r"serving .* on http://127\.0\.0\.1:(\d+)/v1")


class ServeProcess:
    def __init__(
        self,
        config: str | Path,
        *args: str,
        cwd: Path,
        start_timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        import httpx

        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "serve", str(config), "--port", "0", *args],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout_s
        self.url = ""
        while True:
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.output()}")
            assert time.monotonic() < deadline, (
                f"serve did not answer /health in {start_timeout_s:g} s:\n{self.output()}"
            )
            port = next((m.group(1) for m in map(SERVING.search, list(self.lines)) if m), None)
            if port is not None:
                self.url = f"http://127.0.0.1:{port}"
                try:
                    if (
                        httpx.get(f"{self.url}/health", headers=headers, timeout=2).status_code
                        == 200
                    ):
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def device_actors(self) -> list[int]:
        """The pids of the serve's device actors (Ray workers named ``ray::DeviceActor``, under
        the Ray its process started), oldest first."""
        return [p.pid for p in self._tree() if "DeviceActor" in _cmdline(p)]

    def route_workers(self) -> list[int]:
        """The pids of the route workers its device actors started (``python -I -c`` running
        ``omni_edge_route_worker``), oldest first."""
        return [p.pid for p in self._tree() if "omni_edge_route_worker" in _cmdline(p)]

    def _tree(self) -> list[Any]:
        import psutil

        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append((p.create_time(), p))
            except psutil.NoSuchProcess:
                continue
        return [p for _, p in sorted(alive, key=lambda tp: tp[0])]

    def output(self) -> str:
        return "\n".join(self.lines)[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int:
        """Send ``sig`` (unless it already exited) and wait; the exit code. Kills it past ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"serve did not exit within {timeout_s:g} s of {signal.Signals(sig).name}:\n"
                f"{self.output()}"
            ) from None
        self._reader.join(5)
        return rc


def _cmdline(p: Any) -> str:
    try:
        return " ".join(p.cmdline())
    except Exception:  # gone, or not ours to read
        return ""
