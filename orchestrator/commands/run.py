"""``omni-edge run CONFIG --prompt ... --out reply.wav``: plan, start, stream one request.

Prints the plan summary, streams the reply text as it is generated, writes
the audio as it is generated (16-bit PCM WAV at the voice's sample rate: a
valid WAV under a temporary name of this run's own after every chunk, fsynced
and renamed to ``--out`` when the request is done; nothing at ``--out`` after a
failure or a signal; of two runs writing one ``--out``, the last to finish wins
whole, and each record names the SHA-256 of what its run wrote), writes the
run record (never over another one), and ends with a per-stage table: device,
backend, time to first output, throughput, budgeted vs measured peak and their
ratio.

``--input NAME=FILE.npy`` (repeatable; ``--input FILE.npy`` for a graph of one
input) sends arrays instead, to a pipeline whose entry stage consumes a tensor
(an exported graph): NAME is the graph's input, each file is read without
unpickling (``api.tensor_request``), and the arrays are checked against the
graph's inputs (dtype, shape, names) before anything starts — exit 2 naming
``--input`` otherwise (docs/pipelines.md, "Request payloads").

``--prompt -`` reads the prompt from stdin. ``--audio FILE.wav`` sends a
recording instead (16-bit PCM, mono or stereo, any rate; read with the
stdlib), to a pipeline whose entry stage takes audio (a ``vad`` or ``asr``
stage, e.g. ``configs/examples/voice-chat.yaml``); a file that cannot be read,
or a pipeline with no such stage, is exit 2 naming it. When several stages
return text (the transcript and the reply), each one's text is printed under
its stage's name, and ``--json`` has them per stage in ``texts``. A final output
that is neither text nor audio (an Omni talker's codec codes, ``token_ids``) is
counted on the console and listed per stage in ``--json``'s ``outputs`` (and the
run record's ``output.outputs``), as plain data.

``--system`` replaces the decode stage's system prompt for this request;
``--temperature`` and ``--max-tokens`` override its sampling. They are checked against the config (the stage's
sampling ranges, ``max_tokens`` below ``max_model_len``) before anything is
planned or started; the request then goes to the stage as
``{"messages": [...], "sampling": {...}}``.

Exit codes: 0 done, 2 bad input, 3 plan refused (the refusals are printed),
4 a stage failed (stage, device and cause are printed); 130, 143, 129 for
SIGINT, SIGTERM, SIGHUP (the pipeline closed and the record written first).

Heavy modules (Ray, vLLM, ONNX Runtime) are imported inside ``run()`` only:
the CLI parser imports every command module, and ``omni-edge plan`` must stay
light.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.commands.common import (
    Interrupted,
    WavOut,
    add_request_options,
    as_received,
    check_sampling,
    check_signalled,
    console_admit_progress,
    interrupted_before_start,
    pipeline_options,
    request_of,
    sampling_of,
    signals_handled,
    stream_reply,
    write_record_or_keep,
)
from orchestrator.core.errors import Problem
from stages.requests import AudioRequest, ChatMessage, Request, TensorRequest, TextRequest

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from orchestrator.api import Pipeline
    from orchestrator.config import PipelineConfig
    from orchestrator.core.documents import JsonObject
    from orchestrator.core.ledger import MeasuredPeak
    from orchestrator.core.plan import PipelinePlan
    from orchestrator.runtime.events import Result
    from stages.payloads import Array


def add_arguments(p: argparse.ArgumentParser) -> None:
    from orchestrator.commands.plan import add_calibration_flag, add_pipeline_inputs

    add_pipeline_inputs(
        p, profile_help="plan for a recorded hardware profile instead of probing this machine"
    )
    said = p.add_mutually_exclusive_group(required=True)
    said.add_argument(
        "--prompt", help="the request: what to say to the pipeline ('-': read it from stdin)"
    )
    said.add_argument(
        "--audio",
        metavar="WAV",
        help="the request as a recording: a 16-bit PCM WAV file (mono or stereo), for a pipeline whose "
        "entry stage takes audio",
    )
    said.add_argument(
        "--input",
        action="append",
        metavar="NAME=NPY",
        help="the request as arrays, for a pipeline whose entry stage consumes a tensor (an exported "
        "graph): NAME=FILE.npy feeds the graph's input NAME (repeat for each input); FILE.npy alone "
        "feeds a graph of one input",
    )
    add_request_options(p)
    p.add_argument("--out", metavar="WAV", help="write the audio output here (16-bit PCM WAV)")
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="join an existing Ray cluster instead of starting a local one "
        "(without --profile: plan on its nodes, each probed where it runs)",
    )
    p.add_argument(
        "--record", metavar="PATH", help="run record: a .json file, or a directory (default: runs/)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON summary on stdout (human output goes to stderr)",
    )
    p.add_argument(
        "--ray-logs",
        action="store_true",
        help="show the actors' logs (vLLM, ONNX Runtime) on stderr",
    )
    p.add_argument(
        "--skip-verify",
        action="store_true",
        help="run exported placements that have no gate evidence yet (default: run `verify` for them first)",
    )
    add_calibration_flag(p)


def read_prompt(value: str, stdin: TextIO | None = None) -> str:
    """``--prompt``'s text; ``-`` reads stdin whole (``ConfigError`` when it is empty)."""
    from orchestrator.core.errors import ConfigError

    if value != "-":
        return value
    text = (stdin or sys.stdin).read()
    if not text.strip():
        raise ConfigError.single(
            "--prompt -",
            "stdin was empty: there is no prompt",
            "pipe the prompt in, e.g. echo 'Tell me one fact about the Moon.' | "
            "omni-edge run CONFIG --prompt -",
        )
    return text.strip()


