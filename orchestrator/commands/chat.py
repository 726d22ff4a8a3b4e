"""``omni-edge chat CONFIG`` (or ``--url`` of a running server): a conversation that keeps its history.

Two ways to reach a pipeline, one loop:

* ``CONFIG``: the pipeline is planned, verified and started once in this
  process (``Pipeline.from_config``, progress on stderr) and closed at the end;
* ``--url http://127.0.0.1:8000``: a running ``omni-edge serve`` is driven over
  its OpenAI-compatible API (``POST /v1/chat/completions`` with ``stream: true``,
  server-sent events; ``--api-key`` sends ``Authorization: Bearer KEY``). Only
  the standard library speaks HTTP here. A redirect is followed with the key
  only within the server's origin (scheme, host, port): a redirect to another
  origin is followed without it (``_opener``), so a server (or whoever answers
  at its address) cannot send the key elsewhere.

Every message goes with the whole history (``{"messages": [...], "sampling":
{...}}``, ``--system`` first when given, replacing the config's system
prompt); each reply streams to stdout as it is generated and joins the
history once complete. A reply that was refused (too long for the context, the
pipeline busy) or stopped (Ctrl-C while it streams) is not added; the error is
printed and the chat goes on. ``--out-dir DIR`` writes each reply's audio as
``DIR/reply-NNN.wav`` while it is spoken (as ``run --out`` does; over
``--url`` the server's 24 kHz pcm16 audio).

Input: on a terminal, a ``you>`` prompt; otherwise one message per line of
stdin (blank lines skipped). Commands: ``/reset`` (forget the history),
``/history`` (print it), ``/exit``; end of input or Ctrl-C at the prompt also
ends the chat. Status lines go to stderr, replies to stdout.

``--url URL --audio-in FILE.wav`` is a spoken conversation instead: the
recording streamed to the server's ``/v1/realtime`` at the pace of the audio,
each turn's transcript, reply and latency printed (``chat_audio.py``; its own
exit codes there). ``--url``'s key: ``--api-key``, ``--api-key-file`` or
``$OMNI_EDGE_API_KEY``.

Exit codes: 0 the chat ended; 2 bad input (CONFIG with --url, an unreachable
server, a rejected API key), or a message was refused (its error printed); 3
the plan was refused; 4 a stage failed; 128+N for SIGTERM/SIGHUP (the pipeline
closed first).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.commands.common import (
    Interrupted,
    ReplyPrinter,
    WavOut,
    add_request_options,
    as_received,
    check_sampling,
    check_signalled,
    pipeline_options,
    request_of,
    sampling_of,
    signals_handled,
    stream_reply,
)
from stages.requests import ChatMessage

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.api import Pipeline
    from orchestrator.core.documents import JsonObject
    from orchestrator.core.errors import Problem
    from stages.requests import ChatRequest

Messages = list[ChatMessage]
API_KEY_ENV = "OMNI_EDGE_API_KEY"
"""Where ``--url``'s key is read when no flag gives it: ``serve``'s own variable."""
API_KEY_FILE_MAX_BYTES = 4096
"""A key file is one line: a key of a few dozen characters; anything longer is not a key file."""
MAX_AUDIO_SPEED = 100.0
"""``--audio-speed``'s ceiling: 100× real time is 2 ms of wall clock per 20 ms chunk, already
past what a server scores as it comes; a larger number is a typo."""
HTTP_TIMEOUT_S = 300.0
"""Longest wait for the next bytes of a reply: a cold engine's first token on a slow CPU."""


class Refused(Exception):
    """A message the pipeline did not answer (bad, busy, stopped): printed, the chat goes on."""


class Stopped(Refused):
    """A reply the user stopped (Ctrl-C while it streamed): not an error."""


