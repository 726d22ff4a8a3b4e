"""The page at ``/`` (orchestrator/server/web), in a real headless Chromium.

The browser is Debian's ``chromium`` (scripts/bootstrap.sh installs it), driven
by Playwright's Python client with ``executable_path``: nothing is downloaded
at run time (never ``playwright install``). Without chromium the browser tests
skip as missing, which fails them under ``--require-assets`` (scripts/test.sh;
tests/helpers/skips.py).

* the files are served by ``create_app`` (no build step);
* against a server that streams the HTTP contract's shapes (text pieces as
  ``delta.audio.transcript``, pcm16 24 kHz as ``delta.audio.data``) the page
  shows the text, schedules every chunk on one AudioContext and plays them,
  draws every stage with its device and every pool's bars, and fits a narrow
  window;
* against ``omni-edge serve configs/voice-assistant.yaml`` (slow): a prompt
  typed and sent streams text and starts audio playing; a screenshot is saved
  to test-output/page.png; SIGTERM stops the server with exit 0.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest

from tests.helpers import REPO
from tests.helpers.skips import skip_missing
from tests.helpers.waiting import NEVER_HANGS_S, wait_until

OUTPUT = REPO / "test-output"
"""Where the screenshots go (gitignored)."""
CHROMIUM_ARGS = [
    "--autoplay-policy=no-user-gesture-required",
    "--no-sandbox",
    "--disable-dev-shm-usage",
]
RATE = 24000


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian chromium under Playwright; without one a missing-class skip."""
    exe = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = (
        "chromium is not installed (scripts/bootstrap.sh installs Debian's package)"
        if exe is None
        else "playwright is not installed (pip install -e '.[dev]')"
        if sync_playwright is None
        else None
    )
    if missing:
        skip_missing(missing)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _wait_for(page: Any, expression: str, timeout: float = NEVER_HANGS_S * 1000) -> None:
    """Poll ``expression`` until it is true: Playwright's ``wait_for_function`` evaluates its predicate
    with ``eval`` in the page, which the page's Content-Security-Policy (no 'unsafe-eval') refuses;
    ``page.evaluate`` goes through the DevTools protocol, which CSP does not govern."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true within {timeout / 1000:g} s: {expression}"
        page.wait_for_timeout(50)


def _csp(url: str) -> str:
    """The Content-Security-Policy the page is served with."""
    import httpx

    return str(httpx.get(url + "/", timeout=10).headers.get("content-security-policy", ""))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stub_pipeline() -> Any:
    """Enough of a started Pipeline for ``create_app`` to build its routes."""
    pipeline = MagicMock(name="pipeline")
    pipeline.plan.pipeline = "page-test"
    pipeline.plan.stages = []
    return pipeline


def test_the_page_and_its_files_are_served_by_the_app() -> None:
    from starlette.testclient import TestClient

    from orchestrator.server import WEB_DIR, create_app

    client = TestClient(
        create_app(_stub_pipeline()), base_url="http://127.0.0.1"
    )  # a loopback Host
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    # the page loads only its own files: the CSP the browser tests run it under (server.guard)
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert (
        page.headers["x-frame-options"] == "DENY"
        and page.headers["x-content-type-options"] == "nosniff"
    )
    for name, kind in [
        ("app.js", "javascript"),
        ("style.css", "text/css"),
        ("mic-worklet.js", "javascript"),
    ]:
        # the microphone's AudioWorklet module is a file of the server, loaded by app.js (a blob: is refused by the CSP)
        assert f'"static/{name}"' in (
            page.text if name != "mic-worklet.js" else (WEB_DIR / "app.js").read_text()
        )
        served = client.get(f"/static/{name}")
        assert served.status_code == 200 and kind in served.headers["content-type"]
        assert served.content == (WEB_DIR / name).read_bytes()
    assert client.get("/static/nothing.js").status_code == 404


def test_the_page_files_are_package_data() -> None:
    """pyproject's package-data globs cover every file of orchestrator/server/web (a wheel ships the page)."""
    tomllib = pytest.importorskip("tomllib", reason="platform: tomllib is Python 3.11+")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["orchestrator"]
    files = [
        f"server/web/{p.name}"
        for p in (REPO / "orchestrator/server/web").iterdir()
        if p.suffix != ".md"
    ]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)


# ---------------------------------------------------------------- a server speaking the contract


def _pcm16(seconds: float, hz: float = 220.0) -> str:
    n = int(seconds * RATE)
    samples = (int(8000 * math.sin(2 * math.pi * hz * i / RATE)) for i in range(n))
    return base64.b64encode(struct.pack(f"<{n}h", *samples)).decode()