def audio_request_of(args: argparse.Namespace, config: PipelineConfig) -> AudioRequest:
    """``--audio``'s recording as the request, after checking the pipeline takes audio and
    that no text-only option was given (``ConfigError``/``BadRequest``, exit 2)."""
    from orchestrator.api import audio_entry_stages, audio_request
    from orchestrator.core.errors import ConfigError
    from stages.base import REQUEST

    if not audio_entry_stages(config):
        entries = ", ".join(f"{s.name} ({s.kind})" for s in config.stages if REQUEST in s.inputs)
        raise ConfigError.single(
            "--audio",
            f"pipeline {config.name!r} has no entry stage that takes audio "
            f"(the request goes to {entries or 'no stage'})",
            "use --prompt with this pipeline, or a pipeline whose first stage is a vad or asr stage "
            "(configs/examples/voice-chat.yaml)",
        )
    if args.system:
        raise ConfigError.single(
            "--system",
            "a recording goes to the audio entry stage, which takes no system prompt",
            "leave --system out with --audio (the config's system_prompt applies downstream)",
        )
    recording = audio_request(args.audio, where=f"--audio {args.audio}")
    return AudioRequest(recording["audio"], recording["sample_rate"])


def tensor_request_of(args: argparse.Namespace, config: PipelineConfig) -> TensorRequest:
    """``--input``'s arrays as the request: one bare array (``FILE.npy``) or a mapping of the
    graph's input names to arrays (``NAME=FILE.npy``, repeated), each file read without
    unpickling (``api.tensor_request``), after checking the pipeline takes a tensor and no
    text-only option was given (``ConfigError``/``BadRequest``, exit 2). Whether the arrays
    fit the entry stage is checked next, by ``Pipeline.validate``."""
    from orchestrator.api import tensor_entry_stages, tensor_request
    from orchestrator.core.errors import ConfigError
    from stages.base import REQUEST

    if not tensor_entry_stages(config):
        entries = ", ".join(f"{s.name} ({s.kind})" for s in config.stages if REQUEST in s.inputs)
        raise ConfigError.single(
            "--input",
            f"pipeline {config.name!r} has no entry stage that consumes a tensor "
            f"(the request goes to {entries or 'no stage'})",
            "use --prompt with this pipeline, or one whose entry stage is an exported graph "
            "taking arrays (docs/pipelines.md#request-payloads)",
        )
    for flag in ("system", "temperature", "max_tokens"):
        if getattr(args, flag, None) is not None:
            raise ConfigError.single(
                f"--{flag.replace('_', '-')}",
                "arrays go to the tensor entry stage, which takes no system prompt or sampling",
                "leave it out with --input (the config's applies)",
            )
    named: dict[str, Array] = {}
    bare: list[str] = []
    for value in args.input:
        name, sep, path = value.partition("=")
        if not sep or not name or "/" in name or not path:
            bare.append(value)
            continue
        if name in named:
            raise ConfigError.single(
                f"--input {value}", f"input {name!r} is given twice", "give each input once"
            )
        named[name] = tensor_request(path, where=f"--input {value}", max_bytes=None)
    if bare and (named or len(bare) > 1):
        raise ConfigError.single(
            f"--input {bare[0]}",
            "names no input, and more than one array is given",
            "name each array by the graph's input it feeds: --input NAME=FILE.npy",
        )
    if bare:
        return TensorRequest(tensor_request(bare[0], where=f"--input {bare[0]}", max_bytes=None))
    return TensorRequest(named)