class Fatal(Exception):
    """The chat cannot go on: ``code`` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        nargs="?",
        help="pipeline config (YAML or JSON), a shipped pipeline's name or a model's Hugging Face id "
        "to start here; or give --url",
    )
    p.add_argument(
        "--url", help="drive a running `omni-edge serve` instead, e.g. http://127.0.0.1:8000"
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="with --url: the server's API key (Authorization: Bearer KEY); "
        f"shows in ps: prefer ${API_KEY_ENV} or --api-key-file",
    )
    p.add_argument(
        "--api-key-file",
        metavar="PATH",
        type=Path,
        help=f"with --url: read the server's API key from this file's first line (default: ${API_KEY_ENV})",
    )
    p.add_argument(
        "--profile", metavar="FILE", help="plan for a recorded hardware profile instead of probing"
    )
    p.add_argument(
        "--mask",
        action="append",
        default=[],
        metavar="DEVICES",
        help="exclude devices or kinds, e.g. --mask npu,gpu:0 (repeatable)",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="join an existing Ray cluster instead of starting a local one",
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
    add_request_options(p)
    p.add_argument(
        "--out-dir", metavar="DIR", help="write each reply's audio here as reply-NNN.wav"
    )
    spoken = p.add_argument_group("a spoken conversation over --url's /v1/realtime (WebSocket)")
    spoken.add_argument(
        "--audio-in",
        metavar="WAV",
        help="stream this recording to --url's /v1/realtime at the pace of the audio; print each "
        "turn's transcript, reply and latency",
    )
    spoken.add_argument(
        "--audio-speed",
        type=float,
        default=1.0,
        metavar="N",
        help="with --audio-in: stream N times faster than real time (default 1.0; the latency is "
        "then not the real-time figure)",
    )
    spoken.add_argument(
        "--out", metavar="WAV", help="with --audio-in: write the replies' audio here (24 kHz)"
    )
    spoken.add_argument(
        "--json", action="store_true", help="with --audio-in: one JSON object per turn on stdout"
    )


def check_args(args: argparse.Namespace) -> None:
    """One way to reach a pipeline, and options that fit it (``ConfigError``, exit 2). A
    ``--temperature`` that is no finite number is refused here: over ``--url`` it would be
    sent as ``Infinity``/``NaN``, which is not JSON. Its range, and ``--max-tokens``'s, are
    the pipeline's config's, checked by it (started here) or by the server (a 400)."""
    from orchestrator.commands.exits import check_number
    from orchestrator.core.errors import ConfigError, Problem

    check_number(
        "--temperature", args.temperature, fix="give a temperature such as 0.7 (0: greedy)"
    )

    problems = []
    if args.config and args.url:
        problems.append(
            Problem(
                "CONFIG and --url",
                f"both given ({args.config}, {args.url}): chat starts a pipeline "
                "or drives a running server, not both",
                "drop one of them",
            )
        )
    elif not args.config and not args.url:
        problems.append(
            Problem(
                "CONFIG", "missing", "give a pipeline config, or --url of a running omni-edge serve"
            )
        )
    schemes = (
        ("http://", "https://", "ws://", "wss://") if args.audio_in else ("http://", "https://")
    )
    if args.url and not (
        args.url.lower().startswith(schemes) and len(args.url.split("://", 1)[1].strip("/")) > 0
    ):
        problems.append(
            Problem(
                "--url",
                f"{args.url!r} is not an {'http(s) or ws(s)' if args.audio_in else 'http(s)'} URL",
                "e.g. --url http://127.0.0.1:8000",
            )
        )
    for flag, given in (("--api-key", args.api_key), ("--api-key-file", args.api_key_file)):
        if given is not None and not args.url:
            problems.append(Problem(flag, "only used with --url", "drop it, or give --url"))
    if args.api_key is not None and args.api_key_file is not None:
        problems.append(Problem("--api-key", "is given with --api-key-file", "give one of them"))
    if args.audio_in:
        problems += audio_in_problems(args)
    else:
        problems += [
            Problem(flag, "only used with --audio-in", "drop it, or give --audio-in FILE.wav")
            for flag, given in (
                ("--out", args.out),
                ("--json", args.json),
                ("--audio-speed", args.audio_speed != 1.0),
            )
            if given
        ]
    if args.url:
        problems += [
            Problem(flag, "only used with CONFIG (a pipeline started here)", "drop it")
            for flag, given in (
                ("--profile", args.profile),
                ("--mask", args.mask),
                ("--address", args.address),
            )
            if given
        ]
    if problems:
        raise ConfigError(problems)


def audio_in_problems(args: argparse.Namespace) -> list[Any]:
    """What ``--audio-in`` refuses, before anything connects: it needs ``--url``; the realtime
    session takes no sampling settings and writes one ``--out`` WAV, not ``--out-dir``."""
    from orchestrator.core.errors import Problem

    problems = []
    if not args.url and args.config:
        problems.append(
            Problem(
                "--audio-in",
                "streams to a running server's /v1/realtime, not to CONFIG",
                "start `omni-edge serve CONFIG` and give --url http://127.0.0.1:8000",
            )
        )
    problems += [
        Problem(
            flag,
            "not used with --audio-in (the server's pipeline samples as its config says)",
            "drop it",
        )
        for flag, given in (("--temperature", args.temperature), ("--max-tokens", args.max_tokens))
        if given is not None
    ]
    if args.out_dir:
        problems.append(
            Problem("--out-dir", "not used with --audio-in", "give --out reply.wav instead")
        )
    speed = args.audio_speed
    if not (math.isfinite(speed) and 0 < speed <= MAX_AUDIO_SPEED):
        problems.append(
            Problem(
                "--audio-speed",
                f"{speed:g} is not a number above 0 and at most {MAX_AUDIO_SPEED:g}",
                "give 1.0 (real time, the default) or e.g. 4 to stream four times faster",
            )
        )
    return problems


def key_of(args: argparse.Namespace) -> str | None:
    """``--url``'s API key: ``--api-key``, ``--api-key-file``'s first line, else ``$OMNI_EDGE_API_KEY``
    (``ConfigError`` for a file that cannot be read, or a key no HTTP header can carry)."""
    import os

    from orchestrator.core.errors import ConfigError

    if args.api_key is not None:
        key, where = args.api_key, "--api-key"
    elif args.api_key_file is not None:
        where = f"--api-key-file {args.api_key_file}"
        try:
            with open(args.api_key_file, "rb") as f:
                data = f.read(API_KEY_FILE_MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError.single(
                where,
                f"cannot be read ({exc.strerror or exc})",
                "give a readable file holding the key on its first line",
            ) from None
        if len(data) > API_KEY_FILE_MAX_BYTES:
            raise ConfigError.single(
                where, f"is over {API_KEY_FILE_MAX_BYTES} bytes", "give a file holding only the key"
            )
        lines = data.decode("utf-8", errors="replace").splitlines()
        key = lines[0].strip() if lines else ""
    else:
        key, where = os.environ.get(API_KEY_ENV), f"${API_KEY_ENV}"
    if key is not None and (not key.strip() or not key.isprintable() or not key.isascii()):
        raise ConfigError.single(
            where,
            "is empty or not printable ASCII (an HTTP header cannot carry it)",
            "give the key the server was started with",
        )
    return key


def prepare_out_dir(path: str) -> Path:
    """``--out-dir``, created when missing, checked writable before anything starts."""
    from orchestrator.core.errors import ConfigError
    from orchestrator.core.fileio import check_writable

    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError.single(
            f"--out-dir {path}",
            f"cannot be created ({exc.strerror or exc})",
            "name a directory you can write to",
        ) from None
    check_writable(out / "reply-001.wav", what="--out-dir")
    return out


def needs(args: argparse.Namespace) -> tuple[str, ...]:
    """A pipeline started here needs the ``run`` extra; ``--url`` alone needs nothing more
    than the core, a spoken conversation over it the WebSocket client and the audio code."""
    from orchestrator.core.extras import RUN_MODULES

    if args.url:
        return ("numpy", "websockets", "soxr") if args.audio_in else ()
    return RUN_MODULES


def run(args: argparse.Namespace) -> int:
    from orchestrator.core.console import make_console

    check_args(args)
    if args.audio_in:
        from orchestrator.commands.chat_audio import run_audio_in

        return run_audio_in(args, key_of(args))
    out_dir = prepare_out_dir(args.out_dir) if args.out_dir else None
    console = make_console(stderr=True)
    with signals_handled():
        return _chat(args, console, out_dir)


def _chat(args: argparse.Namespace, console: Console, out_dir: Path | None) -> int:
    """The chat, against a server (--url) or a pipeline started here and closed at the end
    (a signal closes it too: 128 + the signal number)."""
    pipeline: Pipeline | None = None
    try:
        if args.url:
            reply = http_replier(args.url, key_of(args), console)
        else:
            pipeline = start_local(args, console)
            if pipeline is None:
                from orchestrator.commands.exits import EXIT_REFUSED

                return EXIT_REFUSED
            check_signalled()  # one that came while it started, its exception swallowed
            reply = local_replier(pipeline, console)
        return chat_loop(reply, args, console, out_dir)
    except KeyboardInterrupt as raw:
        import signal

        exc = as_received(raw)  # a SIGTERM Ray's signal check made a KeyboardInterrupt
        if not isinstance(exc, Interrupted):
            raise

        held = ""
        if pipeline is not None:
            held = f"; ledger holds {pipeline.close().get('held_bytes', 0)} bytes"
            pipeline = None
        print(
            f"interrupted by {signal.Signals(exc.signum).name}: closed the pipeline{held}",
            file=sys.stderr,
        )
        return 128 + exc.signum
    except Fatal as exc:
        from orchestrator.core.errors import terminal_text

        print(terminal_text(f"error: {exc}"), file=sys.stderr)
        return exc.code
    finally:
        if pipeline is not None:
            final = pipeline.close()
            if final.get("held_bytes"):
                console.print(f"[red]ledger still holds {final['held_bytes']} bytes after close[/]")


# -- the loop -------------------------------------------------------------------------------
Replier = Callable[["ChatRequest", str, "Path | None"], str]
"""(request, the user's message, where to write the reply's WAV) → the reply's text; raises Refused."""


