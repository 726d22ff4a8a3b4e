"""Requests where they enter, and their checks before anything is sent to an actor.

* **Reading** (:func:`audio_request`: a WAV file or its bytes → an audio item;
  :func:`tensor_request`: a ``.npy`` → an array, never unpickled): the Python API, the CLI
  and the server's protocol all read requests here, under the caps they are given, and
  refuse with ``BadRequest`` (where → what → how to fix) on the header, before the samples
  or the array are read. :func:`prompt_label` is how a record names a request.
* **Checking against the started pipeline** (:func:`validate_request`, :func:`check_context`):
  reads only the graph (``runtime.graph.PipelineGraph``) and the request's record
  (``stages.requests``: its payload is its type): the payload against the stages that take
  it, each such stage's own check (``StageKind.validate_request``), a request entering at a
  stage (``entry``), and the context items a request carries for a stage (a realtime
  session's history for the decode stage).
"""

from __future__ import annotations

import io
import math
import wave
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.config import PipelineConfig
from orchestrator.core.errors import BadRequest
from orchestrator.runtime.graph import PipelineGraph
from stages.base import REQUEST
from stages.payloads import Array, AudioItem, Item, sample_rate_problem, spell
from stages.registry import get_kind
from stages.requests import (
    OFF_VALUES,
    AudioRequest,
    ChatRequest,
    Request,
    RequestLike,
    TensorRequest,
    TextRequest,
    as_request,
    asked,
)


def audio_entry_stages(config: PipelineConfig) -> list[str]:
    """The stages that take the request and consume audio: where an audio request goes."""
    out = []
    for stage in config.stages:
        if REQUEST in stage.inputs and any(
            t.kind == "audio" for t in get_kind(stage.kind).ports(stage).consumes
        ):
            out.append(stage.name)
    return out


def tensor_entry_stages(config: PipelineConfig) -> list[str]:
    """The stages that take the request and consume a tensor (or token ids, as an array):
    where an array request goes (``tensor_request``)."""
    out = []
    for stage in config.stages:
        if REQUEST in stage.inputs and any(
            t.kind in ("tensor", "token_ids") for t in get_kind(stage.kind).ports(stage).consumes
        ):
            out.append(stage.name)
    return out


MAX_AUDIO_SECONDS = 600.0
"""The longest recording ``audio_request`` reads by default: a spoken request is seconds
long; ten minutes is generous (``omni-edge serve --max-audio-seconds`` sets the server's)."""


def audio_request(
    source: str | Path | bytes,
    *,
    where: str | None = None,
    max_seconds: float | None = MAX_AUDIO_SECONDS,
    seconds_flag: str = "max_seconds",
) -> AudioItem:
    """The audio request of a WAV file (a path) or of its bytes: ``{"audio": float32 mono
    samples in [-1, 1), "sample_rate": int}`` (the Python API takes it as an
    ``AudioRequest``). 16-bit PCM, mono or stereo (the channels are
    averaged), read with the stdlib, at 8-192 kHz (``stages.payloads.MIN_SAMPLE_RATE``..
    ``MAX_SAMPLE_RATE``) and at most ``max_seconds`` long (None: any length; ``seconds_flag``
    names the setting in the refusal). ``BadRequest`` naming ``where`` (default: the path)
    for anything else — checked on the header, before the samples are read: no such file,
    not a WAV, another sample width, a rate out of range, too long, no samples."""
    import numpy as np

    name = where or (str(source) if not isinstance(source, bytes) else "audio")
    fix = "give a 16-bit PCM WAV file, mono or stereo (e.g. ffmpeg -i IN -ac 1 -c:a pcm_s16le OUT.wav)"
    try:
        handle: str | io.BytesIO = io.BytesIO(source) if isinstance(source, bytes) else str(source)
        with wave.open(handle, "rb") as w:
            width, channels, rate, frames = (
                w.getsampwidth(),
                w.getnchannels(),
                w.getframerate(),
                w.getnframes(),
            )
            _check_wav_header(name, fix, width, channels, rate, frames, max_seconds, seconds_flag)
            data = w.readframes(frames)
    except FileNotFoundError:
        raise BadRequest.single(name, "no such file", "check the path") from None
    except IsADirectoryError:
        raise BadRequest.single(name, "is a directory, not a WAV file", fix) from None
    except (OSError, EOFError, wave.Error) as exc:
        raise BadRequest.single(name, f"not a readable WAV file ({exc})", fix) from None
    samples = np.frombuffer(data[: len(data) - len(data) % (2 * channels)], dtype="<i2")
    if samples.size == 0:
        raise BadRequest.single(
            name, "holds no samples", "record something: the file's data chunk is empty"
        )
    mono = samples.reshape(-1, channels).astype(np.float32).mean(axis=1) / 32768.0
    return {"audio": mono.astype(np.float32), "sample_rate": int(rate)}