def check_outputs(args: argparse.Namespace) -> None:
    """Every path the user named is writable, before any work (``ConfigError``, exit 2)."""
    from orchestrator.core.fileio import check_writable

    if args.out:
        check_writable(args.out, what="--out")
    if args.record:
        from orchestrator.runtime.record import check_target

        check_target(args.record, what="--record")


def needs(args: argparse.Namespace) -> tuple[str, ...]:
    """Starting a pipeline needs the ``run`` extra (``orchestrator.core.extras``)."""
    from orchestrator.core.extras import RUN_MODULES

    return RUN_MODULES


def run(args: argparse.Namespace) -> int:
    with signals_handled():
        try:
            return _run(args)
        # a signal before the pipeline existed (planning, verifying, preparing weights)
        except KeyboardInterrupt as exc:
            received = as_received(exc)
            assert isinstance(received, KeyboardInterrupt)
            return interrupted_before_start(received)


def _run(args: argparse.Namespace) -> int:
    """The command: the request read and checked, an admitted plan (planned, verified where gate
    evidence is missing, re-planned), the pipeline run, its record written, the result printed."""
    from orchestrator.api import Pipeline, admit_plan
    from orchestrator.commands.exits import EXIT_OK, EXIT_REFUSED
    from orchestrator.commands.progress import TerminalProgress
    from orchestrator.config import load_config
    from orchestrator.core.console import make_console

    # With --json, stdout carries only the JSON; what a person reads goes to stderr.
    console = make_console(stderr=args.json)
    check_outputs(args)
    prompt = read_prompt(args.prompt) if args.prompt is not None else ""
    config = load_config(args.config)
    request, prompt = _request(args, config, prompt)
    options = pipeline_options(args, record=None)
    admission = admit_plan(config, options, console_admit_progress(console))
    plan = admission.plan
    if not plan.admitted:
        from orchestrator.commands.render import print_plan

        print_plan(plan, console)
        if args.json:
            json.dump({"admitted": False, "plan": plan.to_json()}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        return EXIT_REFUSED
    print_summary(plan, console)
    pipeline = Pipeline.of_admission(admission, options)
    # The request is checked before anything starts (BadRequest, exit 2, nothing
    # written): its shape first, then — once the weights are prepared — its length
    # with the decode stage's own tokenizer.
    validate_as_given(pipeline, request, args)
    pipeline.prepare(progress=TerminalProgress())
    pipeline.validate(request)
    check_signalled()
    run = _Outcome()
    _execute(pipeline, request, prompt, console, args, run)
    doc, path = _record(pipeline, args, run, console)
    if isinstance(run.failure, KeyboardInterrupt):
        signum = run.failure.signum if isinstance(run.failure, Interrupted) else 2
        print(
            f"interrupted by {signal.Signals(signum).name}: closed the pipeline; record: {path}",
            file=sys.stderr,
        )
        return 128 + signum
    if run.failure is not None:
        console.print(f"record: {path}", soft_wrap=True, markup=False)
        raise run.failure
    if run.kept:
        from orchestrator.core.errors import ConfigError

        raise ConfigError(list(run.kept))
    _report(pipeline, args, run, doc, path, console)
    return EXIT_OK


def _request(args: argparse.Namespace, config: Any, prompt: str) -> tuple[Request, str]:
    """The request the flags describe (text, audio or tensors) and the prompt's label for display."""
    sampling = sampling_of(args)
    check_sampling(config, sampling, where=args.config)
    if args.input:
        tensors = tensor_request_of(args, config)
        return tensors, tensors.label()
    if args.audio is not None:
        recording = audio_request_of(args, config)
        return recording, f"{args.audio} {recording.label()}"
    # Without --system or sampling the prompt goes as it is (any first stage takes text).
    request: Request = (
        request_of([ChatMessage(role="user", content=prompt)], args.system, sampling)
        if args.system or sampling
        else TextRequest(prompt)
    )
    return request, prompt


@dataclass
class _Outcome:
    """What one run left: its result, the WAV written, a failure, the measured peaks, the
    problems kept for the end (``kept``: where, what, fix), the texts and outputs streamed."""

    result: Result | None = None
    wav: Path | None = None
    failure: BaseException | None = None
    measured: dict[str, MeasuredPeak] = field(default_factory=dict)
    kept: list[Problem] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, list[Any]] = field(default_factory=dict)
    wav_written: JsonObject = field(default_factory=dict)
    """What this run's file at --out holds (``WavOut.written``: its SHA-256 and size)."""
    wav_warning: str | None = None


