"""``omni-edge serve CONFIG``: one long-lived pipeline behind an OpenAI-compatible API.

Plans, verifies and starts the pipeline once (``Pipeline.from_config``, the path
``run`` takes), then serves ``orchestrator.server``'s app with uvicorn until
SIGINT or SIGTERM. Stopping drains: uvicorn stops accepting connections at
once, requests in flight get up to ``--drain-timeout`` seconds to finish (then
they are cancelled, which cancels them on every stage), and only then is the
pipeline closed (every reservation released; the final ledger is printed). A
second SIGINT while draining stops at once. uvicorn's own handlers catch the
signals while it serves and re-raise them once it has stopped; this command
records them then (``stopped by SIGTERM``), so the pipeline is always closed.
The socket is bound before anything starts: a port in use is exit 2 at once,
and ``--port 0`` prints the port it got.

What one request may carry is bounded by the ``--max-*`` flags (body size,
messages, text, speech input, a recording's bytes and seconds:
``orchestrator.server.ServerLimits``, docs/serving.md "Request limits"); a flag
that is not a positive number is exit 2 before anything starts.

Loopback only by default: binding any other address needs ``--api-key`` (exit 2
before anything starts otherwise); with a key every request needs
``Authorization: Bearer KEY``. A signal before the pipeline started exits 128+N
like ``run``; one while serving is the normal way to stop (exit 0 once closed).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.server.protocol import ServerLimits

API_KEY_ENV = "OMNI_EDGE_API_KEY"
DRAIN_TIMEOUT_S = 30.0
"""How long a stop waits for requests in flight: a long reply with its audio takes seconds."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from orchestrator.commands.plan import add_calibration_flag, add_pipeline_inputs

    add_pipeline_inputs(p, profile_help="plan for a recorded hardware profile instead of probing this machine")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any non-loopback address needs --api-key)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on every request (default: ${API_KEY_ENV})")
    p.add_argument("--address", metavar="ADDR", help="join an existing Ray cluster instead of starting a local one "
                   "(without --profile: plan on its nodes, each probed where it runs)")
    p.add_argument("--ray-logs", action="store_true", help="show the actors' logs (vLLM, ONNX Runtime) on stderr")
    p.add_argument("--skip-verify", action="store_true",
                   help="run exported placements that have no gate evidence yet (default: verify them first)")
    p.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT_S, metavar="S",
                   help=f"on SIGINT/SIGTERM, seconds requests in flight may take to finish (default {DRAIN_TIMEOUT_S:g})")
    p.add_argument("--max-waiting", type=int, metavar="N",
                   help="requests that may wait for a slot beyond those in flight; more are answered 429 "
                        "(default: as many as may be in flight)")
    add_limit_arguments(p)
    add_calibration_flag(p)


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """What one request may carry (``orchestrator.server.ServerLimits``; each named in the 413/400)."""
    from orchestrator.server.protocol import ServerLimits
    from orchestrator.units import MiB

    d = ServerLimits()
    g = p.add_argument_group("request limits (each named, with its value, in the 400/413 that refuses a request)")
    g.add_argument("--max-body-mib", type=float, metavar="MIB", default=d.max_body_bytes / MiB,
                   help=f"largest request body (default {d.max_body_bytes / MiB:g} MiB; 413 over it)")
    g.add_argument("--max-messages", type=int, metavar="N", default=d.max_messages,
                   help=f"messages per chat request (default {d.max_messages})")
    g.add_argument("--max-content-chars", type=int, metavar="N", default=d.max_content_chars,
                   help=f"characters of text in a chat request's messages (default {d.max_content_chars})")
    g.add_argument("--max-speech-chars", type=int, metavar="N", default=d.max_speech_chars,
                   help=f"characters of /v1/audio/speech input (default {d.max_speech_chars}, OpenAI's)")
    g.add_argument("--max-audio-mib", type=float, metavar="MIB", default=d.max_audio_bytes / MiB,
                   help=f"a recording's WAV size (default {d.max_audio_bytes / MiB:g} MiB)")
    g.add_argument("--max-audio-seconds", type=float, metavar="S", default=d.max_audio_seconds,
                   help=f"a recording's duration (default {d.max_audio_seconds:g} s)")


def limits_of(args: argparse.Namespace) -> ServerLimits:
    """The flags as ``ServerLimits``; ``ConfigError`` (exit 2) for one that is not a positive number."""
    import math

    from orchestrator.errors import ConfigError, Problem
    from orchestrator.server.protocol import ServerLimits
    from orchestrator.units import MiB

    given = {"--max-body-mib": args.max_body_mib, "--max-messages": args.max_messages,
             "--max-content-chars": args.max_content_chars, "--max-speech-chars": args.max_speech_chars,
             "--max-audio-mib": args.max_audio_mib, "--max-audio-seconds": args.max_audio_seconds}
    problems = [Problem(flag, f"{value!r} is not a positive number", "give a number above 0")
                for flag, value in given.items() if not (math.isfinite(value) and value > 0)]
    if args.max_body_mib * MiB < 1 or args.max_audio_mib * MiB < 1:
        problems.append(Problem("--max-body-mib/--max-audio-mib", "is less than a byte", "give at least 0.001 MiB"))
    if problems:
        raise ConfigError(problems)
    return ServerLimits(max_body_bytes=int(args.max_body_mib * MiB), max_messages=args.max_messages,
                        max_content_chars=args.max_content_chars, max_speech_chars=args.max_speech_chars,
                        max_audio_bytes=int(args.max_audio_mib * MiB), max_audio_seconds=float(args.max_audio_seconds))


