"""``orchestrator/server/guard.py`` on its own, in front of a two-route Starlette app (no
pipeline, no Ray): what counts as loopback, the Host allow-list (also with ``--host
0.0.0.0``), same-origin, the JSON content type, the headers. The real ``serve`` process
is driven in tests/orchestrator/server/test_server_transport.py."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.server.guard import RequestGuard, is_loopback, split_host

testclient = pytest.importorskip("starlette.testclient")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("localhost.", True),
        ("127.attacker.example", False),
        ("127.0.0.1.attacker.example", False),
        ("localhost.attacker.example", False),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("::", False),
        ("0177.0.0.1", False),
        ("", False),
    ],
)
def test_loopback_is_read_with_ipaddress_never_by_prefix(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("value", "split"),
    [
        ("127.0.0.1", ("127.0.0.1", None)),
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("[::1]:80", ("::1", 80)),
        ("[::1]", ("::1", None)),
        ("Example.COM:1", ("example.com", 1)),
        ("", None),
        (":80", None),
        ("a:b", None),
        ("a:99999", None),
        ("[::1", None),
        ("[::1]x", None),
        ("::1", None),
    ],
)
def test_a_host_header_is_split_into_name_and_port(
    value: str, split: tuple[str, int | None] | None
) -> None:
    assert split_host(value) == split


def _client(allowed_hosts: Any = ()) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"got": await request.json()})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/health", health)])
    return testclient.TestClient(
        RequestGuard(app, allowed_hosts=allowed_hosts), base_url="http://127.0.0.1:8000"
    )


def test_loopback_names_pass_and_others_are_403_naming_the_flag() -> None:
    client = _client()
    for host in ("127.0.0.1:8000", "localhost", "[::1]:8000", "127.0.0.2"):
        assert client.get("/health", headers={"Host": host}).status_code == 200, host
    r = client.get("/health", headers={"Host": "attacker.example:8000"})
    assert r.status_code == 403
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "Host",
        "code": "host_not_allowed",
    }
    assert "--allowed-host" in r.json()["error"]["message"]
    assert client.get("/health", headers={"Host": "a:b"}).json()["error"]["code"] == "bad_host"


def test_allowed_hosts_add_names_and_none_takes_any() -> None:
    client = _client(["myhost.lan"])
    assert client.get("/health", headers={"Host": "MyHost.lan:8000"}).status_code == 200
    assert client.get("/health", headers={"Host": "localhost"}).status_code == 200
    assert client.get("/health", headers={"Host": "other.lan"}).status_code == 403
    anyhost = _client(None)  # a non-loopback bind with a key and no --allowed-host
    assert anyhost.get("/health", headers={"Host": "other.lan"}).status_code == 200


def test_only_the_servers_own_origin_passes() -> None:
    client = _client()
    body = {"a": 1}
    assert client.post("/echo", json=body, headers={"Origin": "http://127.0.0.1:8000"}).json() == {
        "got": body
    }
    # the scheme is not compared: behind a TLS proxy the page is https and this server http
    assert (
        client.post("/echo", json=body, headers={"Origin": "https://127.0.0.1:8000"}).status_code
        == 200
    )
    for origin in (
        "http://attacker.example",
        "null",
        "http://127.0.0.1:8001",
        "http://127.0.0.1",
        "http://127.0.0.1:8000/path",
        "file://",
        "http://localhost:8000",
    ):
        r = client.post("/echo", json=body, headers={"Origin": origin})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin
    assert client.post("/echo", json=body).status_code == 200  # no Origin: not a browser page


def test_a_body_must_be_declared_json() -> None:
    client = _client()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/jsonx", ""):
        r = client.post("/echo", content=b'{"a": 1}', headers={"Content-Type": ctype})
        assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type", ctype
    r = client.post(
        "/echo", content=b'{"a": 1}', headers={"Content-Type": "Application/JSON; charset=utf-8"}
    )
    assert r.json() == {"got": {"a": 1}}


def test_every_response_has_the_security_headers_once() -> None:
    client = _client()
    for r in (
        client.get("/health"),
        client.get("/nothing"),
        client.post("/echo", content=b"x"),
        client.get("/health", headers={"Host": "attacker.example"}),
    ):
        assert (
            r.headers["x-frame-options"] == "DENY"
            and r.headers["x-content-type-options"] == "nosniff"
        )
        assert r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["content-security-policy"].startswith("default-src 'none'")
        assert len(r.headers.get_list("x-frame-options")) == 1


def test_a_form_is_taken_on_the_transcription_path_only_and_never_from_another_site() -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def size(request: Request) -> JSONResponse:
        return JSONResponse({"bytes": len(await request.body())})

    app = Starlette(
        routes=[Route(p, size, methods=["POST"]) for p in ("/v1/audio/transcriptions", "/echo")]
    )
    client = testclient.TestClient(RequestGuard(app), base_url="http://127.0.0.1:8000")
    form = {"files": {"file": ("q.wav", b"RIFF")}, "data": {"model": "m"}}
    assert client.post("/v1/audio/transcriptions", **form).status_code == 200
    r = client.post("/echo", **form)  # a form anywhere else: what a page posts unasked
    assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type"
    r = client.post(
        "/v1/audio/transcriptions", **form, headers={"Origin": "http://attacker.example"}
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
