"""A soak of a served pipeline that heals itself: mixed traffic against a real ``omni-edge
serve`` while a fault injector kills a device actor and a route worker at random times.

    python bench/soak.py [--minutes 6] [--config CONFIG ...] [--kill-every MIN MAX]
                         [--seed 7] [--chat-clients 2] [--request-timeout 300] [--json FILE]

For each config (default: the default pipeline, configs/voice-assistant.yaml, then
configs/examples/voice-chat.yaml), in one run:

* ``omni-edge serve CONFIG`` as a user starts it (a subprocess with its own Ray, a private
  measurement store so the soak's kills never calibrate a plan);
* traffic for ``--minutes`` (it stops by itself): ``--chat-clients`` HTTP chats with audio one
  after another each, one client whose streamed chats it drops after the first audio chunk,
  and — for a pipeline that takes audio — one client of ``/v1/realtime`` sessions with
  barge-in (a spoken question, then a second one spoken over the first reply's audio, which
  cuts it; the second reply is the session's outcome);
* a fault injector that waits a random time in ``--kill-every`` (seeded) and then SIGKILLs, in
  turn, a device actor and a route worker of the serve (as the OOM killer would), and times
  each recovery: the kill to ``/health`` answering 200 again.

It prints, per config: requests served, failed with a named error (by code), failed
otherwise, hung (no answer within ``--request-timeout``: must be 0), dropped by the client;
the kills and the restarts ``/metrics`` counted, by cause; time to recover (median, max); the
server tree's memory (the serve process, its Ray and every worker under it; the serve
process alone; its route workers) at the start, the middle and the end, and its slope;
admission slots leaked once the traffic stopped (requests in flight at idle: must be 0); the
ledger's held bytes before and after (equal).
Exit 1 when a request hung, a slot leaked, the ledger differs or the server failed to stop
cleanly; the figures are kept in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.core.memory import tree_memory  # noqa: E402
from tests.helpers.serve import ServeProcess  # noqa: E402

DEFAULT_CONFIGS = ["configs/voice-assistant.yaml", "configs/examples/voice-chat.yaml"]
QUESTIONS = [
    "Tell me one fact about the Moon.",
    "What is a good name for a small grey cat?",
    "Give me a tip for sleeping better.",
]
SPOKEN = ("What is the tallest mountain in the world?", "How far away is the Moon from the Earth?")
RATE = 24000
HEALTH_POLL_S = 0.2


class Tally:
    """What the clients saw, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served: Counter[str] = Counter()
        self.named: Counter[str] = Counter()
        self.other: list[str] = []
        self.hung: list[str] = []
        self.dropped = 0

    def ok(self, kind: str) -> None:
        with self.lock:
            self.served[kind] += 1

    def failed(self, code: str | None, what: str) -> None:
        with self.lock:
            if code:
                self.named[code] += 1
            else:
                self.other.append(what[:300])

    def hang(self, what: str) -> None:
        with self.lock:
            self.hung.append(what)

    def drop(self) -> None:
        with self.lock:
            self.dropped += 1


def _code(response: Any) -> str | None:
    try:
        return str(response.json()["error"]["code"])
    except Exception:
        return None


def _content(text: str, wav: str | None) -> Any:
    """A user message's content: the text, or (a pipeline that takes audio) the spoken WAV."""
    if wav is None:
        return text
    return [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]


