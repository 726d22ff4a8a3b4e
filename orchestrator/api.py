"""The Python API: plan a pipeline, start it, stream requests through it.

::

    from orchestrator.api import Pipeline

    with Pipeline.from_config("configs/voice-assistant.yaml") as pipeline:
        result = pipeline.run("Tell me one fact about the Moon.")
        print(result.text, result.audio_seconds)

    async def main() -> None:
        async with Pipeline.open("configs/voice-assistant.yaml") as pipeline:
            async for event in pipeline.stream("..."):   # TextDelta, AudioChunk, StageEvent
                ...

    asyncio.run(main())

Guarantees:

* ``open`` is ``from_config`` for async code: planning, weight preparation
  and the start (tens of seconds: Ray, a vLLM engine) run in a worker thread,
  so the event loop keeps running meanwhile. Await it for the started
  pipeline, or use it with ``async with`` (closed on the way out). A
  cancelled ``open`` closes whatever the thread had started once it finishes.
* ``from_config`` plans first (``admit_plan``: the plan, verified and planned
  again where exported placements lack gate evidence) and raises ``PlanRefused``
  — carrying the plan and its refusals — before Ray or any engine starts when
  the plan is not admitted. ``admit_plan`` is the one way to an admitted plan:
  the CLI's ``run``, ``chat`` and ``serve`` take it too, telling its steps to an
  ``AdmitProgress``.
* ``from_config`` and ``open`` take a ``PipelineOptions`` (profile, mask,
  address, record, progress, verify, calibration, ...) or its fields as keyword
  arguments.
* Weights a stage needs in another form are prepared in this process before
  the actors start, with a progress bar when asked: each admitted stage's
  kind ``prepare``-s its placement (the decode stage's GGUF is converted once
  to a cached safetensors checkpoint).
* A stage that cannot load, or a device actor that dies, raises
  ``StageFailed`` (stage, device, cause); the ledger keeps no reservation of a
  failed or dead stage.
* A request a stage cannot take (not text, blank, sampling out of range,
  longer than the context by the stage's own tokenizer) raises ``BadRequest``
  (a ``ConfigError``) before it reaches any actor.
* A request beyond what the pipeline can run and queue raises ``PipelineBusy``
  (the in-flight limit, the numbers in flight and waiting) at once.
* ``close()`` (or leaving the ``with`` block) closes every stage and releases
  every reservation; ``final_ledger`` then shows every pool at zero.
* Plans read the measurement store (``orchestrator.calibration``): a stage
  measured on this machine before is budgeted from its measured peaks
  (``calibration=False`` plans from metadata alone). ``close()`` records each
  stage's measured peaks, and the Ray runtime's, for the next plan
  (``record_calibration``; a server calls it periodically too).
* ``run()`` writes a run record (``omni-edge.run/1``) per call to ``record``
  (a directory, default ``runs/``, or a ``.json`` path); ``record=None`` turns
  it off.
* A request is text, ``{"messages": [...], "sampling": {...}}``, or — for a
  pipeline whose entry stage takes audio (``audio_entry_stages``: a ``vad`` or
  ``asr`` stage) — one audio item ``{"audio": float32 mono, "sample_rate": int}``;
  or any of these as its typed record (``TextRequest``, ``ChatRequest``,
  ``AudioRequest``, ``TensorRequest``, ``TokenIdsRequest``: ``stages.requests``),
  which is what the runtime takes: what is passed is converted once, here
  (``as_request``). ``audio_request`` makes an audio item from a WAV file or its bytes::

      with Pipeline.from_config("configs/examples/voice-chat.yaml") as pipeline:
          result = pipeline.run(audio_request("question.wav"))

  For a pipeline whose entry stage consumes a tensor (an exported graph:
  ``tensor_entry_stages``) a request is a numpy array (a graph of one input) or
  a mapping of the graph's input names to arrays; ``tensor_request`` reads one
  from a ``.npy`` file (never unpickling). Its dtype and shape are checked
  against the graph's inputs (``validate``) before anything runs; the graph's
  outputs are in ``result.outputs[stage]``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator import calibration as cal
from orchestrator.calibration_record import RunMeasurements, ServerMemory, record_run
from orchestrator.config import PipelineConfig, load_config
from orchestrator.core import memory
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError, PlanRefused
from orchestrator.ort.routes import require_startable_routes
from orchestrator.pipelines import require_downloaded
from orchestrator.planner import (
    describes_this_machine,
    parse_mask,
    plan_pipeline,
    verification_refusals,
)
from orchestrator.probe import ask_build_routes, resolve_profile
from orchestrator.runtime import record as rec
from orchestrator.runtime.cluster import check_address, quiet_ray_off_main_thread
from orchestrator.runtime.cluster_probe import gather_at, nodes_found
from orchestrator.runtime.events import Event, Result, collect
from orchestrator.runtime.fallback import replanner
from orchestrator.runtime.ledger_actor import ActorSnapshot
from orchestrator.runtime.requests import (
    MAX_AUDIO_SECONDS,
    MAX_TENSOR_BYTES,
    audio_entry_stages,
    audio_request,
    prompt_label,
    tensor_entry_stages,
    tensor_request,
)
from orchestrator.runtime.runtime import Runtime
from orchestrator.runtime.startup import ProgressCallback
from orchestrator.verify.run import verify_pipeline
from stages.base import Progress
from stages.payloads import Item
from stages.registry import get_kind
from stages.requests import (
    AudioRequest,
    ChatRequest,
    Request,
    RequestLike,
    TensorRequest,
    TextRequest,
    TokenIdsRequest,
    as_request,
)

if TYPE_CHECKING:
    from orchestrator.core.plan import PipelinePlan
    from orchestrator.core.profile import HardwareProfile

__all__ = [
    "MAX_AUDIO_SECONDS",
    "MAX_TENSOR_BYTES",
    "Admission",
    "AdmitProgress",
    "AudioRequest",
    "ChatRequest",
    "Pipeline",
    "PipelineOptions",
    "Request",
    "RequestLike",
    "StartProgress",
    "TensorRequest",
    "TextRequest",
    "TokenIdsRequest",
    "admit_plan",
    "as_request",
    "audio_entry_stages",
    "audio_request",
    "prompt_label",
    "tensor_entry_stages",
    "tensor_request",
]
"""The Python API; the request readers are ``runtime.requests``'s and the request records
``stages.requests``'s, named here for users."""

