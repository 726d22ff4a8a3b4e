"""The stage-kind interface: what the planner asks of a kind, and when.

A stage *kind* is code (a subclass of :class:`StageKind`, registered by its
``kind`` name); an exported stage is data (an artifact directory), so adding a
new exported stage needs no code at all, and adding a new kind needs no change
to the orchestrator.

Lifecycle, planning side (no weights read, no engine started, no session
opened; heavy imports forbidden):

1. ``describe(stage)`` — once per plan. Reads metadata (config.json,
   safetensors headers, an ONNX graph's initializer sizes) and returns an
   :class:`ArtifactInfo`. Raises ``ConfigError`` when the artifact cannot be
   read (the CLI reports it as bad input, exit 2).
2. ``check(stage, info, device, backend)`` — once per candidate device, after
   the orchestrator has checked that the device exists and its route is
   reachable. Returns the refusals that make the device impossible for this
   stage regardless of memory (format, architecture, missing export), or [].
3. ``gate_spec(stage, info, device, backend)`` — once per candidate that
   ``check`` accepted, for kinds whose ``needs_gates`` is true: what the
   coverage and numeric gates must measure before the placement is trusted, as
   plain data (:class:`GateSpec`), or None. The planner asks the evidence cache
   for a verdict on it (``omni-edge verify`` measures it); the kind never
   imports ``orchestrator.verify``.
4. ``reservations(stage, info, device, backend, pool)`` — every byte the
   stage intends to hold on the device's pool, with lifetime and evidence.
5. ``engine_kwargs(...)`` — the backend's own settings derived from the plan.

Run side, in the order the runtime calls them (the decisions are plain data
the kind declares; the runtime acts on them):

6. ``prepare(stage_plan, progress)`` — in the caller's process, once per
   admitted stage, before any actor starts: turn weights into the form the
   runner loads (ar_decode converts a GGUF once into a cached checkpoint).
7. ``actor_env(stage_plan)`` — in the caller's process, before the device
   actor is created: environment variables its process needs before anything
   is imported; the runtime merges those of every stage on the device.
8. ``runner(stage_plan, stage, route)`` — inside the device actor: returns a
   :class:`StageRunner` (it may import heavy modules), after the actor imported
   the kind's ``runner_imports`` one stage at a time.
9. ``warm_request_check(stage_plan)`` — in the caller's process while the
   pipeline starts: load what the request check needs (a tokenizer).
10. ``validate_request(stage_plan, stage, request)`` — in the caller's process,
    per request a stage of this kind takes, before anything reaches an actor:
    ``BadRequest`` for a request (``stages.requests.Request``) it cannot take.

Every hook has a default here; the runtime and the server call them without
asking whether a kind has one, and never name a kind.

Class data the config loader, the planner, the runtime and the server read:
``consumes`` and ``produces`` (payload types, ``stages.payloads``;
``ports(stage)`` narrows them per stage), ``text_input`` (how a text stream is
cut before it reaches this stage), ``runner_imports``, ``cpu_thread_weight``
(its share when a CPU's cores are split) and ``takes_conversation`` (whether a
realtime session passes it the conversation so far); ``turn_detection(stage_plan)``
says whether a stage cuts a spoken stream into turns.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol, TypedDict

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from orchestrator.core.backends import SessionSpec
from orchestrator.core.cpu_threads import OTHER_WEIGHT
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import Refusal
from orchestrator.core.validation import Strict, refusal, shown, unique
from stages.payloads import PAYLOAD_KINDS, AudioItem, Item, PayloadKind, Ports, parse_payloads
from stages.requests import Request

if TYPE_CHECKING:
    import threading

    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device, Route

MAX_CPU_THREADS = 4096
"""As many threads as a profile may have logical CPUs (``orchestrator.core.profile.MAX_CPU_CORES``);
more in a config is a typo."""
MAX_REPLICAS = 16
"""The most instances of one stage: more than the recorded cluster has devices (5) three times
over, so more in a config is a typo. Each replica is a whole engine with its own reservations
(on a device another replica of it uses, its own process), and the planner tries each distinct
spread of the replicas over the stage's options once: at most C(options + N, N) partial spreads,
4,845 for 16 replicas over 4 options."""
REQUEST = "request"
"""The input name that means 'the user's request' rather than another stage."""

