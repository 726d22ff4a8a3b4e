"""``omni-edge serve`` as a process: it binds first, stops on SIGTERM by draining
the requests in flight within ``--drain-timeout``, then closes the pipeline with
the ledger at zero and exits 0 (each test a fresh interpreter with its own Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.core.units import GiB
from tests.helpers import REPO
from tests.helpers.echo import REPLY
from tests.helpers.profiles import make_profile
from tests.helpers.serve import ServeProcess
from tests.helpers.waiting import NEVER_HANGS_S, wait_until

httpx = pytest.importorskip("httpx")

WORD_DELAY_S = 0.005
GATE = "last-word-may-go"
"""In the serve process's working directory: every reply holds its last word until the test
creates it (at most the echo kind's GATE_TIMEOUT_S), so a request is in flight for as long as
the test needs, whatever the machine's speed."""
ECHO = f"""name: echo-serve
stages:
  - {{name: thinker, kind: echo, mode: words, delay_s: {WORD_DELAY_S}, gate_file: {GATE},
     devices: [cpu], final_output: true, final_output_type: text}}
  - {{name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [cpu], final_output: true,
     final_output_type: audio}}
"""
LONG = " ".join(["word"] * 400)
"""A message the echo thinker repeats word by word (its last word held at the gate)."""


def _serve(tmp_path: Path, *args: str) -> ServeProcess:
    cfg = tmp_path / "echo.yaml"
    cfg.write_text(ECHO)
    prof = tmp_path / "profile.json"
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    return ServeProcess(cfg, "--profile", str(prof), *args, cwd=tmp_path, start_timeout_s=120)


class _Reader(threading.Thread):
    """A streamed chat request read to its end in a thread: its lines and its text."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.lines, self.started = url, [], threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST",
                f"{self.url}/v1/chat/completions",
                timeout=60,
                json={"messages": [{"role": "user", "content": LONG}], "stream": True},
            ) as r:
                for line in r.iter_lines():
                    if line:
                        self.lines.append(line)
                        if len(self.lines) == 3:
                            self.started.set()
        except BaseException as exc:  # a cut stream: what the test asserts on
            self.error = exc
        finally:
            self.started.set()

    @property
    def text(self) -> str:
        docs = [json.loads(x.removeprefix("data: ")) for x in self.lines if x.startswith("data: {")]
        return "".join(
            d["choices"][0]["delta"].get("content") or "" for d in docs if d.get("choices")
        )


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.TransportError:
        return True
    return False


@pytest.mark.ray
@pytest.mark.slow
def test_sigterm_lets_the_request_in_flight_finish_then_closes_with_the_ledger_at_zero(
    tmp_path: Path,
) -> None:
    serve = _serve(tmp_path, "--drain-timeout", str(2 * NEVER_HANGS_S))
    try:
        reader = _Reader(serve.url)
        reader.start()
        assert reader.started.wait(NEVER_HANGS_S) and reader.error is None
        serve.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        wait_until(lambda: _refused(serve.url), "serve refusing connections after SIGTERM")
        # held at the gate, the request is still in flight by construction
        assert reader.is_alive() and "data: [DONE]" not in reader.lines
        (tmp_path / GATE).touch()  # now it may finish, inside the drain
        reader.join(NEVER_HANGS_S)
        rc = serve.stop(timeout_s=60)
        stopped_s = time.monotonic() - signalled
    finally:
        serve.stop(signal.SIGKILL, timeout_s=30)
    assert reader.error is None and reader.lines[-1] == "data: [DONE]"
    assert reader.text == f"You said {LONG}. {REPLY}"
    assert rc == 0, serve.output()
    err = serve.output()
    assert "stopped by SIGTERM: closed the pipeline in" in err and "ledger holds 0 bytes" in err
    assert "host_ram: 0 bytes held" in err
    print(f"SIGTERM → request finished, pipeline closed, exit 0 in {stopped_s:.2f} s")


@pytest.mark.ray
@pytest.mark.slow
def test_the_drain_is_bounded_by_drain_timeout(tmp_path: Path) -> None:
    serve = _serve(tmp_path, "--drain-timeout", "0.5")
    try:
        reader = _Reader(serve.url)
        reader.start()
        assert reader.started.wait(NEVER_HANGS_S) and reader.error is None
        signalled = time.monotonic()
        serve.proc.send_signal(signal.SIGTERM)
        rc = serve.stop(timeout_s=60)
        stopped_s = time.monotonic() - signalled
        reader.join(NEVER_HANGS_S)
    finally:
        serve.stop(signal.SIGKILL, timeout_s=30)
    assert rc == 0, serve.output()
    # cut at the bound, not run to its end: the gate was never opened, so the reply could only
    # have ended by the gate timing out (GATE_TIMEOUT_S) had the drain waited for it
    assert "data: [DONE]" not in reader.lines
    assert not (tmp_path / GATE).exists()
    assert "ledger holds 0 bytes" in serve.output()
    print(f"SIGTERM with --drain-timeout 0.5 → exit 0 in {stopped_s:.2f} s")


def test_a_non_loopback_bind_without_a_key_is_refused_by_the_command(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMNI_EDGE_API_KEY"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            str(REPO / "configs/voice-assistant.yaml"),
            "--host",
            "0.0.0.0",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    assert "0.0.0.0 is not a loopback address" in done.stderr and "--api-key" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "serve",
                str(REPO / "configs/voice-assistant.yaml"),
                "--port",
                str(port),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot bind 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