log = logging.getLogger(__name__)

_DEFAULT_RECORD = Path("runs")


def plan_profile(
    profile: str | Path | HardwareProfile | None,
    address: str | None,
    progress: AdmitProgress | None = None,
) -> HardwareProfile:
    """What to plan on: ``profile`` (a file or a profile) when given; else, with an
    ``address``, the cluster there gathered live (the probe on each node,
    ``cluster_probe.gather_at``; the nodes it found are told to ``progress``, by default
    logged); else this machine."""
    if profile is None and address:
        progress = progress or AdmitProgress()
        progress.probing_cluster(address)
        prof = gather_at(address)
        progress.probed_cluster(address, prof)
        return prof
    return resolve_profile(profile)


def unverified_stages(plan: PipelinePlan) -> list[str]:
    """Admitted stages whose placement has no gate evidence yet."""
    return [
        s.name
        for s in plan.stages
        if s.admitted and s.verification is not None and s.verification.status == "unverified"
    ]


def verify_then_replan(
    config: PipelineConfig,
    profile: HardwareProfile,
    mask: frozenset[str],
    run_gates: Any = None,
    calibration: cal.CalibrationStore | None = None,
    server: bool = False,
) -> PipelinePlan:
    """Run the coverage and numeric gates the plan needs (writing evidence), then
    plan again. A placement is never run on the strength of "the EP is listed":
    a gate that refuses it makes the planner take the stage's next candidate, or
    refuse. ``run_gates(config, profile, mask)`` replaces the silent default
    (the CLI passes one with a progress bar)."""
    if run_gates is None:
        report = verify_pipeline(config, profile, mask=mask)
    else:
        report = run_gates(config, profile, mask)
    # what the gates refused is refused in the new plan, evidence file or not
    results = getattr(report, "results", None) or []
    return plan_pipeline(
        config,
        profile,
        mask=mask,
        refused=verification_refusals(results),
        calibration=calibration,
        server=server,
    )