def _check_wav_header(
    name: str,
    fix: str,
    width: int,
    channels: int,
    rate: int,
    frames: int,
    max_seconds: float | None,
    seconds_flag: str,
) -> None:
    if width != 2:
        raise BadRequest.single(name, f"{8 * width}-bit samples: only 16-bit PCM is read", fix)
    if channels < 1:
        raise BadRequest.single(name, f"{channels} channel(s) at {rate} Hz", fix)
    problem = sample_rate_problem(rate)
    if problem is not None:
        raise BadRequest.single(
            name,
            f"declares a sample rate of {problem}",
            "resample it to 16000 Hz (ffmpeg -i IN -ar 16000 -ac 1 -c:a pcm_s16le OUT.wav)",
        )
    if max_seconds is not None and frames / rate > max_seconds:
        raise BadRequest.single(
            name,
            f"{frames / rate:.1f} s of audio: over the cap of {max_seconds:g} s per "
            f"recording ({seconds_flag})",
            f"send a shorter recording, or raise {seconds_flag}",
        )


MAX_TENSOR_BYTES = 256 * 1024 * 1024
"""The largest .npy ``tensor_request`` reads by default: an image or an embedding is
kilobytes to a few MiB; 256 MiB (a 8192×8192 float32 image) is generous for one request
(``omni-edge serve --max-tensor-mib`` sets the server's, far lower)."""


NPY_MAGIC = b"\x93NUMPY"
"""How every ``.npy`` file starts (numpy's format, ``numpy.lib.format.MAGIC_PREFIX``)."""


def tensor_request(
    source: str | Path | bytes,
    *,
    where: str | None = None,
    max_bytes: int | None = MAX_TENSOR_BYTES,
    bytes_flag: str = "max_bytes",
) -> Array:
    """The array of a ``.npy`` file (a path) or of its bytes, for a pipeline whose entry stage
    consumes a tensor (``Pipeline.run(array)``, or a mapping ``{input name: array}``).

    Read with ``numpy.load(allow_pickle=False)``: a file holding Python objects (an object
    array, which only unpickling can make) is refused, never unpickled; so are an ``.npz``
    archive (one ``.npy`` per input), a structured array, and a file over ``max_bytes``
    (None: any size; ``bytes_flag`` names the setting). ``BadRequest`` naming ``where``
    (default: the path) — before any stage sees it. Whether the array fits the entry stage
    (dtype, shape, input names) is the stage's check (``Pipeline.validate``)."""
    import numpy as np

    name = where or (str(source) if not isinstance(source, bytes) else "tensor")
    fix = "save it with numpy.save(path, array) from a numeric array (not an object array)"
    try:
        if isinstance(source, bytes):
            data = source
        else:
            size = Path(source).stat().st_size
            if max_bytes is not None and size > max_bytes:
                raise BadRequest.single(
                    name,
                    f"{size} bytes: over the cap of {max_bytes} bytes per tensor ({bytes_flag})",
                    f"send a smaller array, or raise {bytes_flag}",
                )
            data = Path(source).read_bytes()
    except FileNotFoundError:
        raise BadRequest.single(name, "no such file", "check the path") from None
    except IsADirectoryError:
        raise BadRequest.single(name, "is a directory, not a .npy file", fix) from None
    except OSError as exc:
        raise BadRequest.single(
            name, f"cannot be read ({exc.strerror or exc})", "check the path"
        ) from None
    if max_bytes is not None and len(data) > max_bytes:
        raise BadRequest.single(
            name,
            f"{len(data)} bytes: over the cap of {max_bytes} bytes per tensor ({bytes_flag})",
            f"send a smaller array, or raise {bytes_flag}",
        )
    if data[:4] == b"PK\x03\x04":
        raise BadRequest.single(
            name,
            "is an .npz archive, not one array",
            "give one .npy file per input (numpy.save), each named by its input",
        )
    if data[:6] != NPY_MAGIC:
        raise BadRequest.single(
            name, "is not a readable .npy file (it does not start with numpy's magic bytes)", fix
        )
    _check_npy_header(data, name, fix, max_bytes, bytes_flag)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
            raise BadRequest.single(
                name,
                "holds Python objects (an object array, stored pickled): it is not loaded, "
                "since unpickling runs code",
                fix,
            ) from None
        raise BadRequest.single(name, f"is not a readable .npy file ({exc})", fix) from None
    except (OSError, EOFError) as exc:
        raise BadRequest.single(name, f"is not a readable .npy file ({exc})", fix) from None
    if not isinstance(array, np.ndarray):
        raise BadRequest.single(name, f"holds a {type(array).__name__}, not an array", fix)
    if array.dtype.names is not None or array.dtype.kind not in "biufc":
        raise BadRequest.single(
            name,
            f"holds a {array.dtype} array: only numbers (bool, integers, floats) are taken",
            fix,
        )
    return array