def chat_loop(
    reply: Replier, args: argparse.Namespace, console: Console, out_dir: Path | None
) -> int:
    """Read messages, answer each with the history; the exit code (see the module docstring)."""
    from orchestrator.commands.exits import EXIT_BAD_INPUT, EXIT_OK
    from orchestrator.core.console import plain

    history: Messages = []
    sampling = sampling_of(args)
    refused = 0
    replies = 0
    interactive = sys.stdin.isatty()
    if interactive:
        console.print(
            "[dim]chat: /reset forgets the history, /history prints it, /exit (or Ctrl-D) ends[/]"
        )
    for line in _messages(interactive):
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            history.clear()
            console.print("[dim]history cleared[/]")
            continue
        if line == "/history":
            _print_history(history, args.system)
            continue
        turn = [*history, ChatMessage(role="user", content=line)]
        wav = out_dir / f"reply-{replies + 1:03d}.wav" if out_dir else None
        try:
            text = reply(request_of(turn, args.system, sampling), line, wav)
        except Refused as exc:
            refused += not isinstance(exc, Stopped)
            console.print(f"[red]not answered:[/] {plain(exc)}", soft_wrap=True)
            continue
        replies += 1
        history += [turn[-1], ChatMessage(role="assistant", content=text)]
    console.print(f"[dim]chat ended: {replies} replies, {len(history)} messages in the history[/]")
    return EXIT_BAD_INPUT if refused else EXIT_OK


