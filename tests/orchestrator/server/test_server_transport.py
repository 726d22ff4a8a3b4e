"""``omni-edge serve`` against a hostile client: a real serve process on loopback
(the echo kinds: words → tone), driven with raw sockets and ``httpx``.

* a web page's requests: a foreign ``Host`` (DNS rebinding) and a foreign
  ``Origin`` are refused, a ``text/plain`` body is 415, and every response
  carries the security headers (``orchestrator/server/guard.py``);
* connections without end (``orchestrator/server/transport.py``): 2,000 idle
  sockets cannot lock out ``/health`` and are closed; a half-sent request and a
  stalled body are closed after their timeouts; a client that stops reading an
  SSE stream loses its connection after ``--write-timeout`` and its request
  leaves the admission queue;
* the API key from ``$OMNI_EDGE_API_KEY`` or ``--api-key-file``, never in a
  child process's environment; ``--api-key`` warns that ``ps`` shows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.units import GiB
from tests.helpers import REPO
from tests.helpers.profiles import make_profile
from tests.helpers.serve import ServeProcess
from tests.helpers.waiting import LOOP_CLOCK_S, NEVER_HANGS_S, wait_until

httpx = pytest.importorskip("httpx")

HEADER_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 2.0
WRITE_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 300
IDLE_SOCKETS = 2000
SENTENCES = 600
"""The stalled stream's prompt: each sentence becomes ~0.3 s of audio at 24 kHz, ~19 KB of base64 in
its own SSE event, so the reply is ~11 MB: more than any socket buffer holds, whatever the CPU."""
ECHO = """name: echo-transport
stages:
  - {name: thinker, kind: echo, mode: words, delay_s: 0.001, devices: [cpu], final_output: true,
     final_output_type: text}
  - {name: voice, kind: echo, mode: tone, delay_s: 0.01, inputs: [thinker], devices: [cpu], final_output: true,
     final_output_type: audio}
