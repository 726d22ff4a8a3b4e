"""``omni-edge serve``'s app: the real ``openai`` client against a real uvicorn server
on loopback, in front of a started echo pipeline (words → tone; its reply is
deterministic: ``You said <last user message>. <REPLY>``)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.units import GiB
from tests.conftest import make_profile
from tests.helpers.echo import REPLY

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

ECHO = """name: echo-serve
stages:
  - {name: thinker, kind: echo, mode: words, devices: [cpu], final_output: true, final_output_type: text}
  - {name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [cpu], final_output: true, final_output_type: audio}
"""
KEY = "s3cret-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Served:
    def __init__(self, app: Any) -> None:
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def pipeline(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from orchestrator.api import Pipeline

    tmp = tmp_path_factory.mktemp("serve")
    cfg = tmp / "echo.yaml"
    cfg.write_text(ECHO)
    prof = tmp / "profile.json"
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    p = Pipeline.from_config(cfg, profile=prof, record=None)
    yield p
    final = p.close()
    assert not final.get("held_bytes")


@pytest.fixture(scope="module")
def served(pipeline: Any) -> Iterator[_Served]:
    from orchestrator.server import create_app

    s = _Served(create_app(pipeline))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def served_with_key(pipeline: Any) -> Iterator[_Served]:
    from orchestrator.server import create_app

    s = _Served(create_app(pipeline, api_key=KEY))
    yield s
    s.stop()


def _client(s: _Served, key: str = "unused") -> Any:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key=key, max_retries=0, timeout=30)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
EXPECTED = f"You said hi there. {REPLY}"


@pytest.mark.ray
def test_chat_completion_replies_what_the_pipeline_says(served: _Served) -> None:
    reply = _client(served).chat.completions.create(model="echo-serve", messages=MESSAGES, max_tokens=64,
                                                    temperature=0.0)
    assert reply.object == "chat.completion" and reply.model == "echo-serve"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == EXPECTED
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.ray
def test_streamed_chunks_join_to_the_same_reply(served: _Served) -> None:
    client = _client(served)
    whole = client.chat.completions.create(model="echo-serve", messages=MESSAGES).choices[0].message.content
    chunks = list(client.chat.completions.create(model="echo-serve", messages=MESSAGES, stream=True))
    assert len(chunks) > 3 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole == EXPECTED
    assert chunks[-1].choices[0].finish_reason == "stop"
    with httpx.stream("POST", f"{served.url}/v1/chat/completions",
                      json={"model": "echo-serve", "messages": MESSAGES, "stream": True}) as raw:
        lines = [line for line in raw.iter_lines() if line]
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


@pytest.mark.ray
def test_models_lists_the_pipeline(served: _Served) -> None:
    models = _client(served).models.list()
    assert [m.id for m in models.data] == ["echo-serve"]


@pytest.mark.ray
def test_health_names_every_stage_with_its_device(served: _Served) -> None:
    doc = httpx.get(f"{served.url}/health").json()
    assert doc["status"] == "ok"
    assert [(s["name"], s["device"], s["alive"]) for s in doc["stages"]] == [("thinker", "cpu", True),
                                                                             ("voice", "cpu", True)]


@pytest.mark.ray
@pytest.mark.parametrize(("kwargs", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
])
def test_a_bad_request_is_a_400_in_openais_shape(served: _Served, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _client(served).chat.completions.create(model="echo-serve", **kwargs)
    assert info.value.status_code == 400
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param and body["type"] == "invalid_request_error"
    assert param in body["message"]


@pytest.mark.ray
def test_a_key_is_required_when_set(served_with_key: _Served) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        _client(served_with_key, "wrong").models.list()
    assert info.value.status_code == 401
    missing = httpx.post(f"{served_with_key.url}/v1/chat/completions", json={"messages": MESSAGES})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{served_with_key.url}/health").status_code == 401
    reply = _client(served_with_key, KEY).chat.completions.create(model="echo-serve", messages=MESSAGES)
    assert reply.choices[0].message.content == EXPECTED


def test_a_stages_bad_request_names_the_openai_field() -> None:
    import json

    from orchestrator.errors import BadRequest
    from orchestrator.server import error_for

    for where, param in (("request.sampling.temperature", "temperature"), ("prompt", "messages")):
        response = error_for(BadRequest.single(where, "out of range", "use another value"))
        doc = json.loads(bytes(response.body))["error"]
        assert response.status_code == 400 and doc["param"] == param and where in doc["message"]


def test_the_error_shapes_of_busy_and_failed() -> None:
    import json

    from orchestrator.errors import PipelineBusy, StageFailed
    from orchestrator.server import error_for

    busy = error_for(PipelineBusy(1, 1, 1, 1))
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert json.loads(bytes(busy.body))["error"]["code"] == "pipeline_busy"
    failed = error_for(StageFailed("voice", "npu", "the actor died"))
    doc = json.loads(bytes(failed.body))["error"]
    assert failed.status_code == 503 and "'voice' on npu" in doc["message"] and doc["param"] == "voice"


def test_a_non_loopback_bind_without_a_key_exits_2_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.api import Pipeline

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("the pipeline was started for a bind that is refused")

    monkeypatch.setattr(Pipeline, "from_config", refuse)
    monkeypatch.delenv("OMNI_EDGE_API_KEY", raising=False)
    rc = main(["serve", str(tmp_path / "never-read.yaml"), "--host", "0.0.0.0"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "0.0.0.0 is not a loopback address" in err and "--api-key" in err


@pytest.mark.ray
@pytest.mark.slow
def test_serve_runs_until_sigterm_then_closes_the_pipeline(tmp_path: Path) -> None:
    """The command itself, in a fresh interpreter with its own local Ray cluster."""
    import os
    import signal
    import subprocess
    import sys

    cfg = tmp_path / "echo.yaml"
    cfg.write_text(ECHO)
    prof = tmp_path / "profile.json"
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", str(cfg), "--profile", str(prof),
                             "--port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="echo-serve", messages=MESSAGES)
        assert reply.choices[0].message.content == EXPECTED
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by SIGTERM: closed the pipeline; ledger holds 0 bytes" in err