def check_bind(host: str, port: int, api_key: str | None, *, drain_timeout: float = DRAIN_TIMEOUT_S,
               max_waiting: int | None = None) -> None:
    """``ConfigError`` (exit 2) for a bind or a bound that must not be, before anything starts."""
    from orchestrator.errors import ConfigError
    from orchestrator.server import is_loopback

    if not 0 <= port <= 65535:
        raise ConfigError.single("--port", f"{port} is not a port", "use 1-65535, or 0 for a free one")
    if drain_timeout < 0:
        raise ConfigError.single("--drain-timeout", f"{drain_timeout:g} is negative", "use 0 or more seconds")
    if max_waiting is not None and max_waiting < 0:
        raise ConfigError.single("--max-waiting", f"{max_waiting} is negative", "use 0 (refuse at once) or more")
    if not is_loopback(host) and not api_key:
        raise ConfigError.single(
            "--host", f"{host} is not a loopback address, and no --api-key is set: anyone who can reach it "
            "could drive the pipeline", f"bind 127.0.0.1 (the default), or pass --api-key KEY (or set ${API_KEY_ENV})")


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.run import (
        Interrupted,
        _install_signal_handlers,
        _restore_signal_handlers,
    )

    check_bind(args.host, args.port, args.api_key, drain_timeout=args.drain_timeout, max_waiting=args.max_waiting)
    limits = limits_of(args)
    sock = bind(args.host, args.port)
    old = _install_signal_handlers()
    try:
        return _serve(args, sock, limits)
    except Interrupted as exc:  # before serving (planning, verifying, starting)
        print(f"interrupted by {signal.Signals(exc.signum).name} before the pipeline started", file=sys.stderr)
        return 128 + exc.signum
    finally:
        _restore_signal_handlers(old)
        sock.close()


def bind(host: str, port: int) -> socket.socket:
    """The listening address, bound before anything starts (a port in use is exit 2
    at once, not after the pipeline's start); uvicorn listens on it."""
    from orchestrator.errors import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError.single("--host/--port", f"cannot bind {host}:{port}: {exc.strerror or exc}",
                                 "pick another --port (0: any free one), or stop what holds it") from None
    return sock


def _serve(args: argparse.Namespace, sock: socket.socket, limits: ServerLimits) -> int:
    import uvicorn

    from orchestrator.api import Pipeline
    from orchestrator.cli import EXIT_OK
    from orchestrator.console import make_console
    from orchestrator.server import create_app

    console = make_console(stderr=True)
    console.print("[dim]planning, verifying and starting the pipeline …[/]")
    profile = args.profile
    if args.address and not profile:
        from orchestrator.commands.run import cluster_profile

        profile = cluster_profile(args.address, console)
    pipeline = Pipeline.from_config(args.config, profile=profile, mask=args.mask, address=args.address,
                                    record=None, progress=True, log_to_driver=args.ray_logs,
                                    verify=not args.skip_verify, max_waiting=args.max_waiting,
                                    calibration=not args.no_calibration, server=True)
    stopped_by: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        config = uvicorn.Config(create_app(pipeline, api_key=args.api_key, limits=limits), host=args.host, port=args.port,
                                log_level="warning", lifespan="off", timeout_graceful_shutdown=args.drain_timeout)
        server = uvicorn.Server(config)
        port = sock.getsockname()[1]
        names = ", ".join(f"{s.name} on {s.device}" for s in pipeline.plan.stages)
        host = f"[{args.host}]" if ":" in args.host else args.host
        console.print(f"serving {pipeline.plan.pipeline!r} ({names}) on http://{host}:{port}/v1 "
                      f"{'(API key required)' if args.api_key else ''}— Ctrl-C to stop", soft_wrap=True)
        # uvicorn re-raises the signal that stopped it once it has shut down; what it
        # finds then is this recorder, so the pipeline is closed below, not skipped.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
        server.run(sockets=[sock])
    finally:
        t0 = time.perf_counter()
        final = pipeline.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    held = (final or {}).get("held_bytes")
    why = f"stopped by {signal.Signals(stopped_by[0]).name}" if stopped_by else "stopped"
    console.print(f"{why}: closed the pipeline in {time.perf_counter() - t0:.1f} s; ledger holds {held or 0} bytes")
    for pool in (final or {}).get("pools", []):
        console.print(f"  {pool['id']}: {pool['held_bytes']} bytes held of {pool['capacity_bytes']}")
    return EXIT_OK