"""
LIMITS = (
    "--header-timeout",
    str(HEADER_TIMEOUT_S),
    "--read-timeout",
    str(READ_TIMEOUT_S),
    "--write-timeout",
    str(WRITE_TIMEOUT_S),
    "--max-connections",
    str(MAX_CONNECTIONS),
)
SECURITY = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _serve(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, key: str | None = None
) -> ServeProcess:
    cfg = tmp_path / "echo.yaml"
    cfg.write_text(ECHO)
    prof = tmp_path / "profile.json"
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    return ServeProcess(
        cfg,
        "--profile",
        str(prof),
        *args,
        cwd=tmp_path,
        start_timeout_s=120,
        env=env,
        headers={"Authorization": f"Bearer {key}"} if key else None,
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    serve = _serve(tmp_path_factory.mktemp("transport"), *LIMITS)
    try:
        yield serve
    finally:
        assert serve.stop(timeout_s=60) == 0, serve.output()


def _port(serve: ServeProcess) -> int:
    return int(serve.url.rsplit(":", 1)[1])


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (end of stream or reset), without waiting."""
    try:
        return sock.recv(65536, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _closed_within(sock: socket.socket, seconds: float, since: float | None = None) -> float | None:
    """Seconds from ``since`` (a ``time.monotonic()`` reading; now by default) until the server
    closed ``sock``, reading what it sends; None if still open ``seconds`` after ``since``."""
    t0 = time.monotonic() if since is None else since
    sock.settimeout(0.2)
    while time.monotonic() - t0 < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def _in_flight(serve: ServeProcess) -> int:
    return int(httpx.get(f"{serve.url}/v1/status", timeout=10).json()["queue"]["in_flight"])


# ------------------------------------------------------------------------- a page on another site


@pytest.mark.ray
@pytest.mark.slow
def test_a_foreign_host_is_refused_and_loopback_names_are_served(served: ServeProcess) -> None:
    port = _port(served)
    for host in (
        "attacker.example",
        f"attacker.example:{port}",
        "127.attacker.example",
        f"10.0.0.1:{port}",
    ):
        r = httpx.get(f"{served.url}/v1/plan", headers={"Host": host}, timeout=10)
        assert r.status_code == 403, (host, r.status_code, r.text)
        assert (
            r.json()["error"]["code"] == "host_not_allowed" and r.json()["error"]["param"] == "Host"
        )
        assert "--allowed-host" in r.json()["error"]["message"]
        assert "pipeline" not in r.text.replace("the pipeline", "")  # nothing of the plan leaks
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        "localhost",
        f"[::1]:{port}",
        f"127.0.0.2:{port}",
    ):
        assert (
            httpx.get(f"{served.url}/health", headers={"Host": host}, timeout=10).status_code == 200
        ), host
    r = httpx.post(
        f"{served.url}/v1/chat/completions",
        headers={"Host": f"rebound.example:{port}"},
        timeout=10,
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"


@pytest.mark.ray
@pytest.mark.slow
def test_a_foreign_origin_is_refused_and_the_page_own_origin_is_served(
    served: ServeProcess,
) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for origin in (
        "http://attacker.example",
        "null",
        f"http://localhost:{_port(served) + 1}",
        "https://127.0.0.1",
    ):
        r = httpx.post(
            f"{served.url}/v1/chat/completions", headers={"Origin": origin}, json=chat, timeout=10
        )
        assert r.status_code == 403, (origin, r.status_code, r.text)
        assert (
            r.json()["error"]["code"] == "origin_not_allowed"
            and r.json()["error"]["param"] == "Origin"
        )
        assert (
            httpx.get(f"{served.url}/metrics", headers={"Origin": origin}, timeout=10).status_code
            == 403
        )
    r = httpx.post(
        f"{served.url}/v1/chat/completions", headers={"Origin": served.url}, json=chat, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("You said hi.")


@pytest.mark.ray
@pytest.mark.slow
def test_a_body_that_is_not_declared_json_is_415(served: ServeProcess) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    for ctype in (
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ):
        headers = {"Content-Type": ctype} if ctype else {}
        r = httpx.post(
            f"{served.url}/v1/chat/completions", content=body, headers=headers, timeout=10
        )
        assert r.status_code == 415, (ctype, r.status_code, r.text)
        assert (
            r.json()["error"]["code"] == "unsupported_media_type"
            and "application/json" in r.json()["error"]["message"]
        )
    r = httpx.post(
        f"{served.url}/v1/audio/speech",
        content=json.dumps({"input": "hi"}),
        headers={"Content-Type": "text/plain"},
        timeout=10,
    )
    assert r.status_code == 415
    r = httpx.post(
        f"{served.url}/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json; charset=utf-8"},
        timeout=30,
    )
    assert r.status_code == 200, r.text


@pytest.mark.ray
@pytest.mark.slow
def test_every_response_carries_the_security_headers(served: ServeProcess) -> None:
    responses = {
        "page": httpx.get(f"{served.url}/", timeout=10),
        "script": httpx.get(f"{served.url}/static/app.js", timeout=10),
        "health": httpx.get(f"{served.url}/health", timeout=10),
        "404": httpx.get(f"{served.url}/nothing", timeout=10),
        "403": httpx.get(f"{served.url}/health", headers={"Host": "attacker.example"}, timeout=10),
        "415": httpx.post(f"{served.url}/v1/chat/completions", content="{}", timeout=10),
    }
    assert responses["page"].status_code == 200 and responses["script"].status_code == 200
    for name, r in responses.items():
        for header, value in SECURITY.items():
            assert r.headers.get(header) == value, (name, header, dict(r.headers))
        csp = r.headers.get("content-security-policy", "")
        assert (
            "frame-ancestors 'none'" in csp
            and "script-src 'self'" in csp
            and "default-src 'none'" in csp
        ), name


# ------------------------------------------------------------------------- connections without end


@contextlib.contextmanager
def _idle_sockets(port: int) -> Iterator[list[socket.socket]]:
    """IDLE_SOCKETS connections to ``port`` that send nothing, in the order they were opened."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE_SOCKETS + 512
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"capability: this process may open {hard} files at most; it needs {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE_SOCKETS):
            s = socket.socket()
            s.connect(("127.0.0.1", port))
            idle.append(s)
        yield idle
    finally:
        for s in idle:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.ray
@pytest.mark.slow
def test_2000_idle_connections_cannot_lock_out_health_and_are_closed(served: ServeProcess) -> None:
    with _idle_sockets(_port(served)) as idle:
        t0 = time.monotonic()
        # without the evictions uvicorn's backstop (--max-connections + 1) answers 503
        r = httpx.get(f"{served.url}/health", timeout=NEVER_HANGS_S)
        took = time.monotonic() - t0
        assert r.status_code == 200, (r.status_code, r.text)
        wait_until(
            lambda: all(_closed(s) for s in idle),
            f"every idle connection closed after --header-timeout {HEADER_TIMEOUT_S:g}",
            timeout_s=HEADER_TIMEOUT_S + NEVER_HANGS_S,
            every_s=0.2,
        )
        assert httpx.get(f"{served.url}/health", timeout=NEVER_HANGS_S).status_code == 200
    print(
        f"/health answered in {took * 1000:.0f} ms with {IDLE_SOCKETS} idle connections open "
        f"(--max-connections {MAX_CONNECTIONS})"
    )


@pytest.mark.ray
@pytest.mark.slow
def test_idle_connections_past_the_limit_are_evicted_longest_waiting_first(
    tmp_path: Path,
) -> None:
    """Here no header timeout can close an idle socket while the test runs (it is ten times the
    never-hangs deadline), so every one found closed was evicted: the oldest ones, and only as
    many as keep the server within --max-connections."""
    serve = _serve(
        tmp_path,
        "--header-timeout",
        str(10 * NEVER_HANGS_S),
        "--max-connections",
        str(MAX_CONNECTIONS),
    )
    try:
        with _idle_sockets(_port(serve)) as idle:
            r = httpx.get(f"{serve.url}/health", timeout=NEVER_HANGS_S)
            assert r.status_code == 200, (r.status_code, r.text)

            keep = MAX_CONNECTIONS - 1  # the limit, less the one that made room for /health

            def still_open() -> list[int] | None:
                opened = [i for i, s in enumerate(idle) if not _closed(s)]
                return opened if len(opened) <= keep else None

            opened = wait_until(
                still_open,
                f"at most {keep} of {IDLE_SOCKETS} idle connections still open",
                every_s=0.2,
            )
            # only as many closed as the limit needs, and the survivors are the newest: each
            # eviction closed the connection that had waited longest
            assert opened == list(range(IDLE_SOCKETS - keep, IDLE_SOCKETS)), opened
    finally:
        assert serve.stop(timeout_s=60) == 0, serve.output()


@pytest.mark.ray
@pytest.mark.slow
def test_a_half_sent_request_is_closed_after_the_header_timeout(served: ServeProcess) -> None:
    # read before either connection opens: both header deadlines start after it, so neither
    # can close before HEADER_TIMEOUT_S on this clock (asyncio's timers never fire early)
    t0 = time.monotonic()
    with (
        socket.create_connection(("127.0.0.1", _port(served))) as silent,
        socket.create_connection(("127.0.0.1", _port(served))) as dribbling,
    ):
        silent.sendall(
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        )  # no blank line: headers never end
        dribbled = 0
        dribbling.settimeout(0.3)
        closed_at = None
        # one header byte every 0.3 s: never done, so only the header timeout closes it
        while time.monotonic() - t0 < HEADER_TIMEOUT_S + NEVER_HANGS_S:
            try:
                dribbling.sendall(
                    b"GET /health HTTP/1.1\r\nX-Slow: "[dribbled : dribbled + 1] or b"a"
                )
                dribbled += 1
                if dribbling.recv(1) == b"":
                    closed_at = time.monotonic() - t0
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_at = time.monotonic() - t0
                break
        silent_closed = _closed_within(silent, HEADER_TIMEOUT_S + NEVER_HANGS_S, since=t0)
    assert closed_at is not None, (
        f"a client sending a header byte every 0.3 s was still connected after {time.monotonic() - t0:.0f} s"
    )
    assert closed_at >= HEADER_TIMEOUT_S - LOOP_CLOCK_S, (
        closed_at
    )  # the dribbled bytes never moved the deadline
    assert silent_closed is not None, "a request without the end of its headers was still connected"
    assert silent_closed >= HEADER_TIMEOUT_S - LOOP_CLOCK_S, silent_closed
    print(
        f"half-sent requests closed {closed_at:.1f} s after they began (--header-timeout {HEADER_TIMEOUT_S:g})"
    )


@pytest.mark.ray
@pytest.mark.slow
def test_a_stalled_body_is_closed_after_the_read_timeout(served: ServeProcess) -> None:
    with socket.create_connection(("127.0.0.1", _port(served))) as s:
        t0 = time.monotonic()  # before the body's piece is sent: its read deadline starts after
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"messages": ['
        )
        took = _closed_within(s, READ_TIMEOUT_S + NEVER_HANGS_S, since=t0)
    assert took is not None, "a request whose body stopped arriving was still connected"
    assert took >= READ_TIMEOUT_S - LOOP_CLOCK_S, took


@pytest.mark.ray
@pytest.mark.slow
def test_a_client_that_stops_reading_its_stream_loses_it_and_its_slot(served: ServeProcess) -> None:
    prompt = " ".join(f"Sentence{i:05d} here." for i in range(SENTENCES))
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "modalities": ["text", "audio"],
            "audio": {"format": "pcm16", "voice": "alloy"},
        }
    ).encode()
    assert _in_flight(served) == 0
    s = socket.socket()
    s.setsockopt(
        socket.SOL_SOCKET, socket.SO_RCVBUF, 4096
    )  # before connect: the window stays small
    try:
        s.connect(("127.0.0.1", _port(served)))
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        s.settimeout(30)
        assert s.recv(4096).startswith(
            b"HTTP/1.1 200"
        )  # the stream started; now this client reads no more
        t0 = time.monotonic()  # (its slot is taken: the reply cannot end, ~11 MB are never read)
        wait_until(
            lambda: _in_flight(served) == 0,
            "the stalled stream's slot freed after --write-timeout",
            timeout_s=WRITE_TIMEOUT_S + NEVER_HANGS_S,
            every_s=0.2,
        )
        freed = time.monotonic() - t0
        assert _closed_within(s, NEVER_HANGS_S) is not None, (
            "the stalled client's connection was not closed"
        )
    finally:
        s.close()
    r = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "next"}]},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith(
        "You said next."
    )
    assert "stopped reading its response (the send buffer stayed full for 2 s" in served.output()
    print(
        f"a client that stopped reading lost its stream and slot {freed:.1f} s after (--write-timeout "
        f"{WRITE_TIMEOUT_S:g})"
    )


# ------------------------------------------------------------------------- the API key


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _environ(pid: int) -> bytes:
    """A process's environment as /proc shows it (empty once it has exited)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _check_key(serve: ServeProcess, key: str) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{serve.url}/v1/chat/completions", json=chat, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(
        f"{serve.url}/v1/chat/completions",
        json=chat,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert httpx.get(f"{serve.url}/", timeout=10).status_code == 200  # the page itself needs no key
    r = httpx.get(
        f"{serve.url}/v1/plan",
        headers={"Authorization": f"Bearer {key}", "Host": "attacker.example"},
        timeout=10,
    )
    assert r.status_code == 403  # a loopback server checks Host with a key too
    children = _descendants(serve.proc.pid)
    assert children, "serve started no process (Ray's) to check"
    leaked = [pid for pid in children if key.encode() in _environ(pid)]
    assert not leaked, (
        f"the API key is in the environment of {len(leaked)} of serve's {len(children)} child processes"
    )


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="platform: reads the children's /proc"
)
def test_the_api_key_from_the_environment_is_required_and_not_inherited(tmp_path: Path) -> None:
    key = "env-key-0123456789abcdef"
    serve = _serve(tmp_path, env={"OMNI_EDGE_API_KEY": key}, key=key)
    try:
        _check_key(serve, key)
    finally:
        assert serve.stop(timeout_s=60) == 0, serve.output()
    assert "visible to every user" not in serve.output()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="platform: reads the children's /proc"
)
def test_the_api_key_from_a_file_is_required(tmp_path: Path) -> None:
    key = "file-key-fedcba9876543210"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    serve = _serve(
        tmp_path,
        "--api-key-file",
        str(key_file),
        env={"OMNI_EDGE_API_KEY": "another-key-in-the-env"},
        key=key,
    )
    try:
        _check_key(serve, key)
        r = httpx.get(
            f"{serve.url}/health",
            headers={"Authorization": "Bearer another-key-in-the-env"},
            timeout=10,
        )
        assert r.status_code == 401  # the file's key, not the environment's
        assert not [
            pid
            for pid in _descendants(serve.proc.pid)
            if b"another-key-in-the-env" in _environ(pid)
        ]
    finally:
        assert serve.stop(timeout_s=60) == 0, serve.output()