def chat_body(text: str, wav: str | None, max_tokens: int, **more: Any) -> dict[str, Any]:
    """A chat the soak sends: ``text`` asked in words, or (``wav``: a base64 WAV) aloud, its
    reply spoken. ``max_tokens`` only with text: the server refuses sampling beside
    ``input_audio`` (the config's applies)."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": _content(text, wav)}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "joe", "format": "pcm16"},
        **more,
    }
    if wav is None:
        body["max_tokens"] = max_tokens
    return body


def _back_off(stop: threading.Event, response: Any = None) -> None:
    """After a failure, wait as a client should: its ``Retry-After``, else half a second."""
    retry = response.headers.get("retry-after") if response is not None else None
    stop.wait(float(retry) if retry and retry.isdigit() else 0.5)


def chat_client(
    url: str, tally: Tally, stop: threading.Event, timeout_s: float, n: int, wavs: list[str] | None
) -> None:
    """HTTP chats with audio, one after another, until ``stop``."""
    import httpx

    i = n
    while not stop.is_set():
        wav = wavs[i % len(wavs)] if wavs else None
        body = chat_body(QUESTIONS[i % len(QUESTIONS)], wav, 24)
        i += 1
        try:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
        except httpx.TimeoutException:
            tally.hang(f"chat {i}")
            continue
        except httpx.HTTPError as exc:
            tally.failed(None, f"chat: {type(exc).__name__}: {exc}")
            _back_off(stop)
            continue
        if r.status_code == 200 and r.json()["choices"][0]["message"]["audio"]["data"]:
            tally.ok("chat")
        else:
            tally.failed(_code(r), f"chat: {r.status_code} {r.text[:200]}")
            _back_off(stop, r)


def dropping_client(
    url: str, tally: Tally, stop: threading.Event, timeout_s: float, wavs: list[str] | None
) -> None:
    """Streamed chats dropped (the connection closed) after their first audio chunk."""
    import httpx

    text = "Tell me a long story about a dragon."
    body = chat_body(text, wavs[0] if wavs else None, 64, stream=True)
    while not stop.is_set():
        try:
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=body, timeout=timeout_s
            ) as r:
                if r.status_code != 200:
                    r.read()
                    tally.failed(_code(r), f"stream: {r.status_code}")
                    _back_off(stop, r)
                    continue
                outcome = "served"
                for line in r.iter_lines():
                    if '"error"' in line:
                        doc = json.loads(line.removeprefix("data: "))
                        tally.failed(str(doc["error"].get("code")), "stream: error event")
                        outcome = "failed"
                        _back_off(stop)
                        break
                    if '"data"' in line and '"audio"' in line:
                        outcome = "dropped"
                        break  # leaving the block closes the connection: the client went away
                if outcome == "dropped":
                    tally.drop()
                elif outcome == "served":
                    tally.ok("stream")
        except httpx.TimeoutException:
            tally.hang("stream")
        except httpx.HTTPError as exc:
            tally.failed(None, f"stream: {type(exc).__name__}: {exc}")
            _back_off(stop)


def realtime_client(
    url: str, tally: Tally, stop: threading.Event, timeout_s: float, speech: list[str]
) -> None:
    """Realtime sessions with barge-in: a question, the second spoken over the first reply."""
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/v1/realtime"
    silence = base64.b64encode(b"\0\0" * (RATE // 10)).decode()  # 100 ms
    while not stop.is_set():
        try:
            with connect(ws_url, open_timeout=60, max_size=None) as ws:
                outcome = _barge_in_session(ws, speech, silence, timeout_s)
        except TimeoutError:
            tally.hang("realtime")
            continue
        except Exception as exc:
            tally.failed(None, f"realtime: {type(exc).__name__}: {exc}")
            _back_off(stop)
            continue
        if outcome is None:
            tally.ok("realtime")
        else:
            tally.failed(outcome, "realtime")
            _back_off(stop)


def _barge_in_session(ws: Any, speech: list[str], silence: str, timeout_s: float) -> str | None:
    """One session: None when the second reply completed, else the code its failure named."""
    deadline = time.monotonic() + timeout_s

    def send_turn(chunks: list[str], pause: int) -> None:
        for chunk in chunks + [silence] * pause:
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))

    assert json.loads(ws.recv(timeout=60))["type"] == "session.created"
    send_turn([silence] * 5 + [speech[0]], pause=12)
    barged = False
    errors: list[str] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no reply")
        event = json.loads(ws.recv(timeout=left))
        kind = event["type"]
        if kind == "error":
            errors.append(str(event["error"].get("code")))
        elif kind == "response.audio.delta" and not barged:
            barged = True
            send_turn([speech[1]], pause=15)  # spoken over the reply: it is cut
        elif kind == "response.done":
            status = event["response"]["status"]
            if status == "cancelled":
                continue  # the barge-in's cut: the second turn follows
            if status == "completed" and barged:
                return None
            if status == "failed":
                failed = event["response"].get("status_details") or {}
                return str((failed.get("error") or {}).get("code") or (errors or ["failed"])[-1])
            if not barged:  # completed before any audio went out: no barge-in this time
                return None


def injector(
    serve: ServeProcess,
    url: str,
    stop: threading.Event,
    rng: random.Random,
    every: tuple[float, float],
    kills: list[dict[str, Any]],
) -> None:
    """Until ``stop``: wait, kill a device actor or a route worker (in turn), time the recovery."""
    import httpx

    turn = 0
    while not stop.wait(rng.uniform(*every)):
        kind = ("device actor", "route worker")[turn % 2]
        turn += 1
        pids = serve.device_actors() if kind == "device actor" else serve.route_workers()
        if not pids:
            continue
        pid = rng.choice(pids)
        counts = (len(serve.device_actors()), len(serve.route_workers()))
        t0 = time.monotonic()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        recovered = None
        while time.monotonic() - t0 < 600:
            # back: /health 200 with as many actors and route workers as before, none the dead one
            actors, workers = serve.device_actors(), serve.route_workers()
            back = (len(actors), len(workers)) == counts and pid not in actors + workers
            try:
                if back and httpx.get(f"{url}/health", timeout=30).status_code == 200:
                    recovered = round(time.monotonic() - t0, 2)
                    break
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
        kills.append({"kind": kind, "pid": pid, "recovered_s": recovered})
        print(f"  killed the {kind} pid {pid}: /health 200 again in {recovered} s", flush=True)


def _metrics(url: str) -> dict[str, float]:
    import httpx

    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _held(url: str) -> int:
    return int(
        sum(v for k, v in _metrics(url).items() if k.startswith("omni_edge_ledger_held_bytes"))
    )


def _memory(serve: ServeProcess) -> dict[str, int]:
    """The server tree's memory (PSS, else RSS): all of it, the serve process alone, and its
    route workers (which grow with the shapes they meet until recycled at their budget)."""
    workers = serve.route_workers()
    return {
        "tree": tree_memory([serve.proc.pid, *(p.pid for p in serve._tree())])[0],
        "serve": tree_memory([serve.proc.pid])[0],
        "route_workers": tree_memory(workers)[0] if workers else 0,
    }


def _healthy(url: str, wait_s: float = 600.0) -> None:
    import httpx

    deadline = time.monotonic() + wait_s
    while httpx.get(f"{url}/health", timeout=30).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"/health not 200 within {wait_s:g} s")
        time.sleep(HEALTH_POLL_S)


def soak(
    config: str, args: argparse.Namespace, speech: list[str], wavs: list[str]
) -> dict[str, Any]:
    """One config's soak: the serve, the traffic and the faults, the figures."""
    import httpx

    rng = random.Random(args.seed)
    env = {"OMNI_EDGE_CALIBRATION_DIR": tempfile.mkdtemp(prefix="oe-soak-cal-")}
    workdir = Path(tempfile.mkdtemp(prefix="oe-soak-"))
    serve = ServeProcess(REPO / config, cwd=workdir, start_timeout_s=900, env=env)
    url = serve.url
    try:
        takes_audio = _takes_audio(url)
        httpx.post(  # warm: the first request loads what a request needs
            f"{url}/v1/chat/completions",
            json=chat_body("Hello.", wavs[0] if takes_audio else None, 8),
            timeout=args.request_timeout,
        )
        held_before, memory = _held(url), [_memory(serve)]
        tally, stop, kills = Tally(), threading.Event(), []
        spoken = wavs if takes_audio else None  # a pipeline that takes audio is asked aloud
        clients: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (chat_client, (url, tally, stop, args.request_timeout, n, spoken))
            for n in range(args.chat_clients)
        ]
        clients.append((dropping_client, (url, tally, stop, args.request_timeout, spoken)))
        if takes_audio:
            clients.append((realtime_client, (url, tally, stop, args.request_timeout, speech)))
        threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in clients]
        faults = threading.Thread(
            target=injector,
            args=(serve, url, stop, rng, tuple(args.kill_every), kills),
            daemon=True,
        )
        t0 = time.monotonic()
        for t in [*threads, faults]:
            t.start()
        minutes = args.minutes * 60
        stop.wait(minutes / 2)
        memory.append(_memory(serve))
        stop.wait(minutes / 2)
        stop.set()
        for t in [*threads, faults]:
            t.join(args.request_timeout + 660)
        soaked = time.monotonic() - t0
        _healthy(url)
        queue = httpx.get(f"{url}/v1/status", timeout=60).json()["queue"]
        memory.append(_memory(serve))
        held_after = _held(url)
        restarts: Counter[str] = Counter()  # by cause, over every stage
        for k, v in _metrics(url).items():
            if k.startswith("omni_edge_stage_restarts_total"):
                restarts[k.split('cause="')[1].split('"')[0]] += int(v)
    finally:
        rc = serve.stop(timeout_s=300)
    recovered = [k["recovered_s"] for k in kills if k["recovered_s"] is not None]
    return {
        "config": config,
        "minutes": round(soaked / 60, 1),
        "served": dict(tally.served),
        "failed_named": dict(tally.named),
        "failed_other": tally.other,
        "hung": len(tally.hung),
        "dropped_by_client": tally.dropped,
        "kills": dict(Counter(k["kind"] for k in kills)),
        "not_recovered": sum(k["recovered_s"] is None for k in kills),
        "restarts": {k: int(v) for k, v in sorted(restarts.items())},
        "recover_s": {
            "median": statistics.median(recovered) if recovered else None,
            "max": max(recovered) if recovered else None,
        },
        "memory_mib": {k: [round(m[k] / 2**20) for m in memory] for k in memory[0]},
        "memory_slope_mib_per_min": {
            k: round((memory[-1][k] - memory[0][k]) / 2**20 / (soaked / 60), 2) for k in memory[0]
        },
        "slots_leaked": int(queue["in_flight"]) + int(queue.get("waiting_for_restart", 0)),
        "ledger_held_bytes": [held_before, held_after],
        "serve_exit": rc,
    }