def _messages(interactive: bool) -> Iterator[str]:
    """The user's messages, stripped, blank ones skipped: a prompt on a terminal,
    one per line otherwise; EOF (and Ctrl-C at the prompt) ends them."""
    if not interactive:
        for line in sys.stdin:
            if line.strip():
                yield line.strip()
        return
    while True:
        try:
            line = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if line.strip():
            yield line.strip()


def _print_history(history: Messages, system: str | None) -> None:
    from orchestrator.core.errors import terminal_text

    for m in ([{"role": "system", "content": system}] if system else []) + history:
        print(terminal_text(f"{m['role']}: {m['content']}"))
    print(f"({len(history)} messages)")


# -- a pipeline started here ---------------------------------------------------------------
def start_local(args: argparse.Namespace, console: Console) -> Pipeline | None:
    """Plan, verify and start CONFIG (sampling checked against it first); None
    when the plan is refused (printed)."""
    from orchestrator.api import Pipeline
    from orchestrator.commands.progress import TerminalProgress
    from orchestrator.config import load_config
    from orchestrator.core.errors import PlanRefused

    check_sampling(load_config(args.config), sampling_of(args), where=args.config)
    console.print("[dim]starting the pipeline (Ray, one actor per device) …[/]")
    try:
        pipeline = Pipeline.from_config(
            args.config, pipeline_options(args, record=None, progress=TerminalProgress())
        )
    except PlanRefused as exc:
        from orchestrator.commands.render import print_plan

        print_plan(exc.plan, console)  # type: ignore[arg-type]
        return None
    console.print(f"[dim]pipeline {pipeline.plan.pipeline!r} started[/]")
    return pipeline


