"""Guessing the API key: wrong keys from one address are slowed (``server.auth.Lockout``) and
``serve`` refuses a key short enough to guess (exit 2).

The lockout runs on a tiny Starlette app behind ``BearerAuth`` through Starlette's
TestClient, one client per address, with a clock the test moves (no sleep, nothing timed):
after five wrong keys an address must wait a delay that doubles with each further wrong
key, and meanwhile it is refused at once — its key not even compared — while another
address is served as before."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket

from orchestrator.server.auth import BearerAuth, Lockout
from tests.helpers import REPO

KEY = "k" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _app(clock: Clock) -> Any:
    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hello")

    async def live(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    app = Starlette(routes=[Route("/v1/models", hello), WebSocketRoute("/v1/realtime", live)])
    return BearerAuth(app, KEY, Lockout(clock))


def _get(client: TestClient, key: str | None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return client.get("/v1/models", headers=headers)


def test_wrong_keys_from_one_address_are_slowed_and_other_addresses_are_not() -> None:
    clock = Clock()
    app = _app(clock)
    attacker = TestClient(app, client=("203.0.113.9", 40000))
    user = TestClient(app, client=("198.51.100.7", 40001))

    assert [_get(attacker, f"guess-{i}").status_code for i in range(5)] == [401] * 5
    locked = _get(attacker, "guess-5")
    assert locked.status_code == 429 and locked.headers["retry-after"] == "1"
    error = locked.json()["error"]
    assert error["code"] == "too_many_failed_keys"
    assert "too many wrong API keys from this address: try again in 1 s" in error["message"]
    # while it must wait, even the right key is not compared: guessing gains nothing
    assert _get(attacker, KEY).status_code == 429
    # another address is not slowed at all, and no request was held to make anyone wait
    assert _get(user, KEY).status_code == 200
    assert _get(user, "typo").status_code == 401

    clock.now += 1.01  # the wait is over: one more guess, then twice as long
    assert _get(attacker, "guess-6").status_code == 401
    again = _get(attacker, KEY)
    assert again.status_code == 429 and again.headers["retry-after"] == "2"
    clock.now += 1.5
    assert _get(attacker, KEY).status_code == 429
    clock.now += 0.51
    assert _get(attacker, KEY).status_code == 200  # the right key clears the address
    assert [_get(attacker, f"typo-{i}").status_code for i in range(5)] == [401] * 5

    # a request without a key guesses nothing: never counted, never slowed
    for _ in range(20):
        assert _get(user, None).status_code == 401
    assert _get(user, KEY).status_code == 200


def test_the_wait_doubles_to_a_minute_and_is_forgotten_after_quiet() -> None:
    clock = Clock()
    lockout = Lockout(clock)
    waits = []
    for _ in range(15):
        clock.now += lockout.wait_s("a")
        lockout.failed("a")
        waits.append(lockout.wait_s("a"))
    assert waits == [0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60]
    clock.now += Lockout.forget_s + 1
    assert lockout.wait_s("a") == 0
    lockout.failed("a")
    assert lockout.wait_s("a") == 0  # counted afresh


def test_a_locked_out_address_is_refused_on_the_websocket_too() -> None:
    clock = Clock()
    client = TestClient(_app(clock), client=("203.0.113.9", 40000))
    for i in range(5):
        _get(client, f"guess-{i}")
    try:
        with client.websocket_connect(
            "/v1/realtime", subprotocols=[f"openai-insecure-api-key.{KEY}"]
        ):
            raise AssertionError("the handshake was accepted")
    except WebSocketDenialResponse as denied:
        assert denied.status_code == 429 and denied.headers["retry-after"] == "1"


def test_serve_refuses_a_short_key_before_anything_starts(tmp_path: Any) -> None:
    env = {**os.environ, "OMNI_EDGE_API_KEY": "hunter2"}
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
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    text = " ".join(done.stderr.split())
    assert "$OMNI_EDGE_API_KEY: is 7 characters: a key shorter than 16 can be guessed" in text
    assert "how to fix: use a random key of at least 16 characters" in text
    assert "planning" not in done.stderr and "Traceback" not in done.stderr