def _check_npy_header(
    data: bytes, name: str, fix: str, max_bytes: int | None, bytes_flag: str
) -> None:
    """What a ``.npy`` header declares, checked before numpy allocates for it: a tiny file
    whose header claims a huge shape is a ``BadRequest`` naming the size (not a MemoryError),
    as is one that declares more data than it holds."""
    import numpy as np

    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        read = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }
        if version not in read:
            raise ValueError(f"format version {version[0]}.{version[1]} (numpy.save writes 1.0)")
        shape, _, dtype = read[version](buf)
    except (ValueError, EOFError, OSError) as exc:
        raise BadRequest.single(name, f"is not a readable .npy file ({exc})", fix) from None
    if dtype.hasobject:
        return  # np.load refuses it without unpickling, and says why
    declared = math.prod(shape) * dtype.itemsize
    if max_bytes is not None and declared > max_bytes:
        raise BadRequest.single(
            name,
            f"declares a {dtype} array of shape {list(shape)}: {declared} bytes, over the cap of "
            f"{max_bytes} bytes per tensor ({bytes_flag})",
            f"send a smaller array, or raise {bytes_flag}",
        )
    held = len(data) - buf.tell()
    if declared > held:
        raise BadRequest.single(
            name,
            f"declares {declared} bytes of data (a {dtype} array of shape {list(shape)}) but holds "
            f"{held}: the file is cut short, or its header is wrong",
            fix,
        )


def prompt_label(prompt: RequestLike) -> str:
    """A request as the result and the run record name it: its text, what audio it was, or
    the dtype and shape of its arrays (``Request.label``)."""
    return as_request(prompt).label()


CARRIED = {"text": "text", "audio": "audio", "tensor": "a tensor", "token_ids": "token ids"}
"""A request's payload as a refusal says it."""