@dataclass(frozen=True)
class PipelineOptions:
    """How ``Pipeline.from_config`` and ``Pipeline.open`` plan and start a pipeline (each
    field is also a keyword argument of both, which overrides the options given).

    ``profile``: a profile file, a profile, or None — the cluster at ``address`` or this
    machine, probed (``plan_profile``). ``mask``: devices or kinds to exclude (each must
    name one of the profile's). ``record``: where ``run()`` writes its records (None: none).
    ``progress``: told each step of the start (``StartProgress``; the CLI's draws the
    weights' progress bars and each stage's state on stderr; None: nothing is told).
    ``log_to_driver``: the actors' logs on stderr. ``verify``: run the gates for exported
    placements without evidence, then plan again (False: run them unverified).
    ``max_waiting``: requests that may wait for a slot beyond those in flight (None: as many
    as may be in flight; 0 refuses at once). ``calibration``: read (and after the run,
    write) the measurement store (True), a store of your own, or False for metadata alone.
    ``server``: plan the serving process's own memory too (``omni-edge serve``)."""

    profile: str | Path | HardwareProfile | None = None
    mask: tuple[str, ...] = ()
    address: str | None = None
    record: str | Path | None = _DEFAULT_RECORD
    progress: StartProgress | None = None
    log_to_driver: bool = False
    verify: bool = True
    max_waiting: int | None = None
    calibration: bool | cal.CalibrationStore | None = True
    server: bool = False

    def __post_init__(self) -> None:
        # any iterable of strings is taken; kept as a tuple, so the options stay frozen
        object.__setattr__(self, "mask", tuple(self.mask))

    @classmethod
    def of(cls, options: PipelineOptions | None, overrides: Mapping[str, Any]) -> PipelineOptions:
        """``options`` (default: the defaults) with the keyword arguments given beside them;
        ``TypeError`` naming one that is no option, as a misspelt keyword always was."""
        base = options if options is not None else cls()
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        return replace(base, **overrides) if overrides else base


class StartProgress(Protocol):
    """What a pipeline tells while it starts (``Pipeline.start``, ``PipelineOptions.progress``).
    Without one nothing is told, so a library user's pipeline draws nothing; the CLI's
    (``commands.progress.TerminalProgress``) draws the weights' progress bars and a live line
    per stage on stderr."""

    def weights(self) -> Progress | None:
        """Told the steps of preparing the weights (``StageKind.prepare``), or None."""

    def starting(self, pipeline: str, stages: list[tuple[str, str]]) -> ProgressCallback | None:
        """The runtime's start is about to begin for ``stages`` (ledger holder, device): the
        callback told each stage's state (``startup.StageProgress``), or None."""

    def close(self) -> None:
        """The start is over (started or failed): stop drawing."""


class AdmitProgress:
    """What ``admit_plan`` says while it works: each hook is called at its step. This base
    says what the API always said — a log line for a cluster it probed, nothing else — and
    runs the gates silently; the CLI's (``commands.common.ConsoleAdmitProgress``) says it on
    the console, with a progress bar for the gates."""

    def probing_cluster(self, address: str) -> None:
        """No profile was given: the cluster at ``address`` is about to be probed, node by node."""

    def probed_cluster(self, address: str, profile: HardwareProfile) -> None:
        log.info("planning on the Ray cluster at %s: %s", address, nodes_found(profile))

    def verifying(self, stages: list[str]) -> None:
        """The gates are about to run for these stages' exported placements."""

    def unverified(self, stages: list[str]) -> None:
        """These stages run without gate evidence (``verify=False``)."""

    def run_gates(
        self, config: PipelineConfig, profile: HardwareProfile, mask: frozenset[str]
    ) -> Any:
        """The gates' report (``verify_pipeline``'s), for ``verify_then_replan``."""
        return verify_pipeline(config, profile, mask=mask)


@dataclass(frozen=True)
class Admission:
    """What ``admit_plan`` decided: the plan (admitted or refused, with its refusals), the
    config and profile it was made for, and the measurement store it read."""

    plan: PipelinePlan
    config: PipelineConfig
    profile: HardwareProfile
    calibration: cal.CalibrationStore | None
    mask: frozenset[str] = frozenset()
    """The devices the user masked: a stage that falls back (``on_device_loss``) never lands there."""

    @property
    def admitted(self) -> bool:
        return self.plan.admitted