STAGE_NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*")
"""A stage name: a letter, then letters, digits, '_' and '-' (it becomes part of Ray
actor names, metric labels and run-record keys)."""
MAX_STAGE_NAME = 64
"""The longest stage name, as a pipeline's (``orchestrator.config.PIPELINE_NAME_PATTERN``):
a stage name is a column of every table the CLI prints, and a 10,000-character one
filled them all."""

Join = Literal["all", "zip", "latest"]
"""How a stage with several inputs combines them into one joined item, a ``dict``
keyed by source (``orchestrator.runtime.joins``): ``zip`` — the i-th item of every
input, in sequence order; ``all`` — once every input has ended, each input's whole
output as a list; ``latest`` — on every item of any input, the newest item of each
input seen so far (an input that produced nothing yet is absent). Only a kind whose
``takes_join`` is true may have several inputs."""

Progress = Callable[[int | None, str], Callable[..., None]]
"""A progress display handed to ``StageKind.prepare``: ``progress(total, description)``
starts a step of ``total`` units (None: one unit of unknown length) and returns
``advance(n=1)``."""


MAX_RESTARTS = 1000
"""The most restarts a stage's ``restart.max`` may allow in its window: more is a typo (a stage
that dies a thousand times in its window is in a crash loop by any measure)."""
MAX_RESTART_WINDOW_S = 7 * 86400.0
"""The longest ``restart.window_s``: a week; deaths further apart are not a loop."""
MAX_BACKOFF_S = 3600.0
"""The longest wait before a restart (``backoff_s``, ``backoff_max_s``): an hour."""


class RestartConfig(Strict):
    """How a stage whose device actor (or route worker) died is brought back: restarted on its
    placement after a back-off (``backoff_s``, doubled after each death in the window, at most
    ``backoff_max_s``), until ``max`` restarts within ``window_s`` seconds; one death more is a
    crash loop, and the stage stays down (docs/reliability.md, "Restarts")."""

    max: int = Field(
        5,
        ge=1,
        le=MAX_RESTARTS,
        strict=True,
        description="Restarts allowed within window_s; one death more is a crash loop.",
    )
    window_s: float = Field(
        600.0,
        gt=0,
        le=MAX_RESTART_WINDOW_S,
        allow_inf_nan=False,
        description="The window, in seconds, deaths are counted over.",
    )
    backoff_s: float = Field(
        1.0,
        gt=0,
        le=MAX_BACKOFF_S,
        allow_inf_nan=False,
        description="The wait before the first restart; doubled after each death in the window.",
    )
    backoff_max_s: float = Field(
        30.0,
        gt=0,
        le=MAX_BACKOFF_S,
        allow_inf_nan=False,
        description="The longest wait before a restart.",
    )

    @model_validator(mode="after")
    def _backoff(self) -> RestartConfig:
        if self.backoff_max_s < self.backoff_s:
            raise refusal(
                f"backoff_max_s ({self.backoff_max_s:g} s) is shorter than backoff_s "
                f"({self.backoff_s:g} s)",
                "make backoff_max_s at least backoff_s",
            )
        return self

    def backoff(self, deaths: int) -> float:
        """Seconds to wait before the restart that follows the ``deaths``-th death in the window
        (1-based): ``backoff_s`` × 2^(deaths − 1), at most ``backoff_max_s``."""
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** max(0, min(deaths - 1, 30))))

    def said(self) -> str:
        """The policy in words, as ``plan`` prints it."""
        return (
            f"up to {self.max} in {self.window_s:g} s, back-off {self.backoff_s:g}-"
            f"{self.backoff_max_s:g} s"
        )


def _restart_tag(value: Any) -> str | None:
    if value == "never":
        return "~never"
    if isinstance(value, dict | RestartConfig):
        return "~policy"
    return None