def _execute(
    pipeline: Pipeline,
    request: Request,
    prompt: str,
    console: Any,
    args: argparse.Namespace,
    run: _Outcome,
) -> None:
    """Start the pipeline, stream the reply (and the WAV), measure the peaks; a failure or a
    signal is kept in ``run``, and nothing half-written is left at --out."""
    from orchestrator.commands.progress import TerminalProgress

    wav_out = WavOut(args.out) if args.out else None
    try:
        console.print("[dim]starting: Ray, one actor per device, stages under the ledger …[/]")
        t0 = time.perf_counter()
        pipeline.start(progress=TerminalProgress())
        check_signalled()  # one that came while Ray or a stage was loading, its exception swallowed
        console.print(f"[dim]started in {time.perf_counter() - t0:.1f} s[/]")
        run.result = result = asyncio.run(
            stream_reply(pipeline, request, prompt, console, wav_out, run.texts, run.outputs)
        )
        check_signalled()
        if wav_out is not None:
            if result.audio is None or not result.sample_rate:
                console.print("[yellow]no stage produced audio; nothing written to --out[/]")
            else:
                run.wav = wav_out.finish(result, run.kept)
                run.wav_written = wav_out.written()
                run.wav_warning = wav_out.warning()
        run.measured = pipeline.runtime.measure()
    except (Exception, KeyboardInterrupt) as exc:
        run.failure = as_received(exc)  # the signal that came, not what Ray made of it
    except SystemExit as exc:
        # a SIGTERM inside ray.init, whose own handler exits with the signal number
        if exc.code != signal.SIGTERM:
            raise
        run.failure = Interrupted(signal.SIGTERM)
    if run.failure is not None and wav_out is not None:
        wav_out.discard()  # nothing half-written at --out


def _record(
    pipeline: Pipeline, args: argparse.Namespace, run: _Outcome, console: Any
) -> tuple[JsonObject, Path]:
    """Close the pipeline and write the run record, whatever happened: after close, so its ledger
    is the one left behind (a leak shows), and a failure is in it."""
    from orchestrator.core.errors import LedgerLost, StageFailed
    from orchestrator.runtime import record as rec

    try:
        final = pipeline.close()
    except (Exception, KeyboardInterrupt) as exc:  # a second signal while closing
        run.failure = run.failure or as_received(exc)
        final = {}
    if pipeline.runtime.ledger_lost and not isinstance(
        run.failure, (StageFailed, KeyboardInterrupt)
    ):
        run.failure = LedgerLost(pipeline.runtime.ledger_lost)
    error = (
        None
        if run.failure is None
        else {
            "type": type(run.failure).__name__,
            "message": _one_line(run.failure),
            **_signal_of(run.failure),
        }
    )
    result = run.result
    doc = rec.build(
        pipeline.runtime,
        [result] if result is not None else [],
        measured=run.measured,
        ledger=final,
        extra={
            "prepare_s": round(pipeline.prepare_s, 3),
            "output": {
                "wav": str(run.wav) if run.wav else None,
                **run.wav_written,
                "texts": run.texts,
                "outputs": run.outputs,
            },
            "error": error,
            "ledger_lost": pipeline.runtime.ledger_lost,
        },
    )
    path = write_record_or_keep(
        doc, args.record, result.request_id if result is not None else "run", run.kept
    )
    if pipeline.final_ledger and pipeline.final_ledger.get("held_bytes"):
        console.print(
            f"[red]ledger still holds {pipeline.final_ledger['held_bytes']} bytes after close[/]"
        )
    return doc, path