def admit_plan(
    config: str | Path | PipelineConfig,
    options: PipelineOptions | None = None,
    progress: AdmitProgress | None = None,
) -> Admission:
    """The one way to a plan that may run (``run``, ``chat``, ``serve``, ``from_config``):
    the config read (a path) and checked, the profile resolved (``options.profile``, else
    the cluster at ``options.address`` probed, else this machine), the mask checked against
    it, the plan made; then, when exported placements lack gate evidence and
    ``options.verify``, the gates run and the plan is made again with what they measured
    (``verify_then_replan``). A model named by Hub id that the HF cache lacks is a
    ``ConfigError`` naming ``omni-edge pull`` before anything else (``require_downloaded``). Returns the plan whether admitted or refused: the caller
    says the refusal its own way (``from_config`` raises ``PlanRefused``). ``progress``
    hears each step (default: silent, a log line for a probed cluster)."""
    options = options or PipelineOptions()
    progress = progress or AdmitProgress()
    config = config if isinstance(config, PipelineConfig) else load_config(config)
    require_downloaded(config, config.given_as)  # a run never downloads: exit 2 naming pull
    if options.address:  # nothing listening there is bad input, said before the gates run
        check_address(options.address)
    profile = plan_profile(options.profile, options.address, progress)
    # running starts the routes' interpreters: a profile's may be started only when the user
    # set them up (exit 2 otherwise), and their llama.cpp builds are asked before planning
    named = options.profile if isinstance(options.profile, str | Path) else None
    require_startable_routes(profile, None if named is None else str(named))
    if describes_this_machine(profile):
        ask_build_routes(profile)
    mask = parse_mask(options.mask, profile)
    store = calibration_store(options.calibration)
    plan = plan_pipeline(config, profile, mask=mask, calibration=store, server=options.server)
    pending = unverified_stages(plan)
    if pending and not options.verify:
        progress.unverified(pending)
    elif pending:
        progress.verifying(pending)
        plan = verify_then_replan(
            config,
            profile,
            mask,
            run_gates=progress.run_gates,
            calibration=store,
            server=options.server,
        )
    return Admission(plan, config, profile, store, mask)


