"""``omni-edge chat``: messages from stdin, the history they build, the exit codes.

Against the echo kind (its reply: ``You said <last user message>. <REPLY>``),
started in this process (CONFIG) and behind a real ``omni-edge serve`` on a
free loopback port (``--url``)."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.runtime.audio import OPENAI_PCM_RATE, read_wav, rms_dbfs
from tests.helpers.echo import REPLY
from tests.orchestrator.commands.test_run import write

KEY = "chat-test-key-0123456789"
LINES = "hello there\n\n  second message  \n/history\n/reset\n/history\nthird\n"


def _reply(said: str) -> str:
    return f"You said {said}. {REPLY}"


def _history_blocks(out: str) -> list[list[str]]:
    """What each /history printed: its lines up to the count line."""
    blocks, current = [], []
    for line in out.splitlines():
        if line.startswith(("system: ", "user: ", "assistant: ")):
            current.append(line)
        elif line.startswith("(") and line.endswith(" messages)"):
            blocks.append([*current, line])
            current = []
    return blocks


def _assert_the_conversation(out: str) -> None:
    for said in ("hello there", "second message", "third"):
        assert _reply(said) in out
    first, after_reset = _history_blocks(out)
    assert first == [
        "system: Be brief.",
        "user: hello there",
        f"assistant: {_reply('hello there')}",
        "user: second message",
        f"assistant: {_reply('second message')}",
        "(4 messages)",
    ]
    assert after_reset == ["system: Be brief.", "(0 messages)"]


@pytest.mark.ray
def test_chat_in_process_keeps_the_history_and_sends_it_with_each_message(
    ray_cluster: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.api import Pipeline

    sent: list[Any] = []
    real_stream = Pipeline.stream

    def recording_stream(self: Any, request: Any, **kw: Any) -> Any:
        sent.append(request.item())  # the ChatRequest as the decode stage reads it
        return real_stream(self, request, **kw)

    monkeypatch.setattr(Pipeline, "stream", recording_stream)
    monkeypatch.setattr(sys, "stdin", io.StringIO(LINES))
    cfg, prof = write(tmp_path)
    rc = main(
        [
            "chat",
            str(cfg),
            "--profile",
            str(prof),
            "--system",
            "Be brief.",
            "--out-dir",
            str(tmp_path / "out"),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    _assert_the_conversation(captured.out)
    assert [len(r["messages"]) for r in sent] == [
        2,
        4,
        2,
    ]  # system + history + the new message; reset before the 3rd
    assert sent[1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": _reply("hello there")},
        {"role": "user", "content": "second message"},
    ]
    wavs = sorted((tmp_path / "out").glob("*.wav"))
    assert [w.name for w in wavs] == ["reply-001.wav", "reply-002.wav", "reply-003.wav"]
    audio, rate = read_wav(wavs[0])
    assert rate == 16000 and audio.size > 0 and rms_dbfs(audio) > -20
    assert "chat ended: 3 replies, 2 messages in the history" in captured.err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``omni-edge serve`` of the echo pipeline, with an API key, in its own process."""
    tmp = tmp_path_factory.mktemp("chat-serve")
    cfg, prof = write(tmp)
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            str(cfg),
            "--profile",
            str(prof),
            "--port",
            str(port),
            "--api-key",
            KEY,
        ],
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][
                -3000:
            ]
            try:
                req = urllib.request.Request(
                    f"{url}/health", headers={"Authorization": f"Bearer {KEY}"}
                )
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.ray
def test_chat_over_url_keeps_the_history_and_writes_each_replys_audio(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(LINES))
    rc = main(
        [
            "chat",
            "--url",
            server,
            "--api-key",
            KEY,
            "--system",
            "Be brief.",
            "--out-dir",
            str(tmp_path),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    _assert_the_conversation(captured.out)
    audio, rate = read_wav(tmp_path / "reply-002.wav")
    assert rate == OPENAI_PCM_RATE and audio.size > 0 and rms_dbfs(audio) > -20
    assert "chat ended: 3 replies, 2 messages in the history" in captured.err


@pytest.mark.ray
def test_audio_that_cannot_be_written_is_named_and_the_chat_goes_on(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from orchestrator.runtime import audio

    def disk_full(self: Any, samples: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(audio.WavStreamWriter, "write", disk_full)
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\n"))
    rc = main(["chat", "--url", server, "--api-key", KEY, "--out-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 0 and _reply("two") in captured.out
    assert (
        captured.err.count("the reply's audio could not be written (No space left on device)") == 2
    )
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no temporary file


@pytest.mark.ray
def test_a_refused_message_is_printed_the_chat_goes_on_and_exits_2(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\n"))
    rc = main(["chat", "--url", server, "--api-key", KEY, "--max-tokens", "0"])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err.count("not answered: HTTP 400") == 2 and "max_tokens" in captured.err
    assert "chat ended: 0 replies, 0 messages in the history" in captured.err


@pytest.mark.ray
def test_a_server_with_a_key_refuses_a_chat_without_it(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    rc = main(["chat", "--url", server])
    err = capsys.readouterr().err
    assert rc == 2 and "HTTP 401" in err and "--api-key" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["chat", "cfg.yaml", "--url", "http://127.0.0.1:8000"],
            ["CONFIG and --url", "drop one of them"],
        ),
        (["chat"], ["CONFIG: missing", "--url"]),
        (["chat", "--url", "127.0.0.1:8000"], ["--url", "is not an http(s) URL"]),
        (["chat", "cfg.yaml", "--api-key", "k"], ["--api-key", "only used with --url"]),
        (
            ["chat", "--url", "http://127.0.0.1:8000", "--profile", "p.json"],
            ["--profile", "only used with CONFIG"],
        ),
    ],
)
def test_bad_arguments_exit_2_naming_them(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and all(w in err for w in words), err


def test_an_unreachable_server_exits_2_saying_how_to_start_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["chat", "--url", f"http://127.0.0.1:{_free_port()}"])
    err = capsys.readouterr().err
    assert (
        rc == 2
        and "cannot reach an omni-edge server there" in err
        and "omni-edge serve CONFIG" in err
    )


LONG_WORDS = 1000
"""Words of the message the interrupt tests send first: the echo thinker repeats
them at one every 0.3 s, so its reply streams for 300 s — it is still streaming
when the signal arrives, however loaded the machine (the 17-word reply to a
one-word message finished before SIGINT arrived on a loaded machine)."""
LONG_MESSAGE = " ".join(["first", *(f"w{i}" for i in range(LONG_WORDS - 2)), "lastword"])


def _chat_process(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """``omni-edge chat`` of an echo pipeline that says a word every 0.3 s, fed
    through a pipe; returns once its first reply (to ``LONG_MESSAGE``) has started
    streaming, at least five minutes before it could end."""
    cfg, prof = write(tmp_path, thinker=", delay_s: 0.3")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "chat", str(cfg), "--profile", str(prof)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # as a terminal starts it: a suite started in the background (`&` in a script) runs
        # with SIGINT ignored, and a child would inherit that and never see the test's Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(LONG_MESSAGE + "\n")
    proc.stdin.flush()
    seen = ""
    deadline = time.monotonic() + 120
    while "You said" not in seen and time.monotonic() < deadline:
        ch = proc.stdout.read(1)
        if not ch:
            break
        seen += ch
    assert "You said" in seen, proc.communicate()[1][-3000:]
    return proc, seen


@pytest.mark.ray
def test_ctrl_c_while_a_reply_streams_stops_that_reply_and_the_chat_goes_on(tmp_path: Path) -> None:
    proc, seen = _chat_process(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate("second\n", timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "not answered: stopped (Ctrl-C)" in err and "Traceback" not in err
    assert _reply("second") in out
    assert "lastword" not in seen + out  # the first reply stopped before it had echoed the message
    assert (
        "chat ended: 1 replies, 2 messages in the history" in err
    )  # the stopped reply is not in it


@pytest.mark.ray
def test_sigterm_while_a_reply_streams_closes_the_pipeline_and_exits_143(tmp_path: Path) -> None:
    proc, _ = _chat_process(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert (
        "interrupted by SIGTERM: closed the pipeline; ledger holds 0 bytes" in err
        and "Traceback" not in err
    )