Restart = Annotated[
    Annotated[Literal["never"], Tag("~never")] | Annotated[RestartConfig, Tag("~policy")],
    Discriminator(
        _restart_tag,
        custom_error_type="restart_policy",
        custom_error_message="restart is 'never' or a mapping such as {max: 5, window_s: 600}",
    ),
]
"""A stage's ``restart``: ``never`` (a dead stage stays down, as before restarts existed), or
its policy (:class:`RestartConfig`)."""


class StageConfig(Strict):
    """Fields every stage has in a pipeline config. Each kind subclasses this with
    its own fields (its ``config_model``), so a third-party kind is validated as
    strictly as a built-in one."""

    name: str = Field(
        description=f"Unique stage name: a letter, then letters, digits, '_' or '-', at most {MAX_STAGE_NAME} characters."
    )
    kind: str = Field(description="Registered stage kind, e.g. ar_decode or exported_graph.")
    stage_id: int | None = Field(
        None, ge=0, description="Optional numeric id (vLLM-Omni's stage_id)."
    )
    inputs: list[str] = Field(
        default_factory=lambda: [REQUEST],
        description="Where this stage's input comes from: 'request', other stage names (every item they "
        "yield), or 'stage.port' (only the items on that output port, e.g. thinker.hidden_states).",
    )
    devices: list[str] = Field(
        min_length=1,
        description="Allowed devices in preference order (cpu, gpu:0, igpu:0, npu:0).",
    )
    backends: list[str] | None = Field(
        None,
        description="Backends to try on each device, in preference order (e.g. [ort-openvino, ort-cpu]); default: the device's own order.",
    )
    final_output: bool = Field(
        False, description="Whether this stage's output is returned to the caller."
    )
    join: Join | None = Field(
        None,
        description="With several inputs: zip (the i-th item of each), all (each input's whole output, once all "
        "ended) or latest (each input's newest item); the stage gets one dict keyed by source per joined item. "
        "Required when inputs has more than one entry, and only for a kind that takes a join.",
    )
    final_output_type: PayloadKind | None = Field(
        None,
        description="What the final output is (text, token_ids, audio, tensor, event), when final_output is true.",
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        le=MAX_CPU_THREADS,
        description="Threads of this stage's engine when it is placed on the CPU (vLLM's OpenMP threads, llama.cpp's "
        "n_threads, torch's, ONNX Runtime's intra-op threads); default: the planner's share of the host's cores "
        "(docs/runtime.md, 'CPU threads'). Ignored on other devices.",
    )
    replicas: int = Field(
        1,
        ge=1,
        le=MAX_REPLICAS,
        strict=True,
        description="Instances of this stage, each placed and reserved on its own (a device of devices, a "
        "different one first); requests are balanced to the least-loaded one.",
    )

    restart: Restart = Field(
        default_factory=RestartConfig,
        description="When the stage's device actor (or route worker) dies: 'never' (it stays down), or "
        "{max, window_s, backoff_s, backoff_max_s}: restarted on its placement after a back-off, at most "
        "max times within window_s seconds, then a crash loop (default: 5 in 600 s, back-off 1-30 s).",
    )
    on_device_loss: Literal["fail", "fallback"] = Field(
        "fail",
        description="When the stage's device is gone for good (its node left the cluster, the device is "
        "no longer found, or its restarts reached the crash-loop limit): fail (the stage stays down) or "
        "fallback (the stage alone is planned again onto the next device of its devices list, through the "
        "ledger and the gates, and said: a log line, /health's moved, /v1/plan, a metric).",
    )

    @field_validator("restart", mode="before")
    @classmethod
    def _restart(cls, value: Any) -> Any:
        if value == "never" or isinstance(value, dict | RestartConfig):
            return value
        raise refusal(
            f"{shown(value) if isinstance(value, str) else repr(value)[:40]} is no restart "
            "policy: restart is 'never' or a mapping",
            "write restart: never, or restart: {max: 5, window_s: 600}",
        )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not STAGE_NAME_PATTERN.fullmatch(value) or len(value) > MAX_STAGE_NAME:
            raise refusal(
                f"{shown(value)} is not a usable stage name",
                f"use a letter, then letters, digits, '_' or '-', at most {MAX_STAGE_NAME} characters",
            )
        return value

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[str]) -> list[str]:
        unique(value, "device")
        return value

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            unique(value, "backend")
        return value

    @model_validator(mode="after")
    def _fallback_has_somewhere_to_go(self) -> StageConfig:
        if self.on_device_loss == "fallback" and len(self.devices) < 2:
            raise refusal(
                f"on_device_loss: fallback needs a next device to fall back to, and devices lists "
                f"only {self.devices[0]}",
                "list another device after it (devices: [gpu:0, cpu]), or use on_device_loss: fail",
            )
        return self

    def restart_policy(self) -> RestartConfig | None:
        """The stage's restart policy; None for ``restart: never``."""
        return None if self.restart == "never" else self.restart


