"""``omni-edge serve CONFIG``: one long-lived pipeline behind an OpenAI-compatible API.

Plans, verifies and starts the pipeline once (``Pipeline.from_config``, through
``api.admit_plan``, the path ``run`` takes), then serves ``orchestrator.server``'s app with uvicorn until
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


Loopback only by default: binding any other address needs an API key (exit 2
before anything starts otherwise); with a key every request but the page's own
files needs ``Authorization: Bearer KEY``. The key comes from
``$OMNI_EDGE_API_KEY``, ``--api-key-file`` or ``--api-key`` (which other users
see in ``ps``: a warning says so); it is removed from this process's
environment before anything starts, so no Ray worker or route worker inherits
it. Every request passes ``server.guard`` (loopback or ``--allowed-host``
names, no other site's ``Origin``, JSON bodies) and every connection the bounds
of ``server.transport`` (``--max-connections``, ``--header-timeout``,
``--read-timeout``, ``--write-timeout``, ``--keep-alive-timeout``). A signal
before the pipeline started exits 128+N like ``run``; one while serving is the
normal way to stop (exit 0 once closed).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.runtime.ledger_actor import ActorSnapshot
    from orchestrator.server.limits import ServerLimits

API_KEY_ENV = "OMNI_EDGE_API_KEY"
API_KEY_FILE_MAX_BYTES = 4096
API_KEY_MIN_CHARS = 16
"""The shortest key ``serve`` starts with: 16 random hex characters are 64 bits; with wrong keys
slowed per address (``server.auth.Lockout``: a minute apart at most), out of reach."""
"""A key is a line of text; a bigger file is not a key file (read no further)."""
DRAIN_TIMEOUT_S = 30.0
"""How long a stop waits for requests in flight: a long reply with its audio takes seconds."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from orchestrator.commands.plan import add_calibration_flag, add_pipeline_inputs

    add_pipeline_inputs(
        p, profile_help="plan for a recorded hardware profile instead of probing this machine"
    )
    add_bind_arguments(p)
    add_start_arguments(p)
    add_transport_arguments(p)
    add_limit_arguments(p)
    add_calibration_flag(p)


def add_bind_arguments(p: argparse.ArgumentParser) -> None:
    """Where the server listens and who may call it: --host, --port, --allowed-host, the key."""
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; any non-loopback address needs an API key)",
    )
    p.add_argument(
        "--port", type=int, default=8000, help="port to bind (default 8000; 0 picks a free one)"
    )
    p.add_argument(
        "--allowed-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a Host name clients use besides the loopback ones (repeatable; requests naming any other "
        "host are refused, against DNS rebinding; a non-loopback --host without it takes any name)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every API request; other users see it in ps: "
        f"prefer ${API_KEY_ENV} or --api-key-file",
    )
    p.add_argument(
        "--api-key-file",
        metavar="PATH",
        type=Path,
        help=f"read the API key from this file's first line (default: ${API_KEY_ENV}, if set)",
    )


def add_start_arguments(p: argparse.ArgumentParser) -> None:
    """How the pipeline starts and stops: --address, --ray-logs, --skip-verify, the drain,
    the waiting room."""
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="join an existing Ray cluster instead of starting a local one "
        "(without --profile: plan on its nodes, each probed where it runs)",
    )
    p.add_argument(
        "--ray-logs",
        action="store_true",
        help="show the actors' logs (vLLM, ONNX Runtime) on stderr",
    )
    p.add_argument(
        "--skip-verify",
        action="store_true",
        help="run exported placements that have no gate evidence yet (default: verify them first)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=DRAIN_TIMEOUT_S,
        metavar="S",
        help=f"on SIGINT/SIGTERM, seconds requests in flight may take to finish (default {DRAIN_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        metavar="N",
        help="requests that may wait for a slot beyond those in flight; more are answered 429 "
        "(default: as many as may be in flight)",
    )