def _takes_audio(url: str) -> bool:
    """Whether a realtime session opens (the pipeline's entry takes audio)."""
    from websockets.sync.client import connect

    with connect(url.replace("http://", "ws://") + "/v1/realtime", open_timeout=60) as ws:
        return bool(json.loads(ws.recv(timeout=60))["type"] == "session.created")


def _speech() -> tuple[list[str], list[str]]:
    """The two spoken questions (the project's Piper voice): as base64 pcm16 at 24 kHz for a
    realtime session, and as base64 16 kHz WAV files for a chat's ``input_audio``."""
    import numpy as np

    from orchestrator.runtime.audio import resample, wav_header
    from tests.helpers.speech import speak

    pcm24, wavs = [], []
    for text in SPOKEN:
        samples, rate = speak(text)
        for out, to in ((pcm24, RATE), (wavs, 16000)):
            pcm = (np.clip(resample(samples, rate, to), -1, 1) * 32767).astype("<i2").tobytes()
            data = pcm if to == RATE else wav_header(to, len(pcm)) + pcm
            out.append(base64.b64encode(data).decode())
    return pcm24, wavs


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| pipeline | minutes | served | failed, named | failed, other | hung | dropped "
        "| kills | restarts | recover median / max (s) | memory start / mid / end (MiB) "
        "| serve process alone (MiB) | slope, tree / serve (MiB/min) | slots leaked "
        "| ledger held before / after |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- "
        "| ---: | --- |",
    ]
    for r in results:
        said = lambda d: ", ".join(f"{k} {v}" for k, v in d.items()) or "0"  # noqa: E731
        rows.append(
            f"| {Path(r['config']).name} | {r['minutes']} | {said(r['served'])} "
            f"| {said(r['failed_named'])} | {len(r['failed_other'])} | {r['hung']} "
            f"| {r['dropped_by_client']} | {said(r['kills'])} | {said(r['restarts'])} "
            f"| {r['recover_s']['median']} / {r['recover_s']['max']} "
            f"| {' / '.join(map(str, r['memory_mib']['tree']))} "
            f"| {' / '.join(map(str, r['memory_mib']['serve']))} "
            f"| {r['memory_slope_mib_per_min']['tree']} / {r['memory_slope_mib_per_min']['serve']} "
            f"| {r['slots_leaked']} | {r['ledger_held_bytes'][0]} / {r['ledger_held_bytes'][1]} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", action="append", help="a pipeline config (repeatable)")
    p.add_argument("--minutes", type=float, default=6.0, help="traffic per config (default 6)")
    p.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        default=[40.0, 80.0],
        metavar=("MIN", "MAX"),
        help="seconds between kills, drawn uniformly (default 40 80)",
    )
    p.add_argument("--seed", type=int, default=7, help="the injector's random seed (default 7)")
    p.add_argument("--chat-clients", type=int, default=2, help="HTTP chat clients (default 2)")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="a request not answered within this is hung (default 300 s)",
    )
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.kill_every[0] <= 0 or args.kill_every[1] < args.kill_every[0]:
        p.error("--minutes must be positive and --kill-every MIN MAX with 0 < MIN <= MAX")
    speech, wavs = _speech()
    results = []
    for config in args.config or DEFAULT_CONFIGS:
        print(f"soaking {config} for {args.minutes:g} min", flush=True)
        results.append(soak(config, args, speech, wavs))
        print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    bad = [
        r["config"]
        for r in results
        if r["hung"]
        or r["slots_leaked"]
        or r["not_recovered"]
        or r["ledger_held_bytes"][0] != r["ledger_held_bytes"][1]
        or r["serve_exit"] != 0
    ]
    if bad:
        print(f"FAILED: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