def _report(
    pipeline: Pipeline,
    args: argparse.Namespace,
    run: _Outcome,
    doc: JsonObject,
    path: Path,
    console: Any,
) -> None:
    """A run that went well: the stage table, the outputs, the WAV and the record (and --json)."""
    result, wav = run.result, run.wav
    assert result is not None
    print_stage_table(doc["stages"], console)
    for stage, items in run.outputs.items():
        console.print(
            f"{stage}: {len(items)} items ({next(s.final_output_type for s in pipeline.runtime.stages if s.name == stage)})"
            + (" — in --json's outputs" if not args.json else "")
        )
    if wav:
        console.print(
            f"audio: {wav} ({result.audio_seconds:.2f} s at {result.sample_rate} Hz)",
            soft_wrap=True,
            markup=False,
        )
    if run.wav_warning:
        console.print(f"warning: {run.wav_warning}", style="yellow", soft_wrap=True, markup=False)
    # Paths are printed whole (soft_wrap: the terminal wraps them, no
    # newline is inserted), so they can be copied and pasted.
    console.print(f"record: {path}", soft_wrap=True, markup=False)
    if args.json:
        json.dump(
            {
                "admitted": True,
                "text": result.text,
                "texts": run.texts,
                "outputs": run.outputs,
                "wav": str(wav) if wav else None,
                **run.wav_written,
                "record": str(path),
                "stages": [
                    {k: v for k, v in row.items() if k != "load_info"} for row in doc["stages"]
                ],
                "time_to_first_token_s": result.time_to_first_token_s,
                "time_to_first_audio_s": result.time_to_first_audio_s,
                "total_s": result.total_s,
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")


def validate_as_given(pipeline: Pipeline, request: Request, args: argparse.Namespace) -> None:
    """``pipeline.validate(request)``; with ``--input``, each problem is named by the flag
    (``--input: request (stage proj, kind exported_graph): embedding``), exit 2."""
    from orchestrator.core.errors import BadRequest

    try:
        pipeline.validate(request)
    except BadRequest as exc:
        if not getattr(args, "input", None):
            raise
        raise BadRequest(
            [Problem(f"--input: {p.where}", p.what, p.fix) for p in exc.problems]
        ) from None


def _signal_of(exc: BaseException) -> JsonObject:
    """``{"signal": "SIGTERM"}`` for a run a signal stopped (the one that came), else nothing."""
    if isinstance(exc, Interrupted):
        return {"signal": signal.Signals(exc.signum).name}
    if isinstance(exc, KeyboardInterrupt):
        return {"signal": "SIGINT"}
    return {}


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, Interrupted):
        return f"interrupted by {signal.Signals(exc.signum).name}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by SIGINT"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def print_summary(plan: PipelinePlan, console: Console) -> None:
    from orchestrator.commands.render import Notes, labelled, stages_sheet

    console.print(
        stages_sheet(
            plan, Notes(), title=f"plan: pipeline {plan.pipeline!r} on {plan.profile} (admitted)"
        )
    )
    for note in plan.notes:
        console.print(labelled("note:", note, style="dim"))


def print_stage_table(rows: list[JsonObject], console: Console) -> None:
    from rich.text import Text

    from orchestrator.commands.render import Col, Sheet, spaced
    from orchestrator.core.units import fmt_bytes

    # Two tables, time then memory: one with all eight columns is ~90 wide.
    timing = Sheet(
        "stages",
        (
            Col("stage"),
            Col("device"),
            Col("backend"),
            Col("first output", "right"),
            Col("throughput", "right"),
        ),
    )
    memory = Sheet(
        "memory (budgeted vs measured peak)",
        (
            Col("stage"),
            Col("budget", "right"),
            Col("measured", "right"),
            Col("budget/measured", "right"),
        ),
    )
    for r in rows:
        first = r.get("time_to_first_output_s")
        tp = r.get("throughput") or {}
        peak = r.get("measured_peak_bytes")
        ratio = r.get("budget_over_measured")
        over = ratio is not None and r.get("within_budget") is False
        timing.add_row(
            r["stage"],
            r.get("device") or "-",
            r.get("backend") or "-",
            f"{first * 1000:.0f} ms" if first is not None else "-",
            f"{tp['value']:g} {tp['unit']}" if tp else "-",
        )
        memory.add_row(
            r["stage"],
            fmt_bytes(r["budget_bytes"]),
            fmt_bytes(peak) if peak is not None else "-",
            Text(
                f"{ratio:.2f}"
                + (
                    " OVER"
                    if over
                    else " (bound)"
                    if r.get("upper_bound") and r.get("within_budget") is None
                    else ""
                ),
                style="bold red" if over else "",
            )
            if ratio is not None
            else "-",
        )
    console.print(spaced([timing, memory]))