def add_transport_arguments(p: argparse.ArgumentParser) -> None:
    """What one connection may hold (``server.transport.TransportLimits``) and a realtime
    session's idle timeout."""
    from orchestrator.server.transport import (
        HEADER_TIMEOUT_S,
        KEEP_ALIVE_S,
        MAX_CONNECTIONS,
        READ_TIMEOUT_S,
        WRITE_TIMEOUT_S,
    )

    p.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        metavar="N",
        help=f"open connections at most; one more closes the one idle longest (default {MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=HEADER_TIMEOUT_S,
        metavar="S",
        help=f"seconds a request's line and headers may take to arrive (default {HEADER_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=READ_TIMEOUT_S,
        metavar="S",
        help=f"seconds a request body may stall (default {READ_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--write-timeout",
        type=float,
        default=WRITE_TIMEOUT_S,
        metavar="S",
        help="seconds a client may read nothing of its response; then its connection is closed and its "
        f"request cancelled (default {WRITE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=int,
        default=KEEP_ALIVE_S,
        metavar="S",
        help=f"whole seconds an idle connection is kept between requests (default {KEEP_ALIVE_S})",
    )
    p.add_argument(
        "--realtime-idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a /v1/realtime session may send nothing while no reply runs before it is closed "
        "(default 60)",
    )


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """What one request may carry (``orchestrator.server.ServerLimits``; each named in the 413/400)."""
    from orchestrator.core.units import MiB
    from orchestrator.server.limits import ServerLimits

    d = ServerLimits()
    g = p.add_argument_group(
        "request limits (each named, with its value, in the 400/413 that refuses a request)"
    )
    g.add_argument(
        "--max-body-mib",
        type=float,
        metavar="MIB",
        default=d.max_body_bytes / MiB,
        help=f"largest request body (default {d.max_body_bytes / MiB:g} MiB; 413 over it)",
    )
    g.add_argument(
        "--max-messages",
        type=int,
        metavar="N",
        default=d.max_messages,
        help=f"messages per chat request (default {d.max_messages})",
    )
    g.add_argument(
        "--max-content-chars",
        type=int,
        metavar="N",
        default=d.max_content_chars,
        help=f"characters of text in a chat request's messages (default {d.max_content_chars})",
    )
    g.add_argument(
        "--max-speech-chars",
        type=int,
        metavar="N",
        default=d.max_speech_chars,
        help=f"characters of /v1/audio/speech input (default {d.max_speech_chars}, OpenAI's)",
    )
    g.add_argument(
        "--max-audio-mib",
        type=float,
        metavar="MIB",
        default=d.max_audio_bytes / MiB,
        help=f"a recording's WAV size (default {d.max_audio_bytes / MiB:g} MiB)",
    )
    g.add_argument(
        "--max-audio-seconds",
        type=float,
        metavar="S",
        default=d.max_audio_seconds,
        help=f"a recording's duration (default {d.max_audio_seconds:g} s)",
    )
    g.add_argument(
        "--max-tensor-mib",
        type=float,
        metavar="MIB",
        default=d.max_tensor_bytes / MiB,
        help=f"a request's arrays (input_tensor parts' .npy bytes, together; default "
        f"{d.max_tensor_bytes / MiB:g} MiB)",
    )


def limits_of(args: argparse.Namespace) -> ServerLimits:
    """The flags as ``ServerLimits``; ``ConfigError`` (exit 2) for one that is not a positive number."""
    import math

    from orchestrator.core.errors import ConfigError, Problem
    from orchestrator.core.units import MiB
    from orchestrator.server.limits import ServerLimits

    given = {
        "--max-body-mib": args.max_body_mib,
        "--max-messages": args.max_messages,
        "--max-content-chars": args.max_content_chars,
        "--max-speech-chars": args.max_speech_chars,
        "--max-audio-mib": args.max_audio_mib,
        "--max-audio-seconds": args.max_audio_seconds,
        "--max-tensor-mib": args.max_tensor_mib,
    }
    problems = [
        Problem(flag, f"{value!r} is not a positive number", "give a number above 0")
        for flag, value in given.items()
        if not (math.isfinite(value) and value > 0)
    ]
    if args.max_body_mib * MiB < 1 or args.max_audio_mib * MiB < 1 or args.max_tensor_mib * MiB < 1:
        problems.append(
            Problem(
                "--max-body-mib/--max-audio-mib/--max-tensor-mib",
                "is less than a byte",
                "give at least 0.001 MiB",
            )
        )
    if problems:
        raise ConfigError(problems)
    return ServerLimits(
        max_body_bytes=int(args.max_body_mib * MiB),
        max_messages=args.max_messages,
        max_content_chars=args.max_content_chars,
        max_speech_chars=args.max_speech_chars,
        max_audio_bytes=int(args.max_audio_mib * MiB),
        max_audio_seconds=float(args.max_audio_seconds),
        max_tensor_bytes=int(args.max_tensor_mib * MiB),
    )