STATUS = {
    "pipeline": "page-test",
    "stages": [
        {
            "name": "thinker",
            "kind": "ar_decode",
            "device": "cpu",
            "backend": "vllm-cpu",
            "alive": True,
            "loaded": True,
            "final_output_type": "text",
        },
        {
            "name": "voice",
            "kind": "exported_graph",
            "device": "igpu:0",
            "backend": "ort-openvino",
            "alive": True,
            "loaded": True,
            "final_output_type": "audio",
        },
    ],
    "pools": [
        {
            "id": "host_ram",
            "capacity_bytes": 16 << 30,
            "budget_bytes": 4 << 30,
            "reserved_bytes": 3 << 30,
            "measured_peak_bytes": 2 << 30,
        },
        {
            "id": "igpu:0",
            "capacity_bytes": 8 << 30,
            "budget_bytes": 1 << 30,
            "reserved_bytes": 1 << 30,
            "measured_peak_bytes": None,
        },
    ],
    "queue": {"in_flight": 1, "waiting": 0, "limit": 2, "max_waiting": 8},
    "recent": [
        {
            "request_id": "abc123def456",
            "time_to_first_token_s": 0.12,
            "time_to_first_audio_s": 0.61,
            "total_s": 2.4,
            "stages": {
                "thinker": {"time_to_first_output_s": 0.12, "done_s": 1.9},
                "voice": {"time_to_first_output_s": 0.61, "done_s": 2.4},
            },
        },
    ],
}
SPOKEN = [("The Moon ", 0.4), ("is bright.", 0.4), ("", 0.4)]
"""(transcript piece, seconds of audio after it): the contract server's reply."""