class Pipeline:
    """A planned and started pipeline (see the module docstring)."""

    def __init__(
        self,
        plan: PipelinePlan,
        config: PipelineConfig,
        *,
        profile: HardwareProfile | None = None,
        address: str | None = None,
        record: str | Path | None = _DEFAULT_RECORD,
        log_to_driver: bool = False,
        max_waiting: int | None = None,
        calibration: cal.CalibrationStore | None = None,
        mask: frozenset[str] = frozenset(),
        server: bool = False,
    ) -> None:
        if not plan.admitted:
            raise PlanRefused(plan)
        self.calibration = calibration
        """Where ``record_calibration`` writes measured peaks (None: nothing is recorded)."""
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        self.config = config
        self.profile = profile
        self.record = record
        routes = {r.name: r for r in profile.routes} if profile is not None else {}
        self.runtime: Runtime = Runtime(
            plan,
            config,
            routes=routes,
            address=address,
            log_to_driver=log_to_driver,
            max_waiting=max_waiting,
            # a stage whose device is gone for good is planned again on this profile
            # (on_device_loss: fallback), as this plan was
            replan=replanner(config, profile, mask, calibration, server) if profile else None,
        )
        self.results: list[Result] = []
        self.records: list[Path] = []
        self.prepare_s = 0.0
        self._prepared = False

    # -- construction ----------------------------------------------------------------
    @classmethod
    def from_config(
        cls,
        path: str | Path,
        options: PipelineOptions | None = None,
        *,
        start: bool = True,
        admitting: AdmitProgress | None = None,
        **overrides: Any,
    ) -> Pipeline:
        """Load ``path``, plan it, verify the exported placements that have no evidence
        yet (unless ``verify=False``) and re-plan with the evidence (``admit_plan``), and
        start it (unless ``start=False``). ``options`` (``PipelineOptions``) says how; any
        of its fields may be given as a keyword argument instead, or beside it to override
        it (``from_config(path, profile=..., record=None)``). ``admitting`` hears the
        admission's steps (``AdmitProgress``). Raises ``ConfigError`` for bad input,
        ``PlanRefused`` when the plan is refused, ``StageFailed`` when a stage cannot
        start."""
        opts = PipelineOptions.of(options, overrides)
        if opts.record is not None:
            rec.check_target(opts.record, what="record")  # before any work, not after the run
        admission = admit_plan(path, opts, admitting)
        if not admission.admitted:
            raise PlanRefused(admission.plan)
        pipeline = cls.of_admission(admission, opts)
        if start:
            pipeline.start(progress=opts.progress)
        return pipeline

    @classmethod
    def of_admission(cls, admission: Admission, options: PipelineOptions) -> Pipeline:
        """The pipeline of an admitted plan (``admit_plan``), not started yet; ``options``
        give its address, record, logs, waiting room (``PlanRefused`` for a refused plan)."""
        return cls(
            admission.plan,
            admission.config,
            profile=admission.profile,
            address=options.address,
            record=options.record,
            log_to_driver=options.log_to_driver,
            max_waiting=options.max_waiting,
            calibration=admission.calibration,
            mask=admission.mask,
            server=options.server,
        )

    @classmethod
    def open(
        cls,
        path: str | Path,
        options: PipelineOptions | None = None,
        *,
        admitting: AdmitProgress | None = None,
        **overrides: Any,
    ) -> Opening:
        """``from_config`` without blocking the event loop: ``await Pipeline.open(...)``
        for the started pipeline, or ``async with Pipeline.open(...) as pipeline:``
        to have it closed on the way out. Takes and raises what ``from_config`` does."""
        opts = PipelineOptions.of(options, overrides)
        return Opening(lambda: cls.from_config(path, opts, admitting=admitting))

    @property
    def plan(self) -> PipelinePlan:
        """The plan the pipeline runs by: as admitted, with each stage that moved since to its
        next device (``on_device_loss: fallback``) where it runs now."""
        return self.runtime.plan

    def prepare(self, *, progress: StartProgress | None = None) -> Pipeline:
        """Prepare weights (their steps told to ``progress``); once."""
        if not self._prepared:
            t0 = time.perf_counter()
            prepare_models(self.plan, progress=progress.weights() if progress else None)
            self.prepare_s = time.perf_counter() - t0
            self._prepared = True
        return self

    def start(self, *, progress: StartProgress | None = None) -> Pipeline:
        """Prepare weights, then start the runtime. ``progress`` is told both: the weights'
        steps, then each stage's state while it starts (waiting, loading on its device,
        loaded in N s, failed); without one nothing is drawn or printed."""
        self.prepare(progress=progress)
        display = (
            progress.starting(
                self.plan.pipeline,
                [(h, s.device or "?") for h, s in self.runtime.views.items()],  # voice#1: a replica
            )
            if progress is not None
            else None
        )
        warming = threading.Thread(
            target=self._warm_request_checks, name="omni-edge-warm", daemon=True
        )
        warming.start()  # meanwhile: the request checks' tokenizers, so the first request does not wait
        try:
            self.runtime.start(progress=display)
        finally:
            if progress is not None:
                progress.close()
            warming.join()
        return self

    def _warm_request_checks(self) -> None:
        """Load what each stage's request check needs (``StageKind.warm_request_check``); a
        failure here only means the first request loads it."""
        for s in self.runtime.stages:
            try:
                self.runtime.kinds[s.name].warm_request_check(s)
            except Exception as exc:
                log.debug("warming the request check of %s failed: %s", s.name, exc)

    def validate(self, prompt: RequestLike, *, entry: str | None = None) -> None:
        """Check a request without running it: ``BadRequest`` (a ``ConfigError``) for
        a prompt that is not text or blank, sampling out of range, or a prompt that
        cannot fit the decode stage's context (by its own tokenizer, once its
        weights are prepared); with ``entry``, a stage that does not take text.
        ``stream``/``run`` check every request this way."""
        self.runtime.validate_request(as_request(prompt), entry)

    # -- requests --------------------------------------------------------------------
    async def stream(
        self,
        prompt: RequestLike,
        *,
        request_id: str | None = None,
        entry: str | None = None,
        context: Mapping[str, Sequence[Item]] | None = None,
        conversation: str | None = None,
    ) -> AsyncIterator[Event]:
        """Yield the request's events as they happen (``TextDelta``, ``AudioChunk``,
        ``OutputItem``, ``StageEvent``); ``StageFailed`` when a stage fails.
        ``entry``: the request (text) enters the graph at that stage, and only it
        and the stages downstream of it run (e.g. the voice, to speak a text).
        ``prompt`` may be an audio item for a pipeline whose entry stage takes
        audio (``audio_request``). ``context``: items fed to a stage ahead of its
        producers' (``Runtime.stream``), e.g. the conversation so far to the decode stage.
        ``conversation``: the conversation this request is a turn of, so a stage with replicas
        that keeps state across turns serves every turn on one replica (``Runtime.stream``)."""
        events = self.runtime.stream(
            as_request(prompt),
            request_id=request_id,
            entry=entry,
            context=context,
            conversation=conversation,
        )
        try:
            async for event in events:
                yield event
        finally:  # closed now, not when collected: a caller that stops early frees the request's slot at once
            await events.aclose()  # type: ignore[attr-defined]

    async def arun(
        self,
        prompt: RequestLike,
        *,
        request_id: str | None = None,
        entry: str | None = None,
        conversation: str | None = None,
    ) -> Result:
        """One request to completion, inside a running event loop (``entry``, ``conversation``:
        as in ``stream``)."""
        rid = request_id or uuid.uuid4().hex[:12]
        request = as_request(prompt)
        t0 = time.perf_counter()
        events = [
            e
            async for e in self.runtime.stream(
                request, request_id=rid, entry=entry, conversation=conversation
            )
        ]
        result = collect(rid, request.label(), events, time.perf_counter() - t0)
        self.results.append(result)
        return result

    def run(
        self,
        prompt: RequestLike,
        *,
        request_id: str | None = None,
        record: str | Path | bool | None = True,
        entry: str | None = None,
    ) -> Result:
        """One request to completion (blocking; from async code use ``arun``/``stream``;
        ``entry``: as in ``stream``).

        Writes a run record to ``self.record`` unless ``record`` is None/False,
        or to ``record`` when it is a path."""
        target = self.record if record is True else record
        if target not in (None, False):
            rec.check_target(target, what="record")  # type: ignore[arg-type]
        result = asyncio.run(self.arun(prompt, request_id=request_id, entry=entry))
        if target not in (None, False):
            self.write_record([result], target)  # type: ignore[arg-type]
        return result

    # -- reports ---------------------------------------------------------------------
    def build_record(self, results: list[Result] | None = None, **extra: Any) -> JsonObject:
        results = self.results if results is None else results
        measured = self.runtime.measure() if not self.runtime._closed else {}
        ledger = self.runtime.ledger_snapshot()
        extra = {"prepare_s": round(self.prepare_s, 3), **extra}
        return rec.build(self.runtime, results, measured=measured, ledger=ledger, extra=extra)

    def write_record(
        self, results: list[Result] | None = None, target: str | Path | None = None, **extra: Any
    ) -> Path:
        doc = self.build_record(results, **extra)
        rid = results[-1].request_id if results else "run"
        where = target if target is not None else self.record
        try:
            path = rec.write(doc, where, request_id=rid)
        except OSError as exc:
            # checked before the run, unwritable now (a full disk): keep it, and say where
            spare = rec.write(
                doc,
                Path(tempfile.mkdtemp(prefix="omni-edge-kept-")) / f"{rid}.json",
                request_id=rid,
            )
            self.records.append(spare)
            raise ConfigError.single(
                f"record {where}",
                f"could not be written ({exc.strerror or exc}); the record is kept in {spare}",
                "copy it from there",
            ) from None
        self.records.append(path)
        return path

    def ledger_snapshot(self) -> ActorSnapshot:
        return self.runtime.ledger_snapshot()

    @property
    def final_ledger(self) -> ActorSnapshot | None:
        return self.runtime.final_ledger

    # -- calibration -----------------------------------------------------------------
    def record_calibration(self, prompts: Iterable[object] | None = None) -> list[JsonObject]:
        """Write each live stage's measured peaks (and the Ray runtime's, and the serving
        process's) to the measurement store for the next plan (``calibration_record``).
        Returns what was recorded (also in ``runtime.calibration_recorded`` for the run record)."""
        if (
            self.calibration is None
            or self.profile is None
            or self.runtime._closed
            or not self.runtime.load_results
        ):
            return []
        texts = [
            p
            for p in (prompts if prompts is not None else (r.prompt for r in self.results))
            if isinstance(p, str)
        ]
        run = RunMeasurements(
            run_id=self.run_id,
            plan=self.plan,
            profile=self.profile,
            views=self.runtime.views,
            measured=self.runtime.measure(),
            ray_memory=self.runtime.ray_memory,
            owns_ray=bool(getattr(self.runtime.cluster, "owned", True)),
            server=self.server_memory(),
            longest_prompt=max((len(t) for t in texts), default=None),
        )
        out = record_run(self.calibration, run)
        self.runtime.calibration_recorded = out  # type: ignore[attr-defined]
        return out

    def server_memory(self) -> ServerMemory | None:
        """The serving process's own memory against its plan (None when the plan has no
        ``server`` reservation: ``plan``/``run``): PSS (RSS where PSS cannot be read)
        of this process now, and the reservation's bytes and evidence."""
        planned = next((r for r in self.plan.shared_reservations if r.purpose == "server"), None)
        if planned is None:
            return None
        measured, how = memory.tree_memory([os.getpid()])
        return ServerMemory(
            measured_bytes=measured,
            measure=f"{how} of the serve process (pid {os.getpid()})",
            budget_bytes=planned.bytes,
            evidence=planned.evidence,
            pool=planned.pool,
            within_budget=measured <= planned.bytes if measured else None,
        )

    # -- lifecycle -------------------------------------------------------------------
    def close(self) -> ActorSnapshot:
        """Record the measured peaks for the next plan (``record_calibration``), then close
        every stage and release every reservation; returns the final ledger."""
        if self.calibration is not None and not self.runtime._closed:
            try:
                self.record_calibration()
            except Exception as exc:  # a measurement store that cannot be written costs the next plan, not this run
                log.warning(
                    "measured peaks were not recorded in %s: %s", self.calibration.root, exc
                )
        return self.runtime.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)