def realtime_limits(args: argparse.Namespace) -> Any:
    """``--realtime-idle-timeout`` as ``RealtimeLimits``; ``ConfigError`` (exit 2) unless a positive number."""
    import math

    from orchestrator.core.errors import ConfigError
    from orchestrator.server.realtime import RealtimeLimits

    idle = getattr(args, "realtime_idle_timeout", None)
    if idle is None:
        return RealtimeLimits()
    if not (math.isfinite(idle) and idle > 0):
        raise ConfigError.single(
            "--realtime-idle-timeout", f"{idle!r} is not a positive number of seconds", "e.g. 60"
        )
    return RealtimeLimits(idle_timeout_s=float(idle))


def check_bind(
    host: str,
    port: int,
    api_key: str | None,
    *,
    drain_timeout: float = DRAIN_TIMEOUT_S,
    max_waiting: int | None = None,
    limits: Any = None,
    allowed_hosts: list[str] | None = None,
) -> None:
    """``ConfigError`` (exit 2) for a bind or a bound that must not be, before anything starts
    (``limits``: a ``server.transport.TransportLimits``)."""
    from orchestrator.core.errors import ConfigError
    from orchestrator.server.guard import is_loopback, split_host

    if not 0 <= port <= 65535:
        raise ConfigError.single(
            "--port", f"{port} is not a port", "use 1-65535, or 0 for a free one"
        )
    if drain_timeout < 0:
        raise ConfigError.single(
            "--drain-timeout", f"{drain_timeout:g} is negative", "use 0 or more seconds"
        )
    if max_waiting is not None and max_waiting < 0:
        raise ConfigError.single(
            "--max-waiting", f"{max_waiting} is negative", "use 0 (refuse at once) or more"
        )
    if limits is not None:
        if limits.max_connections < 1:
            raise ConfigError.single(
                "--max-connections",
                f"{limits.max_connections} is below 1",
                "use 1 or more (the default is enough for any real load)",
            )
        for flag, value in (
            ("--header-timeout", limits.header_timeout_s),
            ("--read-timeout", limits.read_timeout_s),
            ("--write-timeout", limits.write_timeout_s),
        ):
            if not 0 < value < float("inf"):
                raise ConfigError.single(
                    flag, f"{value:g} is not a positive number of seconds", "e.g. 10"
                )
        if limits.keep_alive_s < 0:
            raise ConfigError.single(
                "--keep-alive-timeout", f"{limits.keep_alive_s} is negative", "use 0 or more"
            )
    for name in allowed_hosts or []:
        split = split_host(name)
        if split is None or split[1] is not None or not name.strip() or name.strip() in ("*", "."):
            raise ConfigError.single(
                "--allowed-host",
                f"{name!r} is not a host name",
                "give the name (or address) clients use, without a port: e.g. myhost.lan",
            )
    if not is_loopback(host) and not api_key:
        raise ConfigError.single(
            "--host",
            f"{host} is not a loopback address, and no API key is set: anyone who can reach it "
            "could drive the pipeline",
            f"bind 127.0.0.1 (the default), or set ${API_KEY_ENV} (or --api-key-file PATH)",
        )