def validate_request(graph: PipelineGraph, request: Request, entry: str | None = None) -> None:
    """Let each stage that takes the request check it: ``BadRequest`` before anything is sent.
    With ``entry``: the stage must take the request's payload — text that is not blank, or a
    recording (checked by the stage's kind). A value of no payload's shape
    (``stages.requests.OtherRequest``) is the stages' to judge; one that consumes neither
    text nor audio refuses it here."""
    if entry is not None:
        _validate_entry(graph, request, entry)
        return
    carried = request.payload
    for s in graph.stages:
        if REQUEST not in s.inputs:
            continue
        takes = graph.ports(s.name).consumes
        kinds = {t.kind for t in takes}
        fits = carried in kinds or (
            isinstance(request, TensorRequest)
            and "token_ids" in kinds
            and all(a.dtype.kind in ("i", "u") for _, a in request.named())
        )
        # a text or audio stage's own check names what it takes (its kind's words); arrays, and
        # the stages that take neither, are checked here
        if not fits and (carried in ("tensor", "token_ids") or not kinds & {"text", "audio"}):
            _refuse_payload(s.name, s.kind, request, spell(takes))
        _check_shaping(s.name, s.kind, graph.config.stage(s.name), request)
        graph.kinds[s.name].validate_request(
            graph.plan.stage(s.name), graph.config.stage(s.name), request
        )


def _check_shaping(stage: str, kind: str, config: object, request: Request) -> None:
    """``BadRequest`` when a chat request asks for what shapes a decoded reply (a stop string, a
    penalty: ``stages.requests.OFF_VALUES``) of a stage that does not decode (no ``sampling``
    in its config), which would otherwise answer as if it had not been asked."""
    if not isinstance(request, ChatRequest) or not request.sampling or hasattr(config, "sampling"):
        return
    for key in OFF_VALUES:
        if asked(request.sampling, key):
            raise BadRequest.single(
                f"request.sampling.{key}",
                f"{stage} ({kind}), which takes the request, does not decode text: it cannot "
                "apply it, and the reply would differ",
                "leave it out, or send it to a pipeline whose entry stage is an ar_decode stage",
            )


def _refuse_payload(stage: str, kind: str, request: Request, takes: str) -> None:
    came = (
        f"{request.described} (no payload a request carries)"
        if request.payload is None
        else CARRIED[request.payload]
    )
    raise BadRequest.single(
        "request",
        f"{came} came, and {stage} ({kind}), which takes the request, consumes {takes}",
        f"send {takes}: text as a string, audio as {{'audio', 'sample_rate'}}, a tensor as a numpy "
        "array or a mapping of the graph's input names to arrays (docs/pipelines.md#request-payloads)",
    )


def _validate_entry(graph: PipelineGraph, request: Request, entry: str) -> None:
    payload = "audio" if isinstance(request, AudioRequest) else "text"
    takers = graph.entry_stages(payload)
    if entry not in takers:
        what = (
            "is not a stage of this pipeline"
            if entry not in graph.kinds
            else (f"({graph.plan.stage(entry).kind}) does not take {payload}")
        )
        raise BadRequest.single(
            "entry",
            f"{entry!r} {what}",
            f"enter at a stage that takes {payload}: {', '.join(takers) or 'none has one'}",
        )
    if payload == "audio":
        graph.kinds[entry].validate_request(
            graph.plan.stage(entry), graph.config.stage(entry), request
        )
        return
    if not isinstance(request, TextRequest) or not request.text.strip():
        came = "blank text" if isinstance(request, TextRequest) else _type_name(request)
        raise BadRequest.single(
            "prompt", f"{came}: stage {entry!r} takes text", "send the text to speak"
        )


def _type_name(request: Request) -> str:
    """The type a caller passed, as an entry's refusal names it (``dict``, ``ndarray``)."""
    return type(request.item()).__name__


def check_context(
    graph: PipelineGraph, context: Mapping[str, Sequence[Item]], entry: str | None
) -> None:
    """Each stage ``context`` names runs for this request and is fed by one other stage — or is
    the ``entry`` stage, fed the request's text as that stage would be (the context first: a
    realtime turn entering at the thinker with the session's own transcript)."""
    runs = {s.name for s in graph.downstream(entry)}
    for name in context:
        if name not in runs:
            raise BadRequest.single(
                f"context.{name}",
                "is not a stage this request runs",
                f"name one of {', '.join(sorted(runs))}",
            )
        inputs = list(graph.plan.stage(name).inputs)
        if REQUEST in inputs or name in graph.joins:
            raise BadRequest.single(
                f"context.{name}",
                "takes the request itself or joins several inputs: "
                "context is for a stage fed by one other stage",
                "put what it needs into the request instead",
            )