def local_replier(pipeline: Pipeline, console: Console) -> Replier:
    from orchestrator.core.console import plain
    from orchestrator.core.errors import BadRequest, PipelineBusy, StageFailed

    def reply(request: ChatRequest, line: str, wav: Path | None) -> str:
        wav_out = WavOut(wav) if wav else None
        try:
            pipeline.validate(request)
            result = asyncio.run(
                stream_reply(pipeline, request, line, make_stdout_console(), wav_out)
            )
        except (BadRequest, PipelineBusy) as exc:
            _discard(wav_out)
            raise Refused(str(exc)) from None
        except StageFailed as exc:
            _discard(wav_out)
            raise Fatal(str(exc), 4) from None
        except KeyboardInterrupt as exc:
            _discard(wav_out)
            if isinstance(exc, Interrupted):
                raise
            raise Stopped("stopped (Ctrl-C)") from None
        if wav_out is not None and result.audio is not None and result.sample_rate:
            kept: list[Problem] = []
            path = wav_out.finish(result, kept)
            console.print(
                f"[dim]audio: {plain(path)} ({result.audio_seconds:.2f} s)[/]", soft_wrap=True
            )
            for problem in kept:
                console.print(
                    f"[yellow]{plain(problem.where)}: {plain(problem.what)}[/]", soft_wrap=True
                )
        return result.text

    return reply


def make_stdout_console() -> Console:
    from orchestrator.core.console import make_console

    return make_console()


def _discard(wav_out: WavOut | None) -> None:
    if wav_out is not None:
        wav_out.discard()


# -- a running server ---------------------------------------------------------------------
def http_replier(url: str, api_key: str | None, console: Console) -> Replier:
    """A ``Replier`` over ``url``'s OpenAI-compatible API; checks the server (and
    the key) at once with ``GET /v1/models`` (``Fatal``, exit 2)."""
    from orchestrator.core.console import plain

    base = url.rstrip("/")
    headers = {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {api_key}"} if api_key else {}),
    }
    model = _model_of(base, headers)
    console.print(f"[dim]chatting with {plain(repr(model))} at {plain(base)}[/]")

    def reply(request: ChatRequest, line: str, wav: Path | None) -> str:
        body: JsonObject = {
            "model": model,
            "messages": list(request.messages or ()),
            "stream": True,
            **(request.sampling or {}),
        }
        if wav is not None:
            body |= {
                "modalities": ["text", "audio"],
                "audio": {"voice": "default", "format": "pcm16"},
            }
        return _stream_http(f"{base}/v1/chat/completions", body, headers, wav, console)

    return reply


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port made explicit: what a key is bound to."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return (
        scheme,
        (parts.hostname or "").lower(),
        parts.port or {"http": 80, "https": 443}.get(scheme),
    )


def _opener() -> Any:
    """urllib's opener whose redirects keep ``Authorization`` only within the origin.

    urllib copies every header but the content ones onto the redirected request,
    whatever host it goes to (CPython follows 301/302/303/307/308 for GET, and turns
    a POST into a GET on 301/302/303): a server that redirects would receive the
    key at another host. Here the header is dropped when the new URL's origin
    differs from the request's, and stays dropped along the rest of the chain."""
    import urllib.request

    class KeyStaysHome(urllib.request.HTTPRedirectHandler):
        def redirect_request(
            self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
        ) -> Any:
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            if new is not None and _origin(newurl) != _origin(req.full_url):
                new.remove_header("Authorization")
            return new

    return urllib.request.build_opener(KeyStaysHome)