class Opening:
    """A pipeline being planned and started in a worker thread (``Pipeline.open``).

    Await it once, or enter it once with ``async with``."""

    def __init__(self, start: Callable[[], Pipeline]) -> None:
        self._start = start
        self._lock = threading.Lock()
        self._abandoned = False
        self._started: Pipeline | None = None
        self._entered: Pipeline | None = None

    def __await__(self) -> Generator[Any, None, Pipeline]:
        return self._open().__await__()

    async def __aenter__(self) -> Pipeline:
        self._entered = await self._open()
        return self._entered

    async def __aexit__(self, *exc: object) -> None:
        if self._entered is not None:
            await asyncio.to_thread(self._entered.close)

    async def _open(self) -> Pipeline:
        try:
            return await asyncio.to_thread(self._start_or_discard)
        except asyncio.CancelledError:
            # A start cannot be stopped half-way (a vLLM engine loading); whoever
            # finishes last of the thread and this handler closes the pipeline, so a
            # cancelled open leaves no Ray cluster or engine behind.
            with self._lock:
                self._abandoned = True
                started, self._started = self._started, None
            if started is not None:
                threading.Thread(target=started.close, name="omni-edge-close-abandoned").start()
            raise

    def _start_or_discard(self) -> Pipeline:
        quiet_ray_off_main_thread()
        pipeline = self._start()
        with self._lock:
            if not self._abandoned:
                self._started = pipeline
                return pipeline
        pipeline.close()
        return pipeline


def calibration_store(
    calibration: bool | cal.CalibrationStore | None,
) -> cal.CalibrationStore | None:
    """The measurement store ``calibration`` names: True → the default one, False/None → none."""
    if isinstance(calibration, cal.CalibrationStore):
        return calibration
    return cal.CalibrationStore() if calibration else None


def prepare_models(plan: PipelinePlan, *, progress: Progress | None = None) -> list[Path]:
    """Let each admitted stage's kind prepare its weights (``StageKind.prepare``), its steps
    told to ``progress``: the decode stage's GGUF is converted once into a cached checkpoint.

    Done here, in the caller's process, so a first run's progress is the caller's to show.
    Returns what the kinds prepared.
    """
    out = []
    for s in plan.stages:
        if s.admitted:
            prepared = get_kind(s.kind).prepare(s, progress)
            if prepared is not None:
                out.append(prepared)
    return out
