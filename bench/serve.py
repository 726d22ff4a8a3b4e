"""What serving costs: the HTTP API against the in-process Python API, and 8 clients at once.

    python bench/serve.py [--config configs/voice-assistant.yaml] [--repeat 5] [--clients 8]
                          [--tokens 32] [--json FILE]

In one run, side by side:

* **HTTP vs in-process.** ``omni-edge serve CONFIG`` in a subprocess, driven by
  the official ``openai`` client and by a bare httpx client reading the SSE
  lines (streamed chat completion with ``modalities: ["text", "audio"]``;
  the difference between the two is the openai client's own parsing), and
  ``Pipeline`` in this process, driven
  by ``Pipeline.stream`` — the same messages and sampling, requests
  interleaved one at a time so the two never compete for the cores. Reported:
  median time to first token (first text piece) and to first audio (first
  audio chunk), and HTTP minus in-process. Targets (the serving work): +5 ms and
  +10 ms. The voice's output varies from run to run (Piper samples its noise),
  so the time to first audio of two runs of one prompt differs by tens of ms
  whatever carries it: the bench sets ``OMNI_EDGE_PIPER_DETERMINISTIC=1``
  (noise off, in both pipelines; ``--natural-voice`` leaves it on), and also
  reads the server's own clock
  for each HTTP request (``/v1/status``) and reports what HTTP adds on top of
  the pipeline for the very same request — the transport cost, unblurred.
* **8 clients at once vs one by one** (HTTP): the same ``--clients`` requests
  sent one after another, then all at once. Reported: throughput
  (requests/s) and its ratio, p50/p95 time to first audio of each, and how
  many cores the server's processes kept busy in each (their CPU time over the
  wall time): one by one at B of N cores, at once cannot beat N / B × one by one
  unless a request costs less CPU when batched.
* **Cold start of the server**: launch of ``omni-edge serve`` to the first
  ``/health`` that answers 200 (planning, evidence read, Ray, actors, loads).
  ``bench/startup.py`` sets it against Ray's start plus the slowest stage's
  load measured alone.

Every reply is fixed at ``--tokens`` tokens (``min_tokens = max_tokens``, an
extension field the server takes like vLLM's own server), so both paths do the
same decoding work whatever the model says on this CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = [
    "Tell me one fact about the Moon.",
    "What is a good name for a small grey cat?",
    "Give me a tip for sleeping better.",
    "Why is the sky blue?",
]
TTFT_TARGET_S = 0.005
TTFA_TARGET_S = 0.010
READY_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    config: str, port: int, profile: str | None
) -> tuple[subprocess.Popen[bytes], float]:
    """``omni-edge serve`` in a subprocess; (process, seconds from launch to /health 200)."""
    exe = Path(sys.executable).with_name("omni-edge")
    cmd = [str(exe), "serve", config, "--port", str(port)] + (
        ["--profile", profile] if profile else []
    )
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while time.perf_counter() - t0 < READY_TIMEOUT_S:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise SystemExit(f"omni-edge serve exited with {proc.returncode}:\n{err[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"omni-edge serve was not ready in {READY_TIMEOUT_S:.0f} s")


def stop_server(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


async def over_http(client: Any, prompt: str, tokens: int) -> dict[str, Any]:
    """One streamed chat completion with audio; times on this side of the socket."""
    t0 = time.perf_counter()
    first_text = first_audio = None
    audio_bytes = 0
    rid = None
    stream = await client.chat.completions.create(
        model="pipeline",
        messages=messages(prompt),
        stream=True,
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "pcm16"},
        max_tokens=tokens,
        temperature=0.0,
        extra_body={"min_tokens": tokens},
    )
    async for chunk in stream:
        rid = rid or chunk.id.removeprefix("chatcmpl-")
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        audio = getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio")
        if audio is not None and not isinstance(audio, dict):
            audio = audio.model_dump()
        now = time.perf_counter() - t0
        if (delta.content or (audio and audio.get("transcript"))) and first_text is None:
            first_text = now
        if audio and audio.get("data"):
            first_audio = now if first_audio is None else first_audio
            audio_bytes += len(base64.b64decode(audio["data"]))
    return {
        "ttft": first_text,
        "ttfa": first_audio,
        "total": time.perf_counter() - t0,
        "audio_s": audio_bytes / 2 / 24000,
        "rid": rid,
    }


async def over_raw_http(client: Any, port: int, prompt: str, tokens: int) -> dict[str, Any]:
    """The same request with a bare HTTP client (httpx, SSE lines read as they come):
    the transport's cost without the ``openai`` client's own parsing."""
    body = {
        "model": "pipeline",
        "messages": messages(prompt),
        "stream": True,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0.0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "default", "format": "pcm16"},
    }
    t0 = time.perf_counter()
    first_text = first_audio = None
    async with client.stream(
        "POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body
    ) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter() - t0
            if first_text is None and '"transcript"' in line:
                first_text = now
            if first_audio is None and '"data"' in line:
                first_audio = now
    return {"ttft": first_text, "ttfa": first_audio, "total": time.perf_counter() - t0}


async def server_clock(port: int, rows: list[dict[str, Any]]) -> None:
    """Add to each of ``rows`` still in the server's ``/v1/status`` (its last requests)
    the server's own timings of that request and the difference: what HTTP, JSON,
    base64 and the client add on top of the pipeline. Read once, after the requests,
    so the reading never overlaps one."""

    def status() -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10) as r:
            return json.load(r)

    recent = {e["request_id"]: e for e in (await asyncio.to_thread(status)).get("recent", [])}
    for row in rows:
        mine = recent.get(row.get("rid") or "")
        for key, field in (("ttft", "time_to_first_token_s"), ("ttfa", "time_to_first_audio_s")):
            if mine and row[key] is not None and mine.get(field) is not None:
                row[f"{key}_server"] = mine[field]
                row[f"{key}_added"] = row[key] - mine[field]


async def in_process(pipeline: Any, prompt: str, tokens: int) -> dict[str, Any]:
    from orchestrator.runtime.events import AudioChunk, TextDelta

    t0 = time.perf_counter()
    first_text = first_audio = None
    audio_s = 0.0
    request = {
        "messages": messages(prompt),
        "sampling": {"max_tokens": tokens, "min_tokens": tokens, "temperature": 0.0},
    }
    async for event in pipeline.stream(request):
        now = time.perf_counter() - t0
        if isinstance(event, TextDelta) and event.text and first_text is None:
            first_text = now
        if isinstance(event, AudioChunk):
            first_audio = now if first_audio is None else first_audio
            audio_s += event.seconds
    return {
        "ttft": first_text,
        "ttfa": first_audio,
        "total": time.perf_counter() - t0,
        "audio_s": audio_s,
    }


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the process ``pid`` and every process under it now (the
    server, Ray's processes and the device actors it started)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def med(rows: list[dict[str, Any]], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:8.1f}ms"


def verdict(value: float | None, target: float) -> str:
    return "n/a" if value is None else ("met" if value <= target else "MISSED")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import httpx
    from openai import AsyncOpenAI

    from orchestrator.api import Pipeline

    port = free_port()
    proc, cold_s = start_server(args.config, port, args.profile)
    out: dict[str, Any] = {"server_cold_start_s": round(cold_s, 3), "tokens": args.tokens}
    print(f"server ready in {cold_s:.1f} s (launch → /health 200)", flush=True)
    try:
        client = AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300
        )
        raw = httpx.AsyncClient(timeout=300)
        pipeline = await Pipeline.open(args.config, profile=args.profile, record=None)
        try:
            await over_http(client, PROMPTS[0], args.tokens)  # warm-ups
            await over_raw_http(raw, port, PROMPTS[0], args.tokens)
            await in_process(pipeline, PROMPTS[0], args.tokens)
            http_rows, raw_rows, api_rows = [], [], []
            for i in range(args.repeat):
                prompt = PROMPTS[i % len(PROMPTS)]
                raw_rows.append(await over_raw_http(raw, port, prompt, args.tokens))
                api_rows.append(await in_process(pipeline, prompt, args.tokens))
                http_rows.append(await over_http(client, prompt, args.tokens))
            await server_clock(port, http_rows)
        finally:
            await raw.aclose()
            await asyncio.to_thread(pipeline.close)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.clients)]
        cpu0, t0 = tree_cpu_s(proc.pid), time.perf_counter()
        serial = [await over_http(client, p, args.tokens) for p in prompts]
        serial_s = time.perf_counter() - t0
        cpu1, t0 = tree_cpu_s(proc.pid), time.perf_counter()
        concurrent = await asyncio.gather(*(over_http(client, p, args.tokens) for p in prompts))
        concurrent_s = time.perf_counter() - t0
        cpu2 = tree_cpu_s(proc.pid)
        busy = {"serial": (cpu1 - cpu0) / serial_s, "concurrent": (cpu2 - cpu1) / concurrent_s}
    finally:
        out["server_exit"] = stop_server(proc)
    for name, rows in (("http", http_rows), ("http_raw", raw_rows), ("in_process", api_rows)):
        keys = ("ttft", "ttfa", "total", "ttft_added", "ttfa_added")
        out[name] = {k: med(rows, k) for k in keys} | {"rows": rows}
    for name, rows, wall in (
        ("serial", serial, serial_s),
        ("concurrent", list(concurrent), concurrent_s),
    ):
        ttfa = [r["ttfa"] for r in rows if r["ttfa"] is not None]
        out[name] = {
            "wall_s": wall,
            "throughput_rps": len(rows) / wall,
            "ttfa_p50": pct(ttfa, 0.5),
            "ttfa_p95": pct(ttfa, 0.95),
            "answered": sum(r["total"] is not None for r in rows),
            "cores_busy": busy[name],
        }
    out["cores"] = os.cpu_count()
    return out


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    h, a = out["http"], out["in_process"]
    print(f"\nHTTP vs in-process, medians of {args.repeat} ({args.tokens} tokens each)")
    for client_name, row in (("httpx (bare SSE)", out["http_raw"]), ("openai client", h)):
        print(f"{client_name:24}{'http':>10}{'in-proc':>10}{'delta':>10}{'target':>10}  verdict")
        for key, label, target in (
            ("ttft", "time to first token", TTFT_TARGET_S),
            ("ttfa", "time to first audio", TTFA_TARGET_S),
            ("total", "total", None),
        ):
            d = None if row[key] is None or a[key] is None else row[key] - a[key]
            tgt = f"+{target * 1000:.0f}ms" if target else ""
            print(
                f"  {label:22}{ms(row[key]):>10}{ms(a[key]):>10}{ms(d):>10}{tgt:>10}  "
                f"{verdict(d, target) if target else ''}"
            )
    found = sum("ttft_added" in r for r in h["rows"])
    print(f"openai client on top of the server's clock (the same requests, {found} of them)")
    for key, label, target in (
        ("ttft_added", "  time to first token", TTFT_TARGET_S),
        ("ttfa_added", "  time to first audio", TTFA_TARGET_S),
    ):
        print(
            f"{label:24}{'':>10}{'':>10}{ms(h[key]):>10}{f'+{target * 1000:.0f}ms':>10}  "
            f"{verdict(h[key], target)}"
        )
    s, c = out["serial"], out["concurrent"]
    print(f"\n{args.clients} clients: one by one vs at once (HTTP)")
    print(f"{'':24}{'req/s':>10}{'ttfa p50':>10}{'ttfa p95':>10}{'answered':>10}")
    for name, row in (("one by one", s), ("at once", c)):
        print(
            f"{name:24}{row['throughput_rps']:>10.3f}{ms(row['ttfa_p50']):>10}{ms(row['ttfa_p95']):>10}"
            f"{row['answered']:>10}"
        )
    print(
        f"throughput ratio (at once / one by one): {c['throughput_rps'] / s['throughput_rps']:.2f}x"
    )
    cores, busy = out.get("cores"), s.get("cores_busy")
    if cores and busy:
        print(
            f"cores busy (the server's CPU time / wall): one by one {busy:.2f}, "
            f"at once {c.get('cores_busy', 0.0):.2f} of {cores}"
        )
        print(
            f"at once, at most {cores} / {busy:.2f} = {cores / busy:.2f}x one by one (same CPU a request)"
        )
    print(
        f"\nserver cold start (launch → /health 200): {out['server_cold_start_s']:.1f} s; "
        f"server exit on SIGTERM: {out['server_exit']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/voice-assistant.yaml"))
    ap.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    ap.add_argument(
        "--repeat", type=int, default=12, help="interleaved HTTP/in-process requests (default 12)"
    )
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per reply, fixed (default 32)")
    ap.add_argument(
        "--natural-voice",
        action="store_true",
        help="leave the voice's noise on (its audio then varies from run to run)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not args.natural_voice:
        os.environ["OMNI_EDGE_PIPER_DETERMINISTIC"] = "1"  # inherited by the server and by Ray
    out = asyncio.run(bench(args))
    report(out, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