def _model_of(base: str, headers: dict[str, str]) -> str:
    import urllib.error
    import urllib.request

    try:
        with _opener().open(
            urllib.request.Request(f"{base}/v1/models", headers=headers), timeout=30
        ) as resp:
            data = json.load(resp).get("data") or [{}]
    except urllib.error.HTTPError as exc:
        raise Fatal(
            f"--url {base}: {_http_error(exc)}"
            + (
                f" (give the server's key: ${API_KEY_ENV}, --api-key-file PATH or --api-key)"
                if exc.code == 401
                else ""
            ),
            2,
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Fatal(
            f"--url {base}: cannot reach an omni-edge server there ({reason}); start one with "
            "`omni-edge serve CONFIG` or fix the URL",
            2,
        ) from None
    return str(data[0].get("id") or "omni-edge")


def _http_error(exc: Any) -> str:
    try:
        return f"HTTP {exc.code}: {json.loads(exc.read())['error']['message']}"
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code} {exc.reason}"


def _stream_http(
    url: str, body: JsonObject, headers: dict[str, str], wav: Path | None, console: Console
) -> str:
    """POST ``body``, print the streamed reply, write its audio to ``wav``; the reply's text."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    printer = ReplyPrinter(make_stdout_console())
    parts: list[str] = []
    writer = PcmWav(wav) if wav is not None else None
    try:
        with _opener().open(req, timeout=HTTP_TIMEOUT_S) as resp:
            for doc in _events(resp):
                if "error" in doc:
                    raise Refused(str(doc["error"].get("message", doc["error"])))
                for choice in doc.get("choices") or []:
                    delta = choice.get("delta") or {}
                    audio = delta.get("audio") or {}
                    text = delta.get("content") or audio.get("transcript")
                    if text:
                        parts.append(text)
                        printer.write(text)
                    if audio.get("data") and writer is not None:
                        writer.add(base64.b64decode(audio["data"]))
        printer.close()
    except urllib.error.HTTPError as exc:
        printer.close()
        if writer is not None:
            writer.discard()
        message = _http_error(exc)
        if exc.code == 503:
            raise Fatal(message, 4) from None
        if exc.code == 401:
            raise Fatal(
                message
                + f" (give the server's key: ${API_KEY_ENV}, --api-key-file PATH or --api-key)",
                2,
            ) from None
        raise Refused(message) from None
    except (Refused, KeyboardInterrupt, OSError) as exc:
        printer.close()
        if writer is not None:
            writer.discard()
        if isinstance(exc, Interrupted):
            raise
        if isinstance(exc, KeyboardInterrupt):
            raise Stopped("stopped (Ctrl-C)") from None
        if isinstance(exc, OSError):
            raise Fatal(f"the connection to {url} failed ({exc})", 2) from None
        raise
    if writer is not None:
        console.print(writer.finish(), soft_wrap=True)
    return "".join(parts)


class PcmWav:
    """A reply's streamed OpenAI pcm16 (24 kHz) audio written to ``path`` as it
    comes (``WavStreamWriter``). A write that fails stops the writing and removes
    the file; ``finish`` says what happened, for the user."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer: Any = None
        self.error: OSError | None = None

    def add(self, pcm16: bytes) -> None:
        import numpy as np

        from orchestrator.runtime.audio import OPENAI_PCM_RATE, WavStreamWriter

        if self.error is not None:
            return
        try:
            self.writer = self.writer or WavStreamWriter(self.path, OPENAI_PCM_RATE)
            self.writer.write(np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0)
        except OSError as exc:
            self.error = exc
            self.discard()

    def finish(self) -> str:
        from orchestrator.core.console import plain

        if self.error is None and self.writer is not None:
            try:
                return f"[dim]audio: {plain(self.writer.close())} ({self.writer.seconds:.2f} s)[/]"
            except OSError as exc:
                self.error = exc
                self.discard()
        if self.error is None:
            return "[yellow]the server sent no audio for this reply[/]"
        return f"[yellow]{plain(self.path)}: the reply's audio could not be written ({plain(self.error.strerror or self.error)})[/]"

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.discard()


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """The JSON documents of a server-sent event stream, up to ``data: [DONE]``."""
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)