def _serve_fails(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "OMNI_EDGE_API_KEY"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            str(REPO / "configs/voice-assistant.yaml"),
            *args,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "where", "what"),
    [
        (
            ("--host", "127.attacker.example"),
            "--host",
            "127.attacker.example is not a loopback address",
        ),
        (("--api-key-file", "/nonexistent/key"), "--api-key-file", "cannot read /nonexistent/key"),
        (
            ("--api-key", "k", "--api-key-file", "/dev/null"),
            "--api-key",
            "is given with --api-key-file",
        ),
        (("--write-timeout", "0"), "--write-timeout", "0 is not a positive number of seconds"),
        (("--header-timeout", "-1"), "--header-timeout", "-1 is not a positive number of seconds"),
        (("--max-connections", "0"), "--max-connections", "0 is below 1"),
        (
            ("--allowed-host", "example.com:80"),
            "--allowed-host",
            "'example.com:80' is not a host name",
        ),
    ],
)
def test_bad_serve_flags_exit_2_before_anything_starts(
    tmp_path: Path, args: tuple[str, ...], where: str, what: str
) -> None:
    done = _serve_fails(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert where in done.stderr and what in done.stderr and "Traceback" not in done.stderr
    assert "planning" not in done.stderr


def test_a_key_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    done = _serve_fails(tmp_path, "--api-key", "visible-key-0123456789", "--port", "99999")
    assert done.returncode == 2 and "99999 is not a port" in done.stderr
    assert (
        "--api-key is visible to every user of this machine" in done.stderr
        and "OMNI_EDGE_API_KEY" in done.stderr
    )


def test_serve_help_shows_each_limit_and_its_default() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for flag, default in [
        ("--max-connections", "default 1000"),
        ("--header-timeout", "default 10"),
        ("--read-timeout", "default 30"),
        ("--write-timeout", "default 30"),
        ("--keep-alive-timeout", "default 5"),
        ("--api-key-file", "OMNI_EDGE_API_KEY"),
        ("--allowed-host", "DNS rebinding"),
    ]:
        assert flag in text and default in text.rsplit(flag, 1)[-1][:400], (flag, default)