@dataclass(frozen=True)
class Need:
    """One thing a stage needs on this machine before it runs (its model or artifact), as
    ``omni-edge pipelines`` lists it: what, how large, whether it is here, and a note (why it
    is not, or what cannot be known)."""

    what: str
    bytes: int | None
    """Its size (None: not known here)."""
    present: bool | None
    """Whether it is on this machine (None: not known here)."""
    note: str = ""

    def to_dict(self) -> JsonObject:
        return {"what": self.what, "bytes": self.bytes, "present": self.present, "note": self.note}


@dataclass(frozen=True)
class ArtifactInfo:
    """What a stage's artifact says about itself, read without loading it."""

    kind: str
    """'checkpoint', 'gguf' or 'exported'."""
    path: str
    weight_bytes: int
    weight_format: str
    """bf16, fp16, fp32, int8, fp8, awq-4bit, gptq-4bit, gguf, ... (see stages.ar_decode.checkpoint)."""
    details: JsonObject = field(default_factory=dict)
    """Kind-specific facts published in the plan's artifact summary (precisions,
    digests, the checkpoint manifest ...): part of the plan document."""
    internal: dict[str, Any] = field(default_factory=dict)
    """Kind-specific facts the kind keeps for its own later hooks and does not
    publish in the plan (e.g. ar_decode's whole text config, as its config.json has it):
    only the kind that put them there reads them."""


@dataclass(frozen=True)
class Limits:
    """Request limits a stage is planned for; a kind reads the fields it has."""

    max_model_len: int | None = None
    max_num_seqs: int = 1


@dataclass(frozen=True)
class GateSpec:
    """What the gates must measure before a placement is trusted: one ONNX Runtime
    session's EP node coverage and its outputs against a reference.

    Plain data, built by :meth:`StageKind.gate_spec`. ``orchestrator.verify``
    measures it in the placement's route (``omni-edge verify``) or, while
    planning, looks up the evidence recorded for it and judges that against
    ``min_coverage`` and ``tolerance``. The evidence key is made of the fields
    below that change what a gate measures, plus the route's onnxruntime build
    and the gates' own version, which verify adds.
    """

    stage: str
    artifact: str
    """The artifact directory (absolute), for the reference data the gate runs."""
    artifact_name: str
    artifact_precisions: tuple[str, ...]
    """Every precision the artifact has a graph for (remedies name only these)."""
    precision: str
    backend: str
    device_id: str
    device_name: str
    session: SessionSpec
    """The target session."""
    graph_sha256: str
    reference_sha256: str
    reference_graph: str | None
    """The fp32 graph the CPU reference runs, or None when the artifact has none."""
    options: JsonObject
    """The provider and session options that change what the gate measures (the evidence
    key's ``options``, written in each evidence record)."""
    min_coverage: float
    """Fraction of the graph's nodes the target EP must take."""
    tolerance: dict[str, float]
    """``rel_l2``, ``max_abs`` and ``cosine_min`` the outputs must meet."""

    @property
    def ep(self) -> str:
        return str(self.session.providers[0])


