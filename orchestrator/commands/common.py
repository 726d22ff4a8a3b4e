"""What the commands that run a pipeline share (``run``, ``chat``, ``serve``, ``verify``).

* signals: SIGTERM and SIGHUP handled like Ctrl-C while a command runs
  (``signals_handled``, a context manager; ``Interrupted``);
* the admitted plan's steps said on the console (``ConsoleAdmitProgress`` for
  ``api.admit_plan``), with the gates' progress bar (``verify_with_progress``);
* a request's options (``--system``, ``--temperature``, ``--max-tokens``) and
  their check against the config (``check_sampling``), and the request they make;
* a reply printed as it streams (``stream_reply``, ``ReplyPrinter``, ``WordWrap``)
  and its audio written as it streams (``WavOut``);
* the run record written, or kept in the temp dir when it cannot be
  (``write_record_or_keep``).

Heavy modules (Ray, vLLM, ONNX Runtime) are imported inside functions only: the
CLI parser imports every command module, and ``omni-edge plan`` must stay light.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.core.errors import Problem
from stages.requests import ChatMessage, ChatRequest, Request, Sampling

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from orchestrator.api import AdmitProgress, Pipeline, PipelineOptions
    from orchestrator.config import PipelineConfig
    from orchestrator.core.documents import JsonObject
    from orchestrator.core.profile import HardwareProfile
    from orchestrator.runtime.audio import WavStreamWriter
    from orchestrator.runtime.events import AudioChunk, Result
    from orchestrator.verify.placement import PlacementResult
    from orchestrator.verify.run import VerifyReport


# -- signals ----------------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled like Ctrl-C (SIGINT): the run stops, the pipeline
    closes, the record is written, and the command exits 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


HANDLED_SIGNALS = ("SIGTERM", "SIGHUP")
_received: list[int] = []
"""The signals that came while ``signals_handled`` was in force, in order. Kept apart from the
exception a handler raises, which does not always reach the command: Ray's signal check turns it
into a bare ``KeyboardInterrupt`` (so a SIGTERM would read as SIGINT), and an import in progress
(a Cython module's initialisation) swallows it with "Exception ignored" (so the run went on)."""


def _raise_interrupted(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Interrupted(signum)


def _sigint(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def received_signal() -> int | None:
    """The latest signal that came while ``signals_handled`` was in force (None: none)."""
    return _received[-1] if _received else None


def as_received(exc: BaseException) -> BaseException:
    """``exc``, or — for a ``KeyboardInterrupt`` that stands for another signal that came (Ray's
    signal check raises a bare one whatever the handler raised) — ``Interrupted`` naming it."""
    sig = received_signal()
    if (
        isinstance(exc, KeyboardInterrupt)
        and not isinstance(exc, Interrupted)
        and sig is not None
        and sig != signal.SIGINT
    ):
        return Interrupted(sig)
    return exc


def check_signalled() -> None:
    """Raise what a signal that came should have raised, if its exception was swallowed on the
    way (a Cython module being imported when it came): called between a command's long steps,
    so a signal during loading stops the command as one during a reply does."""
    sig = received_signal()
    if sig is not None:
        raise Interrupted(sig) if sig != signal.SIGINT else KeyboardInterrupt


@contextmanager
def signals_handled() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise ``Interrupted`` in the main thread
    (as SIGINT raises KeyboardInterrupt), and every signal that comes is noted
    (``received_signal``); the handlers they replaced are put back after."""
    _received.clear()
    old = _install_signal_handlers()
    try:
        yield
    finally:
        _restore_signal_handlers(old)


def interrupted_before_start(exc: KeyboardInterrupt) -> int:
    """A signal before the pipeline existed (planning, verifying, preparing weights): said on
    stderr; the exit code, 128 + the signal number."""
    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    print(
        f"interrupted by {signal.Signals(signum).name} before the pipeline started",
        file=sys.stderr,
    )
    return 128 + signum


def _install_signal_handlers() -> dict[int, Any]:
    """SIGTERM and SIGHUP raise ``Interrupted`` in the main thread (as SIGINT raises
    KeyboardInterrupt), each noting the signal first; returns the handlers they replace.
    ``cluster.connect`` puts a Python handler back after ``ray.init`` replaces it."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    old = {}
    for name in HANDLED_SIGNALS:
        num = getattr(signal, name, None)
        if num is not None:
            old[num] = signal.signal(num, _raise_interrupted)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        old[signal.SIGINT] = signal.signal(signal.SIGINT, _sigint)
    return old


def _restore_signal_handlers(old: dict[int, Any]) -> None:
    for num, handler in old.items():
        signal.signal(num, handler)


# -- the admitted plan, on the console --------------------------------------------------------
def pipeline_options(args: argparse.Namespace, **more: Any) -> PipelineOptions:
    """The ``PipelineOptions`` of a command's flags (CONFIG's --profile, --mask, --address,
    --ray-logs, --skip-verify, --no-calibration, where it has them); ``more`` sets the rest."""
    from orchestrator.api import PipelineOptions

    return PipelineOptions(
        profile=args.profile,
        mask=tuple(args.mask or ()),
        address=getattr(args, "address", None),
        log_to_driver=getattr(args, "ray_logs", False),
        verify=not getattr(args, "skip_verify", False),
        calibration=not getattr(args, "no_calibration", False),
        **more,
    )


def console_admit_progress(console: Console, *, gates: bool = True) -> AdmitProgress:
    """``api.admit_plan``'s steps said on ``console``: the cluster probed (without --profile),
    and — with ``gates`` — the placements run unverified (--skip-verify) or verified, the
    gates with a progress bar. (``serve`` passes ``gates=False``: it says only the probe, as
    it always did.)"""
    # The class is made here, not at module level: its base lives in orchestrator.api, which
    # this module (imported by the CLI parser, via every command) must not import at load.
    from orchestrator.api import AdmitProgress

    class ConsoleAdmitProgress(AdmitProgress):
        def probing_cluster(self, address: str) -> None:
            from orchestrator.core.console import plain

            console.print(
                f"[dim]no --profile: probing each node of the Ray cluster at {plain(address)} …[/]"
            )

        def probed_cluster(self, address: str, profile: HardwareProfile) -> None:
            from orchestrator.runtime.cluster_probe import nodes_found

            console.print(
                f"planning on the cluster at {address}: {nodes_found(profile)}", markup=False
            )

        def unverified(self, stages: list[str]) -> None:
            if gates:
                console.print(
                    f"[yellow]running {', '.join(stages)} without gate evidence (--skip-verify): "
                    "node coverage and numerics are unchecked[/]"
                )

        def verifying(self, stages: list[str]) -> None:
            if gates:
                console.print(
                    f"[dim]verifying the exported placements of {', '.join(stages)} "
                    "(coverage and numeric gates) …[/]"
                )

        def run_gates(self, config: Any, profile: HardwareProfile, mask: frozenset[str]) -> Any:
            if not gates:
                return super().run_gates(config, profile, mask)
            return verify_with_progress(config, profile, mask, False, console)

    return ConsoleAdmitProgress()


def verify_with_progress(
    config: Any, profile: Any, mask: frozenset[str], force: bool, console: Console
) -> VerifyReport:
    """The gates for ``config``'s placements on this machine (``verify_pipeline``), with a
    progress bar on ``console`` when it is a terminal: ``verify``'s report, and ``run``'s
    gates before it plans again."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column

    from orchestrator.verify.run import candidates, require_this_machine, verify_pipeline

    require_this_machine(profile)
    total = len(candidates(config, profile, mask)[0])
    # One line that never wraps: the fixed-width parts first, then the step,
    # which takes what is left and ends in "…" on a narrow terminal. Not
    # markup: a step such as "gates on … [fp32]" would lose its "[fp32]".
    with Progress(
        SpinnerColumn(),
        MofNCompleteColumn(),
        BarColumn(bar_width=10),
        TimeElapsedColumn(),
        TextColumn(
            "{task.description}",
            markup=False,
            table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
        ),
        console=console,
        transient=True,
        disable=not console.is_terminal,
        expand=True,
    ) as progress:
        task = progress.add_task("verifying", total=total)

        def on_step(c: Any, what: str) -> None:
            progress.update(
                task, description=f"{c.stage.name} · {c.device.id} · {c.backend}: {what}"
            )

        def on_done(result: PlacementResult) -> None:
            progress.advance(task)

        return verify_pipeline(
            config, profile, mask=mask, force=force, on_step=on_step, on_done=on_done
        )


# -- a request's options ----------------------------------------------------------------------
def add_request_options(p: argparse.ArgumentParser) -> None:
    """--system, --temperature, --max-tokens: what ``run`` and ``chat`` take for a request."""
    p.add_argument(
        "--system", metavar="TEXT", help="system prompt for this request (replaces the config's)"
    )
    p.add_argument(
        "--temperature", type=float, metavar="T", help="sampling temperature (0: greedy)"
    )
    p.add_argument("--max-tokens", type=int, metavar="N", help="most tokens in the reply")


SAMPLING_FLAGS = {"temperature": "--temperature", "max_tokens": "--max-tokens"}


def sampling_of(args: argparse.Namespace) -> Sampling:
    """The sampling overrides the user gave (none: the config's own)."""
    out = Sampling()
    temperature = getattr(args, "temperature", None)
    if temperature is not None:
        out["temperature"] = temperature
    max_tokens = getattr(args, "max_tokens", None)
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    return out


def check_sampling(config: PipelineConfig, sampling: Sampling, where: str = "CONFIG") -> None:
    """The sampling overrides against the config, before anything is planned or
    started: every stage that takes the request must have sampling settings, the
    values in their ranges, and ``max_tokens`` below the stage's ``max_model_len``
    (the prompt needs room too). ``ConfigError`` naming the flag (exit 2)."""
    from pydantic import ValidationError

    from orchestrator.core.errors import ConfigError
    from stages.base import REQUEST

    problems: list[Problem] = []
    temperature = sampling.get("temperature")
    if temperature is not None and not math.isfinite(temperature):
        raise ConfigError.single(
            "--temperature",
            f"{temperature} is not a finite number",
            "give a temperature such as 0.7 (0: greedy)",
        )
    for stage in (s for s in config.stages if s.inputs[0] == REQUEST):
        base = getattr(stage, "sampling", None)
        if base is None:
            problems += [
                Problem(
                    SAMPLING_FLAGS[k],
                    f"stage {stage.name!r} (kind {stage.kind}) takes no sampling settings",
                    "leave it out for this pipeline",
                )
                for k in sampling
            ]
            continue
        try:
            type(base)(**{**base.model_dump(), **sampling})
        except ValidationError as exc:
            err = exc.errors()[0]
            key = str(err.get("loc", ("",))[0])
            flag = SAMPLING_FLAGS.get(key, f"sampling.{key}")
            problems.append(
                Problem(
                    flag,
                    f"{sampling.get(key, getattr(base, key, '?'))!r} for stage {stage.name!r}: "
                    f"{err.get('msg')}",
                    f"pick a value in the range of {where}'s stage sampling",
                )
            )
            continue
        limit = getattr(stage, "max_model_len", None)
        wanted = sampling.get("max_tokens")
        if limit and wanted is not None and wanted >= limit:
            problems.append(
                Problem(
                    "--max-tokens",
                    f"{wanted} is not below stage {stage.name!r}'s max_model_len of "
                    f"{limit} tokens in {where} (the prompt needs room too)",
                    f"use at most {limit - 1}, or raise max_model_len in {where}",
                )
            )
    if problems:
        raise ConfigError(problems)


def request_of(messages: list[ChatMessage], system: str | None, sampling: Sampling) -> ChatRequest:
    """The decode stage's request: the messages, with ``system`` (when given) as the first
    one, replacing the config's, and the sampling overrides (none: the config's)."""
    first = [ChatMessage(role="system", content=system)] if system else []
    return ChatRequest(tuple(first + messages), sampling=sampling or None)


# -- the reply, as it streams ---------------------------------------------------------------
async def stream_reply(
    pipeline: Pipeline,
    request: Request,
    prompt: str,
    console: Console,
    wav_out: WavOut | None = None,
    texts: dict[str, str] | None = None,
    outputs: dict[str, list[Any]] | None = None,
) -> Result:
    """Send ``request``; write the reply's text to the console as it is generated
    (and its audio to ``wav_out``); the request's ``Result``, for ``prompt``. When
    several stages return text (a transcript, then the reply), each stage's text
    starts on a line of its own after its name, and ``texts`` (when given) receives
    each stage's whole text, and ``outputs`` (when given) every other final output per stage, as
    plain data (numpy arrays as lists)."""
    from orchestrator.runtime.events import AudioChunk, OutputItem, TextDelta, collect

    events = []
    t0 = time.perf_counter()
    printer = ReplyPrinter(console)
    labelled = (
        sum(1 for s in pipeline.runtime.stages if s.final_output and s.final_output_type == "text")
        > 1
    )
    speaking: str | None = None
    import asyncio

    watcher = asyncio.create_task(_signal_not_lost(len(_received)), name="signal-watch")
    try:
        async for event in pipeline.stream(request):
            events.append(event)
            if isinstance(event, TextDelta):
                if texts is not None:
                    texts[event.stage] = texts.get(event.stage, "") + event.text
                if labelled and event.stage != speaking:
                    printer.write(("\n" if speaking is not None else "") + f"{event.stage}: ")
                    speaking = event.stage
                printer.write(event.text)
            elif isinstance(event, AudioChunk) and wav_out is not None:
                wav_out.add(event)
            elif isinstance(event, OutputItem) and outputs is not None:
                outputs.setdefault(event.stage, []).append(_plain(event.value))
    finally:
        watcher.cancel()
        printer.close()
    rid = events[0].request_id if events else "run"
    return collect(rid, prompt, events, time.perf_counter() - t0)


SIGNAL_CHECK_S = 0.1
"""How often a reply checks that a signal which came while it streamed was not lost."""


async def _signal_not_lost(seen: int) -> None:
    """Raise what a signal that came during the reply should have raised, in case its exception
    was swallowed on the way (``_received``: e.g. raised while a Cython module was being
    imported, "Exception ignored"), so the reply does not go on to its end. Raised in a task,
    it ends the event loop as the handler's own would have."""
    import asyncio

    while len(_received) == seen:
        await asyncio.sleep(SIGNAL_CHECK_S)
    check_signalled()


def _plain(value: Any) -> Any:
    """A final output as JSON-able data: arrays as (nested) lists, mappings and lists walked."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class ReplyPrinter:
    """A reply's text as it streams, on the console's stream, set off by blank lines.

    On a terminal the reply wraps between words; into a pipe or a file it is
    written unwrapped (a reader or viewer wraps it as it likes, and grep finds the
    reply as generated). Either way its control characters but newline and tab
    are removed (``terminal_text``): a model's reply is text from elsewhere, and an
    escape sequence in it (OSC 52 sets the clipboard) must not reach a terminal,
    now or when the file is shown; ``--json`` and the run record keep it exact."""

    def __init__(self, console: Console) -> None:
        from orchestrator.core.errors import terminal_text

        self._clean = terminal_text
        self.out: TextIO = sys.stderr if console.stderr else sys.stdout
        self.out.write("\n")
        self.text: WordWrap | TextIO = (
            WordWrap(self.out, console.width) if console.is_terminal else self.out
        )

    def write(self, text: str) -> None:
        self.text.write(self._clean(text))
        self.text.flush()

    def close(self) -> None:
        if isinstance(self.text, WordWrap):
            self.text.close()
        self.out.write("\n\n")
        self.out.flush()


class WordWrap:
    """Streamed text, wrapped between words at ``width`` columns.

    The reply arrives token by token and a token may end inside a word, so
    the text after the last blank is held back until the word is complete:
    the terminal then never splits a word across lines, at the cost of one
    token of delay on screen.
    """

    def __init__(self, out: TextIO, width: int) -> None:
        self.out = out
        self.width = max(width, 1)
        self.column = 0
        self.pending = ""

    def write(self, text: str) -> None:
        self.pending += text
        *words, self.pending = re.split(r"(\s)", self.pending)
        for piece in words:
            self._put(piece)

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self._put(self.pending)
        self.pending = ""
        self.out.flush()

    def _put(self, piece: str) -> None:
        from rich.cells import cell_len

        if not piece:
            return
        if piece == "\n":
            self.out.write("\n")
            self.column = 0
        elif piece.isspace():
            # A blank that would end exactly at the margin starts the next
            # line instead (the terminal would wrap there anyway).
            if self.column + 1 >= self.width:
                self.out.write("\n")
                self.column = 0
            elif self.column:
                self.out.write(" ")
                self.column += 1
        else:
            n = cell_len(piece)
            if self.column and self.column + n > self.width:
                self.out.write("\n")
                self.column = 0
            self.out.write(piece)
            self.column += n


# -- what is written: audio, the record --------------------------------------------------------
def _fallback(name: str) -> Path:
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix="omni-edge-kept-")) / name


class WavOut:
    """The reply's audio written to ``target`` as it is generated (``WavStreamWriter``:
    a valid WAV under a temporary name after every chunk, renamed on ``finish``).

    Chunks at another sample rate than the first are left out, as ``Result.audio``
    leaves them. A write that fails (the directory went away, the disk filled)
    stops the streaming; ``finish`` then writes the whole audio to the temp dir and
    notes where in ``kept``. ``discard`` (a failure, a signal) removes the
    temporary file: nothing is left at ``target``."""

    def __init__(self, target: str | Path) -> None:
        self.target = target
        self.writer: WavStreamWriter | None = None
        self.error: OSError | None = None

    def add(self, chunk: AudioChunk) -> None:
        from orchestrator.runtime.audio import WavStreamWriter

        if self.error is not None or (
            self.writer is not None and chunk.sample_rate != self.writer.sample_rate
        ):
            return
        try:
            if self.writer is None:
                self.writer = WavStreamWriter(self.target, chunk.sample_rate)
            self.writer.write(chunk.audio)
        except OSError as exc:
            self.error = exc
            self.discard()

    def finish(self, result: Result, kept: list[Problem]) -> Path:
        from orchestrator.runtime.audio import write_wav

        assert result.audio is not None and result.sample_rate
        if self.error is None and self.writer is not None:
            try:
                return self.writer.close()
            except OSError as exc:
                self.error = exc
                self.discard()
                self.writer = None
        spare = write_wav(_fallback(f"{result.request_id}.wav"), result.audio, result.sample_rate)
        reason = (
            self.error.strerror or self.error if self.error is not None else "no audio reached it"
        )
        kept.append(
            Problem(
                f"--out {self.target}",
                f"could not be written ({reason}); the audio is kept in {spare}",
                "copy it from there; the record names it too",
            )
        )
        return spare

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.discard()

    def written(self) -> JsonObject:
        """What this run put at ``target`` (for its record): the SHA-256 and size of its file,
        and the other writers of that target that were still writing when it finished."""
        w = self.writer
        if w is None or w.sha256 is None:
            return {}
        return {
            "wav_sha256": w.sha256,
            "wav_bytes": w.bytes,
            "wav_others_writing": w.others_writing,
        }

    def warning(self) -> str | None:
        """What to say when another process was still writing ``target`` as this run finished:
        the one that finishes last replaces this run's audio."""
        w = self.writer
        if w is None or not w.others_writing:
            return None
        pids = ", ".join(str(p) for p in w.others_writing)
        return (
            f"--out {self.target}: another process (pid {pids}) is writing it too; the one that "
            f"finishes last replaces this audio (this run wrote sha256 {w.sha256}, in its record)"
        )


def write_record_or_keep(
    doc: JsonObject, target: str | None, request_id: str, kept: list[Problem]
) -> Path:
    from orchestrator.runtime import record as rec

    try:
        return rec.write(doc, target, request_id=request_id)
    except OSError as exc:
        spare = rec.write(doc, _fallback(f"{request_id}.json"), request_id=request_id)
        kept.append(
            Problem(
                f"--record {target or rec.DEFAULT_DIR}",
                f"could not be written at the end "
                f"({exc.strerror or exc}); the record is kept in {spare}",
                "copy it from there",
            )
        )
        return spare
