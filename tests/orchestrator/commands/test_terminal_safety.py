"""Text from elsewhere never drives the user's terminal, and the API key never leaves the server's origin.

* A model's reply, a server's reply and a server's error are written without their
  control characters (an OSC 52 sequence sets the clipboard of the terminal that
  prints it), and rich markup in error text is printed, not obeyed; ``--json``
  keeps the exact text. The echo kind echoes its prompt, so a prompt holding an
  escape sequence is a reply holding one, by construction.
* ``chat --url`` follows a redirect with ``Authorization`` only within the
  server's origin: two real HTTP servers on loopback, the first redirecting to the
  second (another port: another origin), each recording the headers it got.
"""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from tests.orchestrator.commands.test_run import write

KEY = "redirect-test-key"
OSC52 = "\x1b]52;c;b3duZWQ=\x07"
"""Set the clipboard to 'owned' (OSC 52, ended by BEL)."""
CLEAR = "\x1b[2J"
"""Clear the screen (CSI 2 J)."""
C1_CSI = "\x9b31m"
"""A one-byte CSI (C1 0x9b): red, on terminals that take C1 controls."""


def _no_controls(text: str) -> None:
    bad = sorted(
        {
            f"{ord(c):#04x}"
            for c in text
            if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F
        }
    )
    assert not bad, f"control characters reached the output: {bad}"


# ---- a model's reply (run, chat with a pipeline started here) ----------------------------------


@pytest.mark.ray
def test_a_reply_holding_escape_sequences_reaches_the_terminal_without_them(
    ray_cluster: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg, prof = write(tmp_path)
    prompt = f"copy {OSC52}this{CLEAR} now{C1_CSI} [red]please[/]"
    assert (
        main(
            ["run", str(cfg), "--prompt", prompt, "--profile", str(prof), "--record", str(tmp_path)]
        )
        == 0
    )
    out = capsys.readouterr().out
    _no_controls(out)
    assert (
        "You said copy ]52;c;b3duZWQ=this[2J now31m [red]please[/]." in out
    )  # the rest of the text kept, verbatim

    # --json keeps the exact text (JSON escapes it); the human output goes to stderr, cleaned
    assert (
        main(
            [
                "run",
                str(cfg),
                "--prompt",
                prompt,
                "--profile",
                str(prof),
                "--record",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert json.loads(captured.out)["text"].startswith(f"You said {prompt}.")
    _no_controls(captured.err)

    # chat: the reply as it streams, and /history
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{prompt}\n/history\n"))
    assert main(["chat", str(cfg), "--profile", str(prof)]) == 0
    captured = capsys.readouterr()
    _no_controls(captured.out + captured.err)
    assert "user: copy ]52;c;b3duZWQ=this[2J now31m [red]please[/]" in captured.out


# ---- two servers on loopback -------------------------------------------------------------------


class Recorder(ThreadingHTTPServer):
    """A loopback HTTP server that records (method, path, Authorization) and answers by ``routes``."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.routes: dict[tuple[str, str], tuple[int, dict[str, str], bytes]] = {}
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        status, headers, body = self.server.routes.get((self.command, self.path), (404, {}, b"{}"))
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # BaseHTTPRequestHandler calls do_<METHOD>

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[Recorder, Recorder]]:
    home, elsewhere = Recorder(), Recorder()
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (home, elsewhere)]
    for t in threads:
        t.start()
    yield home, elsewhere
    for s in (home, elsewhere):
        s.shutdown()
        s.server_close()


def _sse(*docs: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    body = "".join(f"data: {json.dumps(d)}\n\n" for d in docs) + "data: [DONE]\n\n"
    return 200, {"Content-Type": "text/event-stream"}, body.encode()


def _models(name: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps({"data": [{"id": name}]}).encode()


def test_chat_url_keeps_the_key_within_the_servers_origin_and_drops_it_on_a_redirect_elsewhere(
    servers: tuple[Recorder, Recorder],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home, elsewhere = servers
    home.routes = {
        ("GET", "/v1/models"): (
            302,
            {"Location": "/v1/models-here"},
            b"",
        ),  # same origin: the key goes along
        ("GET", "/v1/models-here"): (
            302,
            {"Location": f"{elsewhere.url}/v1/models"},
            b"",
        ),  # another port
        ("POST", "/v1/chat/completions"): (
            303,
            {"Location": f"{elsewhere.url}/v1/chat/completions"},
            b"",
        ),
    }
    elsewhere.routes = {
        ("GET", "/v1/models"): _models("elsewhere"),
        ("GET", "/v1/chat/completions"): _sse(
            {"choices": [{"delta": {"content": "redirected reply"}}]}
        ),
    }
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", "--url", home.url, "--api-key", KEY]) == 0
    assert "redirected reply" in capsys.readouterr().out
    bearer = f"Bearer {KEY}"
    assert home.seen == [
        ("GET", "/v1/models", bearer),
        ("GET", "/v1/models-here", bearer),
        ("POST", "/v1/chat/completions", bearer),
    ]
    assert elsewhere.seen == [("GET", "/v1/models", None), ("GET", "/v1/chat/completions", None)]


def test_a_servers_reply_and_error_reach_the_terminal_without_controls_and_with_markup_shown(
    servers: tuple[Recorder, Recorder],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home, _ = servers
    home.routes = {
        ("GET", "/v1/models"): _models(f"model{OSC52}[bold]x[/]"),
        ("POST", "/v1/chat/completions"): _sse(
            {"choices": [{"delta": {"content": f"reply {OSC52}{CLEAR}text"}}]}
        ),
    }
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\n"))
    assert main(["chat", "--url", home.url]) == 0
    captured = capsys.readouterr()
    _no_controls(captured.out + captured.err)
    assert "reply ]52;c;b3duZWQ=[2Jtext" in captured.out
    assert "[bold]x[/]" in captured.err  # the model id's markup is printed, not obeyed

    message = f"[red]refused[/] {OSC52}because"
    home.routes[("POST", "/v1/chat/completions")] = (
        400,
        {"Content-Type": "application/json"},
        json.dumps({"error": {"message": message}}).encode(),
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("second\n"))
    assert main(["chat", "--url", home.url]) == 2  # a refused message
    captured = capsys.readouterr()
    _no_controls(captured.out + captured.err)
    assert "not answered: HTTP 400: [red]refused[/] ]52;c;b3duZWQ=because" in " ".join(
        captured.err.split()
    )


# ---- what a file says, in a table ----------------------------------------------------------------


def test_a_manifests_text_reaches_the_stages_table_without_controls(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.helpers.graphs import write_artifact

    write_artifact(
        tmp_path / "arts" / "tiny",
        "relu",
        manifest={
            "source": {"origin": f"a download {OSC52}{CLEAR}page [red]x[/]", "license": "MIT"}
        },
    )
    assert main(["stages", "--path", str(tmp_path / "arts")]) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert "]52;c;b3duZWQ=[2Jpage" in out and "[red]x[/]" in out  # the rest kept, the markup shown