@dataclass(frozen=True)
class TurnDetection:
    """How a kind that cuts a spoken stream into turns (a VAD) ends a turn by default: the
    speech probability that counts as speech, the audio kept before speech, and the silence
    that closes a turn. A realtime session's ``turn_detection`` starts from it."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int


class SpeechTranscriber(Protocol):
    """A transcriber of a realtime session's speech while it is spoken, run in the server
    (``StageKind.transcriber``): blocking calls, one at a time, after ``load``."""

    def load(self) -> None: ...

    def decode_tokens(
        self,
        item: AudioItem,
        prefix: Sequence[int] = (),
        cancel: threading.Event | None = None,
    ) -> list[int]:
        """The tokens of the speech in ``item``, the first ones ``prefix`` (forced)."""
        ...

    def word_starts(self, tokens: Sequence[int]) -> frozenset[int]:
        """The indices in ``tokens`` that begin a word."""
        ...

    def text(self, tokens: Sequence[int]) -> str: ...

    def close(self) -> None: ...


class TurnScorer(Protocol):
    """How complete a spoken utterance is (``StageKind.turn_scorer``): blocking calls,
    serialised, after ``load``."""

    def load(self) -> None: ...

    def complete(self, transcript: str) -> float:
        """The probability that the user's message is over where ``transcript`` ends."""
        ...

    def close(self) -> None: ...


class StageHealth(TypedDict):
    """Why a stage can no longer serve though its actor lives (an engine that stopped): a
    code a client reads and the message."""

    code: str
    message: str