def _contract_app(requests: list[dict[str, Any]]) -> Any:
    """The page's routes from ``create_app``, behind a chat and a status endpoint speaking the contract."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Mount, Route

    from orchestrator.server import create_app

    async def chat(request: Request) -> Response:
        requests.append(await request.json())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            doc = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "page-test",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(doc)}\n\n"

        spoken = SPOKEN * (20 if "slowly" in json.dumps(requests[-1]) else 1)

        async def events() -> AsyncIterator[str]:
            finished = False
            try:
                yield chunk({"role": "assistant"})
                for text, seconds in spoken:
                    await asyncio.sleep(0.05 if len(spoken) == len(SPOKEN) else 0.3)
                    if text:
                        yield chunk({"audio": {"id": "audio_1", "transcript": text}})
                    yield chunk({"audio": {"id": "audio_1", "data": _pcm16(seconds)}})
                yield chunk({}, "stop")
                yield "data: [DONE]\n\n"
                finished = True
            finally:
                requests[-1]["finished"] = finished

        return StreamingResponse(events(), media_type="text/event-stream")

    async def status(request: Request) -> Response:
        return JSONResponse(STATUS)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/status", status),
            Mount("/", app=create_app(_stub_pipeline())),
        ]
    )


@pytest.fixture
def contract_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    import uvicorn

    requests: list[dict[str, Any]] = []
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            _contract_app(requests),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, name="page-test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", requests
    server.should_exit = True
    thread.join(timeout=20)


def _ask(page: Any, prompt: str) -> None:
    page.get_by_label("Prompt").fill(prompt)
    page.get_by_role("button", name="Send").click()


def _audio(page: Any) -> dict[str, Any]:
    return dict(page.evaluate("window.omniEdge.audio"))


def _shown_stages(page: Any) -> dict[str, str]:
    """Each stage card's name → the device it shows."""
    return dict(
        page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#stages li')]
        .map(li => [li.dataset.stage, li.querySelector('dd.device').textContent]))""")
    )


def _bar_widths(page: Any) -> dict[str, dict[str, float]]:
    """Each pool's bars as fractions of its track (budget, reserved) and where its peak marker sits."""
    return dict(
        page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#pools .pool')].map(p => {
        const track = p.querySelector('.bar').getBoundingClientRect();
        const part = (sel, edge) => { const e = p.querySelector(sel); if (!e) return null;
            const r = e.getBoundingClientRect(); return (edge ? r.left - track.left : r.width) / track.width; };
        return [p.dataset.pool, {budget: part('.bar-budget'), reserved: part('.bar-reserved'),
                                  peak: part('.bar-peak', true)}]; }))""")
    )


def test_the_page_streams_text_plays_audio_and_draws_the_pipeline(
    browser: Any, contract_server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, requests = contract_server
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None
    )
    page.goto(url + "/")
    assert "script-src 'self'" in _csp(url)  # the page runs under the CSP
    _wait_for(page, "document.querySelectorAll('#pools .pool').length === 2")
    _ask(page, "Tell me about the Moon.")
    _wait_for(page, "window.omniEdge.state === 'done'", timeout=20_000)
    assert page.evaluate("window.omniEdge.text") == "The Moon is bright."
    assert page.locator("#conversation .reply").last.inner_text() == "The Moon is bright."
    assert requests[-1]["stream"] is True and requests[-1]["modalities"] == ["text", "audio"]
    assert requests[-1]["audio"]["format"] == "pcm16"
    assert requests[-1]["messages"][-1] == {"role": "user", "content": "Tell me about the Moon."}
    audio = _audio(page)
    assert audio["chunks"] == 3 and audio["seconds"] == pytest.approx(1.2, abs=1e-3), audio
    _wait_for(page, "window.omniEdge.audio.playing", timeout=5_000)
    later = _audio(page)
    assert later["contextState"] == "running" and later["contextTime"] > later["startedAt"], later

    assert _shown_stages(page) == {"thinker": "cpu", "voice": "igpu:0"}
    bars = _bar_widths(page)
    assert bars["host_ram"]["budget"] == pytest.approx(0.25, abs=0.02)
    assert bars["host_ram"]["reserved"] == pytest.approx(3 / 16, abs=0.02)
    assert bars["host_ram"]["peak"] == pytest.approx(0.125, abs=0.02)
    assert bars["igpu:0"]["peak"] is None  # no measured peak yet: no marker
    assert page.locator("#recent tbody tr").count() == 1
    assert (
        page.locator("#queue").inner_text()
        == "Requests: 1 running of 2 slots · 0 waiting (at most 8)"
    )
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / "page-contract.png"), full_page=True)

    # A second turn sends the first as history.
    _ask(page, "And the Sun?")
    _wait_for(page, "window.omniEdge.state === 'done'", timeout=20_000)
    assert [m["role"] for m in requests[-1]["messages"]] == ["user", "assistant", "user"]

    page.set_viewport_size({"width": 390, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (
        "the page scrolls sideways"
    )
    assert not errors, errors
    page.close()


def test_a_refused_request_shows_the_servers_message(
    browser: Any, contract_server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, _ = contract_server
    page = browser.new_page()
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=429,
            headers={"Retry-After": "1", "Content-Type": "application/json"},
            body=json.dumps(
                {"error": {"message": "all 2 slots are busy", "type": "rate_limit_error"}}
            ),
        ),
    )
    page.goto(url + "/")
    _ask(page, "hi")
    _wait_for(page, "window.omniEdge.state === 'error'", timeout=10_000)
    assert (
        "429: all 2 slots are busy (retry after 1 s)"
        in page.locator("#conversation .reply").last.inner_text()
    )
    page.close()


def test_a_stage_coming_back_shows_reconnecting_the_voice_not_silence(
    browser: Any, contract_server: tuple[str, list[dict[str, Any]]]
) -> None:
    """The status says the voice's process died and is being restarted: the page says
    "reconnecting the voice…" and badges the stage "restarting" (not "down"); in Talk, an
    ``error`` with code ``stage_restarting`` and the reply it failed say the same, and a
    completed reply clears it."""
    url, _ = contract_server
    restarting = json.loads(json.dumps(STATUS))
    voice = restarting["stages"][1]
    voice.update(
        alive=False,
        loaded=False,
        code="stage_restarting",
        restart={"state": "recovering", "attempt": 1, "device": "igpu:0", "cause": "killed"},
    )
    page = browser.new_page()
    page.route(
        "**/v1/status",
        lambda route: route.fulfill(
            status=200, headers={"Content-Type": "application/json"}, body=json.dumps(restarting)
        ),
    )
    page.goto(url + "/")
    _wait_for(page, "document.getElementById('server-state').textContent.includes('voice')")
    assert (
        page.locator("#server-state").inner_text() == "reconnecting the voice… (voice restarting)"
    )
    assert page.locator("#stages li[data-stage=voice] .badge").inner_text() == "restarting"
    said = page.evaluate("""() => {
        onServerEvent({type: "response.created", response: {id: "resp_1"}});
        onServerEvent({type: "error", error: {type: "server_error", code: "stage_restarting",
                       message: "stage 'voice' on igpu:0 is coming back"}});
        const during = document.getElementById('talk-state').textContent;
        onServerEvent({type: "response.done", response: {id: "resp_1", status: "failed",
            status_details: {type: "failed", error: {code: "stage_restarting", message: "x"}}}});
        return {during, reconnecting: window.omniEdge.talk.reconnecting,
                reply: window.omniEdge.talk.responses[0].error};
    }""")
    assert said == {
        "during": "reconnecting the voice…",
        "reconnecting": True,
        "reply": "reconnecting the voice…",
    }, said
    assert (
        page.evaluate("""() => {
        onServerEvent({type: "response.created", response: {id: "resp_2"}});
        onServerEvent({type: "response.done", response: {id: "resp_2", status: "completed"}});
        return window.omniEdge.talk.reconnecting;
    }""")
        is False
    )
    page.close()


# ---------------------------------------------------------------- the real server


@pytest.fixture
def voice_server(tmp_path: Path) -> Iterator[str]:
    """``omni-edge serve configs/voice-assistant.yaml`` on a free loopback port; SIGTERM must end it with 0."""
    import httpx

    port = _free_port()
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
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
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"

    def output() -> str:
        log.flush()
        return (tmp_path / "serve.log").read_text()[-4000:]

    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"serve exited {proc.returncode}:\n{output()}"
            assert time.monotonic() < deadline, (
                f"serve did not answer /health in 300 s:\n{output()}"
            )
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, f"serve exited {rc} on SIGTERM:\n{output()}"


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_a_person_asks_the_served_voice_assistant_and_hears_the_reply(
    browser: Any, voice_server: str
) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(voice_server + "/")
    _wait_for(page, "document.querySelectorAll('#stages li').length === 2", timeout=20_000)
    _ask(page, "Tell me one fact about the Moon.")
    shot = OUTPUT / "page.png"
    try:
        _wait_for(
            page,
            "window.omniEdge.text.trim().length > 0 || window.omniEdge.state === 'error'",
            timeout=120_000,
        )
        assert page.evaluate("window.omniEdge.error") is None
        _wait_for(
            page,
            "window.omniEdge.audio.played || window.omniEdge.state === 'error'",
            timeout=120_000,
        )
        _wait_for(
            page,
            "window.omniEdge.state === 'done' || window.omniEdge.state === 'error'",
            timeout=120_000,
        )
        # the page polls the status on its own: the request shows in the recent table
        _wait_for(page, "document.querySelectorAll('#recent tbody tr').length >= 1")
    finally:
        OUTPUT.mkdir(exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
    state = page.evaluate(
        "({state: window.omniEdge.state, error: window.omniEdge.error, audio: window.omniEdge.audio})"
    )
    assert state["state"] == "done" and state["error"] is None, (state, f"screenshot: {shot}")
    audio = state["audio"]
    assert audio["chunks"] > 0 and audio["seconds"] > 0.2, (audio, f"screenshot: {shot}")
    assert audio["contextTime"] > audio["startedAt"], (audio, f"screenshot: {shot}")
    status = page.evaluate("window.omniEdge.status")
    assert _shown_stages(page) == {s["name"]: s["device"] for s in status["stages"]}, (
        f"screenshot: {shot}"
    )
    assert set(_shown_stages(page)) == {"thinker", "voice"}, f"screenshot: {shot}"
    bars = _bar_widths(page)
    assert bars and set(bars) == {p["id"] for p in status["pools"]}, (bars, f"screenshot: {shot}")
    assert all(b["budget"] is not None and b["budget"] > 0 for b in bars.values()), (
        bars,
        f"screenshot: {shot}",
    )
    assert page.locator("#recent tbody tr").count() >= 1, f"screenshot: {shot}"
    assert not errors, (errors, f"screenshot: {shot}")
    page.close()


def test_stop_ends_the_request_and_its_audio(
    browser: Any, contract_server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, requests = contract_server
    page = browser.new_page()
    page.goto(url + "/")
    _ask(page, "Say it slowly.")
    _wait_for(page, "window.omniEdge.audio.chunks >= 2", timeout=10_000)
    page.get_by_role("button", name="Stop", exact=True).click()
    _wait_for(page, "window.omniEdge.state === 'stopped'")
    chunks = _audio(page)["chunks"]
    # the server sees the client go away: its stream ends unfinished (run out, the slow reply
    # would end finished), so the page closed it, and nothing more can arrive on it
    wait_until(lambda: "finished" in requests[-1], "the server's stream closed")
    assert requests[-1]["finished"] is False
    assert _audio(page)["chunks"] == chunks and not _audio(page)["playing"]
    assert page.get_by_role("button", name="Send").is_enabled()
    page.close()
