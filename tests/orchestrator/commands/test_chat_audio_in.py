"""``omni-edge chat --url URL --audio-in FILE.wav``: a recording spoken to ``/v1/realtime``.

Bad input is refused with exit 2 and where/what/fix before anything connects:
the URL given is a listening socket this test holds and never answers, and
each refusal leaves its accept queue empty (a client that had connected would
sit there, and then time out with exit 1, not 2). A server that is not there
is exit 1 with a message that says so.
"""

from __future__ import annotations

import socket
import struct
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli import main
from orchestrator.client.realtime import realtime_url


@pytest.fixture
def listener() -> Iterator[tuple[str, socket.socket]]:
    """``http://127.0.0.1:PORT`` of a socket that listens and never accepts: a connection
    attempt would wait in its queue, where ``_connected`` finds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.setblocking(False)
        yield f"http://127.0.0.1:{s.getsockname()[1]}", s


def _connected(s: socket.socket) -> bool:
    try:
        conn, _ = s.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _wav(path: Path, rate: int = 16000, seconds: float = 0.5) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(
            (np.sin(np.arange(int(rate * seconds)) * 0.05) * 8000).astype("<i2").tobytes()
        )
    return path


def _wav_declaring(path: Path, rate: int) -> Path:
    """A 16-bit mono WAV whose header declares ``rate`` (any number: the header is written by hand)."""
    data = b"\0\0" * 800
    path.write_bytes(
        b"RIFF"
        + struct.pack("<I", 36 + len(data))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )
    return path


def _refused(
    capsys: pytest.CaptureFixture[str], s: socket.socket, argv: list[str], *expected: str
) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err
    assert not _connected(s), "a connection was made before the input was checked"
    return err


def test_a_missing_recording_is_refused_before_connecting(
    listener: tuple[str, socket.socket], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, s = listener
    _refused(
        capsys,
        s,
        ["chat", "--url", url, "--audio-in", str(tmp_path / "nope.wav")],
        f"--audio-in {tmp_path / 'nope.wav'}: no such file",
        "how to fix: check the path",
    )


def test_a_file_that_is_not_a_wav_is_refused_before_connecting(
    listener: tuple[str, socket.socket], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, s = listener
    text = tmp_path / "question.wav"
    text.write_text("What is the capital of France?\n")
    _refused(
        capsys,
        s,
        ["chat", "--url", url, "--audio-in", str(text)],
        f"--audio-in {text}: not a readable WAV file",
        "how to fix: give a 16-bit PCM WAV file",
    )


@pytest.mark.parametrize("rate", [4000, 384000])
def test_a_sample_rate_outside_8_to_192_khz_is_refused_before_connecting(
    listener: tuple[str, socket.socket],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    rate: int,
) -> None:
    url, s = listener
    wav = _wav_declaring(tmp_path / "odd.wav", rate)
    _refused(
        capsys,
        s,
        ["chat", "--url", url, "--audio-in", str(wav)],
        f"declares a sample rate of {rate} Hz: outside the 8000-192000 Hz",
        "resample it to 16000 Hz",
    )


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:8000", "127.0.0.1:8000", "http://"])
def test_a_url_that_is_not_http_or_ws_is_refused(
    listener: tuple[str, socket.socket],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    url: str,
) -> None:
    _, s = listener
    _refused(
        capsys,
        s,
        ["chat", "--url", url, "--audio-in", str(_wav(tmp_path / "q.wav"))],
        f"--url: {url!r} is not an http(s) or ws(s) URL",
        "e.g. --url http://127.0.0.1:8000",
    )


@pytest.mark.parametrize("speed", ["0", "-1", "nan", "inf", "1000"])
def test_an_audio_speed_that_is_not_a_positive_number_is_refused(
    listener: tuple[str, socket.socket],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    speed: str,
) -> None:
    url, s = listener
    _refused(
        capsys,
        s,
        ["chat", "--url", url, "--audio-in", str(_wav(tmp_path / "q.wav")), "--audio-speed", speed],
        "--audio-speed: ",
        "is not a number above 0 and at most 100",
        "how to fix: give 1.0",
    )


def test_flags_that_do_not_fit_a_spoken_session_are_refused(
    listener: tuple[str, socket.socket], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, s = listener
    wav = str(_wav(tmp_path / "q.wav"))
    _refused(
        capsys,
        s,
        [
            "chat",
            "--url",
            url,
            "--audio-in",
            wav,
            "--temperature",
            "0.5",
            "--out-dir",
            str(tmp_path),
        ],
        "--temperature: not used with --audio-in",
        "--out-dir: not used with --audio-in",
        "give --out reply.wav instead",
    )
    _refused(
        capsys,
        s,
        ["chat", "configs/examples/voice-chat.yaml", "--audio-in", wav],
        "--audio-in: streams to a running server's /v1/realtime, not to CONFIG",
    )
    _refused(capsys, s, ["chat", "--url", url, "--json"], "--json: only used with --audio-in")


def test_an_out_path_that_cannot_be_written_is_refused_before_connecting(
    listener: tuple[str, socket.socket], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, s = listener
    _refused(
        capsys,
        s,
        [
            "chat",
            "--url",
            url,
            "--audio-in",
            str(_wav(tmp_path / "q.wav")),
            "--out",
            str(tmp_path / "missing" / "reply.wav"),
        ],
        "--out ",
    )


def test_an_unreadable_key_file_is_refused_before_connecting(
    listener: tuple[str, socket.socket], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, s = listener
    _refused(
        capsys,
        s,
        [
            "chat",
            "--url",
            url,
            "--audio-in",
            str(_wav(tmp_path / "q.wav")),
            "--api-key-file",
            str(tmp_path / "no-key"),
        ],
        f"--api-key-file {tmp_path / 'no-key'}: cannot be read",
    )


def test_no_server_at_the_url_is_exit_1_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    rc = main(
        [
            "chat",
            "--url",
            f"http://127.0.0.1:{port}",
            "--audio-in",
            str(_wav(tmp_path / "q.wav")),
            "--out",
            str(tmp_path / "reply.wav"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"--url ws://127.0.0.1:{port}/v1/realtime: cannot connect" in err
    assert "omni-edge serve configs/examples/voice-chat.yaml" in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == [tmp_path / "q.wav"]  # no reply.wav, no partial file


@pytest.mark.parametrize(
    ("url", "ws"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/realtime"),
        ("https://example.test/", "wss://example.test/v1/realtime"),
        ("http://127.0.0.1:8000/v1", "ws://127.0.0.1:8000/v1/realtime"),
        ("ws://127.0.0.1:8000/v1/realtime", "ws://127.0.0.1:8000/v1/realtime"),
    ],
)
def test_the_realtime_url_of_a_server_url(url: str, ws: str) -> None:
    assert realtime_url(url) == ws


def test_the_key_comes_from_the_flag_the_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from orchestrator.commands.chat import key_of

    monkeypatch.setenv("OMNI_EDGE_API_KEY", "from-env")
    keyfile = tmp_path / "key"
    keyfile.write_text("from-file\nsecond line ignored\n")
    assert key_of(argparse.Namespace(api_key=None, api_key_file=None)) == "from-env"
    assert key_of(argparse.Namespace(api_key=None, api_key_file=keyfile)) == "from-file"
    assert key_of(argparse.Namespace(api_key="from-flag", api_key_file=None)) == "from-flag"
    monkeypatch.delenv("OMNI_EDGE_API_KEY")
    assert key_of(argparse.Namespace(api_key=None, api_key_file=None)) is None


def test_the_end_of_speech_is_timed_at_the_chunk_that_carried_it_after_a_short_chunk() -> None:
    """The recording's last chunk is short (its length is no multiple of 20 ms) and the silence
    after it starts a new chunk: a sample's send time is found by where each chunk ended, not by
    counting 20 ms chunks (which would be off by the short chunk from there on)."""
    from orchestrator.client.realtime import VoiceSession

    session = VoiceSession("http://127.0.0.1:1")
    session.in_rate = 16000
    session.sent_end = [320, 640, 700, 1020, 1340]  # 20 ms, 20 ms, 3.75 ms, then 20 ms chunks
    session.sent_at = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert session.sent_time(20.0) == 1.0  # samples 0..319: the first chunk
    assert session.sent_time(43.75) == 3.0  # ends at sample 700: the short chunk
    assert session.sent_time(63.75) == 4.0  # ends at sample 1020
    assert (
        session.sent_time(64.0) == 5.0
    )  # sample 1023 went in the chunk ending at 1340 (counting 20 ms chunks: 4.0)
    assert session.sent_time(84.0) is None  # not sent yet


# -- against a real server -------------------------------------------------------------------
VOICE_CHAT = Path(__file__).resolve().parents[3] / "configs/examples/voice-chat.yaml"
QUESTION = "What is the tallest mountain in the world?"


@pytest.fixture(scope="module")
def voice_chat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real ``omni-edge serve configs/examples/voice-chat.yaml`` and a recording of a question:
    half a second of silence, the question in the project's Piper voice (22 050 Hz: the client
    resamples it), a little silence — as a microphone records it."""
    from orchestrator.runtime.audio import write_wav
    from tests.helpers.serve import ServeProcess
    from tests.helpers.speech import speak

    if not (VOICE_CHAT.parents[2] / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file():
        pytest.skip("Whisper's graphs are not built: python -m exports.whisper_asr build")
    tmp = tmp_path_factory.mktemp("chat-audio-in")
    samples, rate = speak(QUESTION)
    silence = np.zeros(rate // 2, np.float32)
    wav = write_wav(
        tmp / "question.wav", np.concatenate([silence, samples, silence[: rate // 4]]), rate
    )
    server = ServeProcess(VOICE_CHAT, cwd=tmp, start_timeout_s=600)
    yield server.url, wav
    rc = server.stop()
    assert rc == 0, server.output()


@pytest.mark.ray
@pytest.mark.ort
@pytest.mark.slow
def test_a_spoken_question_gets_a_transcript_a_reply_a_latency_and_the_reply_audio(
    voice_chat: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from orchestrator.runtime.audio import read_wav, rms_dbfs
    from tests.helpers.speech import heard

    url, wav = voice_chat
    out = tmp_path / "reply.wav"
    rc = main(["chat", "--url", url, "--audio-in", str(wav), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    you = re.search(r"^turn 1  you: (.+)$", captured.out, re.M)
    assert you, captured.out
    heard(QUESTION, you.group(1))
    reply = re.search(r"^  reply \(turn 1\): (.+)$", captured.out, re.M)
    assert reply and reply.group(1).strip(), captured.out
    latency = re.search(
        r"^  latency (\d+\.\d\d) s \(end of speech → first reply audio\): end of turn \d+\.\d\d",
        captured.out,
        re.M,
    )
    assert latency and 0 < float(latency.group(1)) < 300, captured.out
    server = re.search(
        r"^\s+server, ms after the end of speech[^:]*:\s+turn\s+end\s+\d+,\s+transcript\s+\d+",
        captured.out,
        re.M,
    )
    assert server, captured.out
    assert all(len(line) <= 80 for line in captured.out.splitlines() if line.startswith("    ")), (
        captured.out
    )
    assert "1 turn answered; latency median" in captured.err
    audio, rate = read_wav(out)
    assert rate == 24000 and audio.size / rate > 0.3 and rms_dbfs(audio) > -40, (
        audio.size,
        rate,
        rms_dbfs(audio),
    )
    assert f"audio: {out} (" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "reply.wav"
    ]  # no partial file left beside it


@pytest.mark.ray
@pytest.mark.ort
@pytest.mark.slow
def test_json_prints_one_object_per_turn_with_the_latency_and_its_steps(
    voice_chat: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from tests.helpers.speech import heard

    url, wav = voice_chat
    rc = main(["chat", "--url", url, "--audio-in", str(wav), "--json", "--audio-speed", "2"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    turns = [json.loads(line) for line in captured.out.splitlines()]
    assert len(turns) == 1, captured.out
    turn = turns[0]
    assert turn["status"] == "completed" and turn["reply"].strip(), turn
    heard(QUESTION, turn["transcript"])
    assert turn["latency_s"] > 0 and turn["reply_audio_s"] > 0.3, turn
    steps = turn["breakdown_s"]
    assert set(steps) == {
        "end_of_turn",
        "transcript",
        "first_token",
        "first_sentence",
        "first_audio",
    }
    measured = [v for v in steps.values() if v is not None]
    assert abs(sum(measured) - turn["latency_s"]) < 0.01, turn  # the steps add up to the latency
    assert "streamed at 2× real time" in captured.err
    server = turn["server_timing_ms"]  # response.done's timing: the server's own marks
    assert server["early_start"] in (True, False), server
    assert server["turn_end_ms"] <= server["first_audio_ms"], (
        server
    )  # no audio before the turn closed


@pytest.mark.ray
def test_the_key_goes_with_the_upgrade_a_refused_key_is_exit_2_and_a_server_error_event_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed serve of the echo pipeline (no vad stage: the session's server VAD is refused with
    an ``error`` event once the upgrade is through): no key is a 401 at the upgrade (exit 2, the
    fix names where a key comes from); the key from ``--api-key-file`` gets through, and the
    server's ``error`` event is printed, exit 1."""
    from tests.helpers.serve import ServeProcess
    from tests.orchestrator.commands.test_run import write

    key = "realtime-client-key"
    monkeypatch.delenv("OMNI_EDGE_API_KEY", raising=False)
    cfg, prof = write(tmp_path)
    keyfile = tmp_path / "key"
    keyfile.write_text(key + "\n")
    wav = str(_wav(tmp_path / "q.wav"))
    server = ServeProcess(
        cfg,
        "--profile",
        str(prof),
        "--api-key-file",
        str(keyfile),
        cwd=tmp_path,
        headers={"Authorization": f"Bearer {key}"},
    )
    try:
        rc = main(["chat", "--url", server.url, "--audio-in", wav])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert (
            "the server refused the WebSocket upgrade: HTTP 401" in err
            and "$OMNI_EDGE_API_KEY" in err
        ), err
        rc = main(["chat", "--url", server.url, "--audio-in", wav, "--api-key-file", str(keyfile)])
        err = capsys.readouterr().err
        assert rc == 1, err
        assert (
            "error: session.update refused: session.turn_detection:" in err
            and "(invalid_value)" in err
        ), err
        assert "Traceback" not in err
    finally:
        assert server.stop() == 0, server.output()