class StageKind(ABC):
    """A registered kind of stage. Subclasses set ``kind`` and ``config_model``."""

    kind: ClassVar[str]
    config_model: ClassVar[type[StageConfig]]
    backends: ClassVar[tuple[str, ...]]
    """Backends (from the profile vocabulary) that can run this kind, best first."""
    needs_gates: ClassVar[bool] = False
    """True when a placement of this kind is trusted only after the coverage and
    numeric gates (``gate_spec`` then describes them); ``omni-edge verify`` looks
    at these kinds' stages only."""
    consumes: ClassVar[tuple[str, ...]] = PAYLOAD_KINDS
    """Payload types this kind takes as input, spelled as ``stages.payloads`` parses
    them (``text``, ``audio@16000``, ``tensor<float32>[seq,896]``; default: every
    kind, any details). The config loader refuses an edge whose producer yields
    none of them."""
    produces: ClassVar[tuple[str, ...]] = PAYLOAD_KINDS
    """Payload types this kind yields (same spelling; default: every kind)."""
    runner_imports: ClassVar[tuple[str, ...]] = ("numpy",)
    """Modules this kind's runner imports that other kinds' runners import too. A device
    actor imports them one stage at a time before that stage's load, so two stages
    loading at once in one process never import them concurrently (a first import of
    numpy in two threads at once can fail with Python's ``_DeadlockError``)."""
    takes_join: ClassVar[bool] = False
    """Whether a stage of this kind may have several inputs (fan-in, with a ``join``): it
    then receives joined items, each a ``dict`` keyed by source stage name (or
    ``request``) — ``zip``: ``{a: item, b: item}``; ``all``: ``{a: [items], b: [items]}``;
    ``latest``: the newest item of each input so far (inputs with none yet absent). The
    config loader refuses several inputs on a stage whose kind says false."""
    text_input: ClassVar[Literal["sentences", "whole"]] = "sentences"
    """How text from the stage feeding this one is delivered: ``sentences`` — cut
    where sentences end (``stages.text_chunks``) and fed while the producer is
    still writing, as a voice wants it; ``whole`` — the producer's whole text as
    one item once it is done, as a decoder wants its prompt."""
    cpu_thread_weight: ClassVar[int] = OTHER_WEIGHT
    """This kind's weight when the planner splits a CPU's cores among the stages placed on it
    (``orchestrator.core.cpu_threads``): ``DECODE_WEIGHT`` for a decoder, the stage users wait
    on; ``OTHER_WEIGHT`` for every other kind (the default)."""
    transcribes_speech: ClassVar[bool] = False
    """Whether a stage of this kind can transcribe a realtime session's speech while it is
    spoken (``transcriber``: the speech-to-text kind's). Default: false."""
    scores_turns: ClassVar[bool] = False
    """Whether a stage of this kind may judge a spoken utterance complete (``turn_scorer``: a
    decoder's, when its planned engine offers a scorer). Default: false."""
    takes_conversation: ClassVar[bool] = False
    """Whether a stage of this kind reads the conversation so far as context: a realtime
    session passes its history to such a stage that another stage feeds as one
    ``{"messages": [...]}`` item ahead of its producer's (``Runtime.stream(context=)``), as a
    decoder takes it. Default: false."""

    @classmethod
    def resolve_paths(cls, stage: StageConfig, base_dir: Path) -> StageConfig:
        """Called by the loader: make relative paths absolute against the config file."""
        return stage

    def needs(self, stage: StageConfig, *, online: bool = True) -> list[Need]:
        """What ``stage`` needs before it runs, with its size and whether it is here (``omni-edge
        pipelines``): by default what ``describe`` reads — absent, with the reason, when it
        cannot be read; size unknown when reading it needs a package not installed here.
        ``online``: whether a kind may ask the network (the Hub) about what is not here."""
        try:
            info = self.describe(stage)
        except ConfigError as exc:
            first = exc.problems[0]
            note = f"{first.what} (how to fix: {first.fix})" if first.fix else first.what
            return [Need(first.where, None, False, note)]
        except ModuleNotFoundError as exc:
            note = f"not read here: reading it needs {exc.name}, which is not installed"
            return [Need(stage.name, None, None, note)]
        return [Need(info.path, info.weight_bytes, True)]

    def not_downloaded(self, stage: StageConfig) -> list[str]:
        """The models ``stage`` names by Hugging Face Hub id that the local HF cache does not
        hold (each as its reference), read from the cache alone, without the network: ``run``,
        ``serve`` and ``chat`` refuse to start them (exit 2 naming ``omni-edge pull``), for
        nothing is downloaded as a side effect of a run. Default: none."""
        return []

    def replica_affinity(self, stage: StageConfig) -> Literal["request", "conversation"]:
        """How the runtime keeps ``stage``'s requests on its replicas (``replicas: N`` > 1):
        ``request`` (default), each request to the least-loaded one; ``conversation``, every
        turn of one conversation (``Pipeline.stream(conversation=)``, a realtime session) to
        the replica its first turn went to while that replica lives — a stage that keeps state
        across turns (an Omni talker's KV)."""
        return "request"

    def stage_takes_join(self, stage: StageConfig) -> bool:
        """Whether ``stage`` may have several inputs: the kind's ``takes_join`` (default), or
        narrower per stage (ar_decode: only an Omni talker takes its thinker's two ports)."""
        return self.takes_join

    def stage_backends(self, stage: StageConfig) -> tuple[str, ...]:
        """The backends the planner may try for ``stage`` (those a device offers, in the stage's
        or the device's order): the kind's ``backends`` (default), or narrower per stage
        (ar_decode: vLLM's alone for a plain decoder whose config names no backend)."""
        return self.backends

    def default_join(self, stage: StageConfig) -> Join | None:
        """The join a stage with several inputs gets when its config names none, or None
        (the default: the config must say). The config loader applies it."""
        return None

    def ports(self, stage: StageConfig) -> Ports:
        """What ``stage`` consumes and produces: the kind's ``consumes``/``produces``
        (default), or narrower per stage (an exported graph's manifest may say
        ``audio@22050``). Called by the config loader, so it reads at most small
        metadata files and raises ``PayloadSpecError`` for a bad spelling; when that
        metadata cannot be read it answers the kind's own declaration (``describe``
        reports the unreadable artifact).

        Each produced type is an output port (``stages.payloads.port_name``: its role,
        else its kind) a consumer may name as ``stage.port``. A runner of a stage whose
        consumers may subscribe to different ports yields each item tagged with its
        port (``stages.payloads.on_port``); an untagged item is on the stage's only
        port, or, when it is a ``str``, on its ``text`` port."""
        return Ports(parse_payloads(self.consumes), parse_payloads(self.produces))

    @abstractmethod
    def describe(self, stage: StageConfig) -> ArtifactInfo:
        """Read the stage's artifact metadata. Called once per plan."""

    @abstractmethod
    def check(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        """Refusals that rule ``device`` out for this stage whatever the memory."""

    @abstractmethod
    def reservations(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str, pool: str
    ) -> list[Reservation]:
        """Every byte this stage will hold on ``pool`` while it runs on ``device``."""

    def engine_kwargs(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        """Backend settings derived from the plan (vLLM engine args, ORT options): the stage's
        ``engine_kwargs`` in the plan document, which only the backend's runner reads."""
        return {}

    def gate_spec(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> GateSpec | None:
        """What the gates must measure for this placement (plain data), or None when
        it needs none. Called while planning and by ``omni-edge verify``, only for a
        candidate ``check`` accepted; reads nothing but ``info`` and the stage.
        Kinds with ``needs_gates`` false return None (the default)."""
        return None

    def gate_specs(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[GateSpec]:
        """Every session's gates for this placement, for kinds that run several graphs
        (asr: an encoder and a decoder); the planner trusts the placement only when
        all pass. Default: ``gate_spec``'s one, or none."""
        spec = self.gate_spec(stage, info, device, backend)
        return [] if spec is None else [spec]

    def plan_details(self, stage: StageConfig, info: ArtifactInfo) -> JsonObject:
        """Kind-specific fields of the stage's plan (``StagePlan.details``), written at
        the stage's top level in the plan JSON, e.g. ar_decode's ``kv_cache``. Called
        once per stage after ``describe``, whether the stage is admitted or not; the
        names must not be the plan's own (``orchestrator.core.plan.STAGE_FIELDS``)."""
        return {}

    def remedy_for_budget(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> str:
        """The remedy text when this stage alone does not fit ``available`` bytes."""
        return "use a smaller or more compressed artifact, or a device with a larger memory pool"

    def prepare(self, stage_plan: StagePlan, progress: Progress | None = None) -> Path | None:
        """Make the admitted placement's weights loadable, in the caller's process,
        before any actor starts (so a first run shows its progress there). Called
        once per admitted stage by ``Pipeline.start``; may take minutes the first
        time and must be quick once done. Changes nothing in the plan; returns what
        it prepared (a path), or None when there was nothing to do (the default)."""
        return None

    def actor_env(self, stage_plan: StagePlan) -> dict[str, str]:
        """Environment variables the device actor hosting this stage needs before
        anything is imported in it (thread counts, a backend's process model).
        Called in the caller's process before the actor is created; the runtime
        merges the answers of every stage placed on the device, and two stages
        that want different values for one variable are a configuration error.
        Default: none."""
        return {}

    def cpu_thread_pool(self, stage_plan: StagePlan) -> str | None:
        """The name of a process-wide CPU thread pool this stage's engine shares with every
        other stage in the same device actor whose kind names the same pool (torch's intra-op
        pool: its thread count is one per process), or None when the engine's threads are its
        own (ONNX Runtime's per session, llama.cpp's per context). The planner gives stages
        that share a pool one thread budget. Default: None."""
        return None

    def turn_detection(self, stage_plan: StagePlan) -> TurnDetection | None:
        """For a kind that cuts a spoken stream into turns (a VAD): the turn detection its
        admitted placement plans — a realtime session's default, the end-of-turn delay the
        CLI shows. None for every other kind (the default) and for a stage not admitted."""
        return None

    def semantic_eagerness(self, stage: StageConfig) -> str | None:
        """For a kind that cuts a spoken stream into turns: the eagerness when its config ends
        turns semantically (``turn_detection: {type: semantic_vad}``); None when a fixed
        silence ends them, and for every other kind (the default)."""
        return None

    def transcriber(self, stage_plan: StagePlan, stage: StageConfig) -> SpeechTranscriber | None:
        """For a kind that ``transcribes_speech``: a transcriber of the placement's own model
        for a realtime session's speech, run in the server (not loaded yet). Default: None."""
        return None

    def turn_scorer(self, stage_plan: StagePlan, stage: StageConfig) -> TurnScorer | None:
        """For a kind that ``scores_turns``: a scorer of a spoken utterance's end from the
        placement's own model, run in the server (not loaded yet); None when its engine has
        none. Default: None."""
        return None

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        """Create the runtime object for an admitted placement (inside a device actor).

        ``route`` is the profile's route for the placement (which interpreter or
        host process drives the device); kinds that run in this process ignore it.
        """
        raise NotImplementedError(f"stage kind {self.kind!r} has no runtime yet")

    def validate_request(  # noqa: B027 - optional hook
        self, stage_plan: StagePlan, stage: StageConfig, request: Request
    ) -> None:
        """Check a request a stage of this kind takes (its inputs name ``request``, or the
        request enters at it), in the caller's process before anything reaches an actor:
        ``BadRequest`` (where, what, how to fix) for one it cannot take. Called per request,
        off the event loop. The runtime checks first that the request's payload is one the
        stage consumes, but leaves text and audio to the kind's words, and a value of no
        payload's shape (``OtherRequest``) to the kind. Default: nothing more."""

    def warm_request_check(self, stage_plan: StagePlan) -> None:  # noqa: B027 - optional hook
        """Load what ``validate_request`` needs (a tokenizer: seconds, once per process) while
        the pipeline starts, so the first request does not wait for it; a failure here only
        means the first request loads it. Default: nothing to load."""


class StageRunner(ABC):
    """A stage placed on a device, at run time.

    ``load()`` is called once, after the ledger admitted the stage's
    reservations; ``stream()`` once per request, possibly concurrently;
    ``close()`` once. ``measured_peak_bytes()`` reports what the load and the
    requests really used (evidence M), or None when it cannot be isolated.

    What the device actor reads besides, each with a default here: ``load_info``
    (what the load found, for the run record), ``process_ids()`` (the processes
    the stage's work runs in), ``worker_stats()``, ``worker_restarts()``, ``request_stats()``
    and ``health()``.
    """

    load_info: Mapping[str, object] = MappingProxyType({})
    """What the load found (the EP's node assignment, thread counts, a warm-up's time): set by
    ``load()``; the device actor keeps it, reduced to small values, in the run record."""

    @abstractmethod
    def load(self) -> None: ...

    @abstractmethod
    def stream(self, request_id: str, inputs: AsyncIterator[Item]) -> AsyncIterator[Item]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the stage's resources."""

    def measured_peak_bytes(self) -> int | None:
        return None

    def process_ids(self) -> list[int] | None:
        """The processes the stage's work runs in (a route worker and its children, the current
        one after a recycle), ``[]`` for this process only; None (the default) when the runner
        does not know: the device actor then measures the processes the load started."""
        return None

    def request_stats(self, request_id: str) -> dict[str, object]:
        """The runner's own figures of a finished request (merged into its stats; a ``stamps``
        entry is taken out for the runtime's first-audio trace). Asked once per request."""
        return {}

    def health(self) -> StageHealth | None:
        """Why the stage can no longer serve though its actor lives (an engine that stopped);
        None (the default) while it can."""
        return None

    def worker_restarts(self) -> int:
        """How many times the stage's route worker was replaced after it died (a process the
        stage's work runs in, restarted by the runner itself: ``ort_runner.OrtRunner``); 0 for
        a runner with none. The runtime counts them as the stage's restarts."""
        return 0

    def worker_stats(self) -> dict[str, int] | None:
        """For a stage whose processes the runtime recycles at a memory limit (a route worker):
        ``recycle_limit_bytes``, ``call_rise_bytes`` (the largest rise one call caused),
        ``worker_recycles``, ``worker_calls``, ``retained_bytes`` (what the calls left behind),
        ``fresh_bytes`` (a fresh worker's RSS). None otherwise. Calibration budgets such a
        stage from these, not from its peak, which the limit shaped (docs/calibration.md)."""
        return None