def api_key(args: argparse.Namespace) -> str | None:
    """The key of ``--api-key``, ``--api-key-file`` or ``$OMNI_EDGE_API_KEY`` (in that order;
    the first two together are an error), then removed from this process's environment, so that
    no process started from here (Ray's, the route workers) inherits it."""
    from orchestrator.core.errors import ConfigError

    from_env = os.environ.pop(API_KEY_ENV, None)
    if args.api_key is not None and args.api_key_file is not None:
        raise ConfigError.single("--api-key", "is given with --api-key-file", "give one of them")
    key: str | None
    if args.api_key is not None:
        print(
            f"warning: --api-key is visible to every user of this machine (ps, /proc); "
            f"prefer ${API_KEY_ENV} or --api-key-file",
            file=sys.stderr,
        )
        key, where = args.api_key, "--api-key"
    elif args.api_key_file is not None:
        where = "--api-key-file"
        try:
            with open(args.api_key_file, "rb") as f:
                data = f.read(API_KEY_FILE_MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError.single(
                where,
                f"cannot read {args.api_key_file}: {exc.strerror or exc}",
                "give a readable file holding the key on its first line",
            ) from None
        if len(data) > API_KEY_FILE_MAX_BYTES:
            raise ConfigError.single(
                where,
                f"{args.api_key_file} is over {API_KEY_FILE_MAX_BYTES} bytes",
                "give a file holding only the key",
            ) from None
        try:
            lines = data.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise ConfigError.single(
                where, f"{args.api_key_file} is not text", "write the key as text"
            ) from None
        key = lines[0].strip() if lines else ""
    else:
        key, where = from_env, f"${API_KEY_ENV}"
    if key is not None and (not key.strip() or not key.isprintable() or not key.isascii()):
        raise ConfigError.single(
            where,
            "is empty or not printable ASCII (an HTTP header cannot carry it)",
            "use a key of visible ASCII characters, e.g. from `openssl rand -hex 32`",
        )
    if key is not None and len(key) < API_KEY_MIN_CHARS:
        raise ConfigError.single(
            where,
            f"is {len(key)} characters: a key shorter than {API_KEY_MIN_CHARS} can be guessed",
            f"use a random key of at least {API_KEY_MIN_CHARS} characters, e.g. from "
            "`openssl rand -hex 32`",
        )
    return key


def transport_limits(args: argparse.Namespace) -> Any:
    """The flags' ``server.transport.TransportLimits``."""
    from orchestrator.server.transport import TransportLimits

    return TransportLimits(
        max_connections=args.max_connections,
        keep_alive_s=args.keep_alive_timeout,
        header_timeout_s=args.header_timeout,
        read_timeout_s=args.read_timeout,
        write_timeout_s=args.write_timeout,
    )


def needs(args: argparse.Namespace) -> tuple[str, ...]:
    """Serving a pipeline needs the ``run`` extra (``orchestrator.core.extras``)."""
    from orchestrator.core.extras import RUN_MODULES

    return RUN_MODULES


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.common import (
        Interrupted,
        as_received,
        interrupted_before_start,
        signals_handled,
    )

    key = api_key(args)
    transport = transport_limits(args)
    check_bind(
        args.host,
        args.port,
        key,
        drain_timeout=args.drain_timeout,
        max_waiting=args.max_waiting,
        limits=transport,
        allowed_hosts=args.allowed_host,
    )
    limits = limits_of(args)
    realtime = realtime_limits(args)
    sock = bind(args.host, args.port)
    try:
        with signals_handled():
            try:
                return _serve(args, sock, key, transport, limits, realtime)
            except KeyboardInterrupt as raw:  # before serving (planning, verifying, starting)
                exc = as_received(raw)  # a SIGTERM Ray's signal check made a KeyboardInterrupt
                if not isinstance(exc, Interrupted):
                    raise
                return interrupted_before_start(exc)
    finally:
        sock.close()


def raise_fd_limit(max_connections: int) -> str | None:
    """Raise this process's soft descriptor limit to fit ``max_connections`` client sockets and
    ``server.transport.FD_RESERVE`` more, as far as the hard limit allows; a warning when it cannot."""
    import resource

    from orchestrator.server.transport import FD_RESERVE

    need = max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        return (
            f"warning: this process may open {soft} files (ulimit -n), fewer than --max-connections "
            f"{max_connections} plus {FD_RESERVE} for Ray: lower --max-connections or raise the limit"
        )
    return None


def bind(host: str, port: int) -> socket.socket:
    """The listening address, bound before anything starts (a port in use is exit 2
    at once, not after the pipeline's start); uvicorn listens on it."""
    from orchestrator.core.errors import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError.single(
            "--host/--port",
            f"cannot bind {host}:{port}: {exc.strerror or exc}",
            "pick another --port (0: any free one), or stop what holds it",
        ) from None
    return sock


def _serve(
    args: argparse.Namespace,
    sock: socket.socket,
    key: str | None,
    transport: Any,
    limits: ServerLimits,
    realtime: Any = None,
) -> int:
    """Start the pipeline, serve it on ``sock`` until a signal stops uvicorn, then close the
    app and the pipeline (whatever happened) and say what the ledger holds."""
    from orchestrator.commands.common import check_signalled
    from orchestrator.commands.exits import EXIT_OK
    from orchestrator.core.console import make_console
    from orchestrator.server import close_app, create_app
    from orchestrator.server.guard import is_loopback

    console = make_console(stderr=True)
    fd_warning = raise_fd_limit(transport.max_connections)
    if fd_warning:
        console.print(fd_warning, markup=False, soft_wrap=True)
    _check_turn_detection(args.config)
    pipeline = _start_pipeline(args, console)
    stopped_by: list[int] = []
    app = None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        check_signalled()  # one that came while it started, its exception swallowed on the way
        # a non-loopback bind (which has a key) without --allowed-host takes any Host name
        allowed = (
            None if not is_loopback(args.host) and not args.allowed_host else args.allowed_host
        )
        app = create_app(
            pipeline, api_key=key, limits=limits, allowed_hosts=allowed, realtime=realtime
        )
        server = _uvicorn_server(args, app, transport)
        _announce(args, pipeline, sock.getsockname()[1], key, console)
        # uvicorn re-raises the signal that stopped it once it has shut down; what it
        # finds then is this recorder, so the pipeline is closed below, not skipped.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
        server.run(sockets=[sock])
    finally:
        t0 = time.perf_counter()
        if app is not None:
            close_app(app)
        final = pipeline.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _report_close(final, stopped_by, time.perf_counter() - t0, console)
    return EXIT_OK


def _check_turn_detection(path: str) -> None:
    """A ``semantic_vad`` the pipeline's stages cannot serve is exit 2 before anything starts
    (``realtime.turn_detection_problem``; the engine's scorer is checked once it is planned)."""
    from orchestrator.config import load_config
    from orchestrator.core.errors import ConfigError
    from orchestrator.server.realtime import turn_detection_problem

    problem = turn_detection_problem(load_config(path))
    if problem is not None:
        raise ConfigError([problem])


def _start_pipeline(args: argparse.Namespace, console: Any) -> Any:
    """The pipeline ``serve`` runs: admitted (``api.admit_plan``, the cluster's probe said on
    ``console``), planned with the server's own memory, started with its progress."""
    from orchestrator.api import Pipeline
    from orchestrator.commands.common import console_admit_progress, pipeline_options
    from orchestrator.commands.progress import TerminalProgress

    console.print("[dim]planning, verifying and starting the pipeline …[/]")
    return Pipeline.from_config(
        args.config,
        pipeline_options(
            args,
            record=None,
            progress=TerminalProgress(),
            max_waiting=args.max_waiting,
            server=True,
        ),
        admitting=console_admit_progress(console, gates=False),
    )


def _uvicorn_server(args: argparse.Namespace, app: Any, transport: Any) -> Any:
    """uvicorn's server for ``app``, bounded by ``transport``, draining for --drain-timeout."""
    import uvicorn

    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Protocol
    except ImportError:  # httptools is optional: uvicorn falls back to h11 then, and so does this
        from uvicorn.protocols.http.h11_impl import H11Protocol as Protocol  # type: ignore[assignment]

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=args.drain_timeout,
        **transport.uvicorn_kwargs(Protocol),
    )
    return uvicorn.Server(config)


def _announce(
    args: argparse.Namespace, pipeline: Any, port: int, key: str | None, console: Any
) -> None:
    """Where the API (and the realtime socket, when the pipeline has a voice turn) listens."""
    from orchestrator.server.realtime import end_of_turn_text

    names = ", ".join(f"{s.name} on {s.device}" for s in pipeline.plan.stages)
    host = f"[{args.host}]" if ":" in args.host else args.host
    console.print(
        f"serving {pipeline.plan.pipeline!r} ({names}) on http://{host}:{port}/v1 "
        f"{'(API key required)' if key else ''}— Ctrl-C to stop",
        soft_wrap=True,
    )
    turn = end_of_turn_text(pipeline.config, pipeline.plan)
    if turn is not None:
        console.print(
            f"realtime: ws://{host}:{port}/v1/realtime — a spoken turn ends {turn}", soft_wrap=True
        )


def _report_close(
    final: ActorSnapshot | None, stopped_by: list[int], close_s: float, console: Any
) -> None:
    """What stopped the server, how long the close took, and what each pool still holds."""
    held = (final or {}).get("held_bytes")
    why = f"stopped by {signal.Signals(stopped_by[0]).name}" if stopped_by else "stopped"
    console.print(f"{why}: closed the pipeline in {close_s:.1f} s; ledger holds {held or 0} bytes")
    for pool in (final or {}).get("pools", []):
        console.print(
            f"  {pool['id']}: {pool['held_bytes']} bytes held of {pool['capacity_bytes']}"
        )
