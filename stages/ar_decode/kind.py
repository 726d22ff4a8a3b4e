"""``ar_decode``: an autoregressive decode stage, run by one of the decode engines (GPU, iGPU or CPU).

Planning reads ``config.json`` and the safetensors headers (or the index JSON, or a GGUF
header) — never the weights — checks the context against the model's positions, and asks
the engine of each candidate backend for the rest (``stages.ar_decode.engines``: one module
per engine — vLLM, llama.cpp, transformers — behind one interface, named by the engine
table ``orchestrator.core.engines``): its refusals, its KV cache's layout, every byte it
holds, its settings. The run asks it too: what the caller's process prepares (a GGUF
converted once for an engine that loads a checkpoint), the device actor's environment and
CPU thread pool, the runner (which imports its engine inside the device actor only), and the
tokenizer a request is counted with before it reaches the actor. Nothing here names an engine.

A plain decoder whose config names no ``backends`` is planned on the engines that take its
artifact (``DecodeEngine.default_for``: a GGUF on llama.cpp then vLLM, a checkpoint directory
on vLLM alone); an Omni sub-model (``model_stage``), or a stage that names its backends, is
offered every engine's, and each refuses what it cannot serve by name (vLLM an Omni sub-model:
``model_stage_unsupported``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.core import errors, hub
from orchestrator.core.cpu_threads import DECODE_WEIGHT
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import RefusalCode
from orchestrator.core.hub import HubRef, parse_hub_ref
from orchestrator.core.ledger import Reservation, holder_peak
from orchestrator.core.packages import is_package_location, resolve_package_location
from orchestrator.core.plan import Refusal
from orchestrator.core.units import fmt_bytes
from stages.ar_decode import engines as engine_registry
from stages.ar_decode.checkpoint import (
    CheckpointManifest,
    read_checkpoint,
    read_gguf,
    read_safetensors_header,
)
from stages.ar_decode.config import MODEL_STAGE_PORTS, ArDecodeConfig, Sampling, is_gguf
from stages.ar_decode.engines.base import DecodeEngine, kv_layout
from stages.ar_decode.hub_model import HubModel, cached_model, hub_model, local_need, wanted_files
from stages.ar_decode.kv import (
    KVBudget,
    decoder_weight_params,
    kv_budget,
    model_context_limit,
    text_config,
    text_config_problems,
)
from stages.ar_decode.prompt import check_request
from stages.ar_decode.tool_grammar import Family, family_of
from stages.base import (
    ArtifactInfo,
    Join,
    Need,
    Progress,
    StageConfig,
    StageKind,
    StageRunner,
    TurnScorer,
)
from stages.payloads import Ports, parse_payloads
from stages.requests import Request

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device, Route

__all__ = ["ArDecodeConfig", "ArDecodeKind", "Sampling"]

TALKER_JOIN: Join = "all"
"""The talker's join when its config names none: ``all`` — once the thinker has ended, one
item ``{"thinker.hidden_states": [...], "thinker.text": [...]}``, as vLLM-Omni's
thinker2talker hands the talker the thinker's whole output. ``zip`` would pair the i-th
hidden state with the i-th text item, and the talker takes text whole (one item at the
thinker's end) while hidden states stream: that zip stalls (the config loader refuses it)."""
WEIGHT_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
STREAMING_TALKERS = ("qwen2_5_omni",)
"""Omni checkpoints whose talker may start on the thinker's first steps (``join: latest``,
vLLM-Omni's async_chunk; ``stages.ar_decode.omni_talker.Qwen25Talker.generate_streaming``)."""


def _index_tensor_names(path: Path) -> list[str] | None:
    try:
        weight_map = json.loads(
            (path / "model.safetensors.index.json").read_text(encoding="utf-8")
        )["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [str(k) for k in weight_map] if isinstance(weight_map, dict) else None


def _sub_model_weights(
    stage: ArDecodeConfig, path: Path, source: str, weight_format: str, tcfg: dict[str, Any]
) -> tuple[int, str] | None:
    """``(bytes, note)`` for a ``model_stage``'s own weights when an index-only checkpoint does
    not list them (a partial index): the sub-model's decoder from its config (evidence E).
    None when the checkpoint's figure stands (no model_stage, headers read, or the index
    lists the sub-model's tensors)."""
    if not stage.model_stage or source != "index" or weight_format not in WEIGHT_DTYPE_BYTES:
        return None
    names = _index_tensor_names(path)
    prefix = f"{stage.model_stage}."
    if names is None or any(n.startswith(prefix) for n in names):
        return None
    params = decoder_weight_params(tcfg)
    return params * WEIGHT_DTYPE_BYTES[weight_format], (
        f"the index lists no {prefix}* tensor: {params:,} parameters of the {stage.model_stage} decoder computed "
        f"from {stage.model_stage}_config (evidence E), {weight_format}"
    )


SUB_MODEL_EXTRA_TENSORS = {"talker": ("thinker.model.embed_tokens.weight",)}
"""Tensors outside a sub-model's own prefix that its runner reads: a talker's text-side inputs go
through the thinker's token embeddings (``stages.ar_decode.omni_talker.load_talker``)."""


def _sub_model_header_bytes(
    model_stage: str, path: Path, files: tuple[str, ...]
) -> tuple[int, str] | None:
    """``(bytes, note)`` of a ``model_stage``'s own tensors (``<model_stage>.*`` and
    ``SUB_MODEL_EXTRA_TENSORS``) from the safetensors headers (evidence D), or None when the
    headers list none of them (not a multi-model checkpoint)."""
    prefix, extra = f"{model_stage}.", SUB_MODEL_EXTRA_TENSORS.get(model_stage, ())
    total = count = 0
    for name in files:
        for tensor, meta in read_safetensors_header(path / name).items():
            if tensor != "__metadata__" and (tensor.startswith(prefix) or tensor in extra):
                start, end = meta["data_offsets"]
                total += int(end) - int(start)
                count += 1
    if not count:
        return None
    return total, (
        f"{count} tensors of the {model_stage} ({prefix}*"
        + (f" and {', '.join(extra)}" if extra else "")
        + ") from the safetensors headers"
    )


def _checked_text_config(
    stage: ArDecodeConfig, manifest: CheckpointManifest, path: Path, kind: str
) -> dict[str, Any]:
    """The text config of the stage's (sub-)model; ``ConfigError`` for a sub-model the checkpoint
    lacks, a streaming join its talker cannot take, or numbers the engine could not run on."""
    try:
        tcfg = text_config(manifest.config, stage.model_stage)
    except KeyError as exc:
        raise errors.ConfigError.single(
            f"stages.{stage.name}.model_stage",
            f"{exc.args[0]} in {path}",
            "use a sub-model the checkpoint has, or drop model_stage",
        ) from None
    if (
        stage.model_stage == "talker"
        and stage.join == "latest"
        and manifest.config.get("model_type") not in STREAMING_TALKERS
    ):
        raise errors.ConfigError.single(
            f"stages.{stage.name}.join",
            f"latest: the {manifest.config.get('model_type')} talker here starts on its "
            "whole hand-over only (Qwen3-Omni's text projection runs over the assistant turn at once)",
            f"use join: all (the streaming talker is {', '.join(STREAMING_TALKERS)}'s)",
        )
    where = str(path) if kind == "gguf" else f"{path}/config.json"
    problems = [
        errors.Problem(
            f"{where}: {key}",
            f"the model's {key} {what}",
            "use a decoder-only checkpoint (or set model_stage for multi-model configs)"
            if what == "is missing"
            else (
                "re-convert the model with llama.cpp's current tools: the GGUF's metadata is damaged"
                if kind == "gguf"
                else "re-download the checkpoint's config.json: these numbers must be the model's real ones"
            ),
        )
        for key, what in text_config_problems(tcfg)
    ]
    if problems:
        raise errors.ConfigError(problems)
    return tcfg


def hub_ref(stage: ArDecodeConfig) -> HubRef | None:
    """The stage's model as a Hub reference, or None for a path or ``package://`` location (the
    loader turned every relative path that exists into an absolute one)."""
    return None if Path(stage.model).is_absolute() else parse_hub_ref(stage.model)


def _context_refusal(stage: ArDecodeConfig, info: ArtifactInfo, device: Device) -> Refusal | None:
    """A context longer than the model has positions: the engine would refuse it at load."""
    limit = model_context_limit(info.internal["text_config"])
    if limit is None or stage.max_model_len <= limit:
        return None
    source = (
        "its GGUF header's context_length"
        if info.kind == "gguf"
        else "max_position_embeddings in its config.json"
    )
    return Refusal(
        RefusalCode.CONTEXT_EXCEEDS_MODEL,
        device.id,
        f"max_model_len {stage.max_model_len} is longer than the {limit} positions the model has "
        f"({source}: {info.path}); the engine would refuse it at load time",
        f"set max_model_len to {limit} or less in the config (stages.{stage.name}.max_model_len) — "
        "omni-edge never shortens a context on its own — or use a model built for a longer context",
    )


class ArDecodeKind(StageKind):
    """The ``ar_decode`` kind (see the module docstring). It holds the engine registry
    (:data:`stages.ar_decode.engines.ENGINES`), so the engines registered in the caller's
    process reach the device actors the runtime hands it to."""

    kind = "ar_decode"
    config_model = ArDecodeConfig
    runner_imports = ("numpy", "torch", "transformers")
    """Every engine's runner but llama.cpp's imports torch and transformers (vLLM does too); two
    stages loading at once in one actor (an Omni thinker and its talker) must not import them
    concurrently: a thread that meets transformers half-imported finds no ``AutoConfig`` in it."""
    consumes = ("text",)
    produces = ("text",)
    text_input = "whole"
    cpu_thread_weight = DECODE_WEIGHT
    """The stage users wait on (every sentence the voice speaks waits on it)."""
    takes_conversation = True
    scores_turns = True
    """A realtime session's history reaches it as ``{"messages": [...]}`` ahead of the
    transcript (``prompt.request_parts`` merges them)."""

    def __init__(self) -> None:
        self.engines: dict[str, DecodeEngine] = engine_registry.ENGINES

    @property
    def backends(self) -> tuple[str, ...]:  # type: ignore[override]
        """Every engine's backends, in the engines' order."""
        return tuple(b for e in self.engines.values() for b in e.backends)

    def engine(self, backend: str) -> DecodeEngine:
        """The engine that runs ``backend``."""
        return engine_registry.engine_for(backend, self.engines)

    def stage_takes_join(self, stage: StageConfig) -> bool:
        """Only an Omni talker (``model_stage: talker``) takes joined items: its thinker's two ports."""
        return getattr(stage, "model_stage", None) == "talker"

    def replica_affinity(self, stage: StageConfig) -> Literal["request", "conversation"]:
        """An Omni talker keeps a conversation on one replica (its state across turns)."""
        return "conversation" if getattr(stage, "model_stage", None) == "talker" else "request"

    def default_join(self, stage: StageConfig) -> Join | None:
        return TALKER_JOIN if self.stage_takes_join(stage) else None

    def stage_backends(self, stage: StageConfig) -> tuple[str, ...]:
        """For a plain decoder whose config names no backend: the backends of the engines that
        take its artifact (``DecodeEngine.default_for``: llama.cpp's then vLLM's for a GGUF,
        which llama.cpp reads as it is; vLLM's alone for a checkpoint directory, the plans it had
        before); every engine's for an Omni sub-model or a stage that names its own (each then
        refuses what it cannot serve, by name: ``check``)."""
        if stage.backends or getattr(stage, "model_stage", None):
            return self.backends
        artifact = "gguf" if is_gguf(getattr(stage, "model", "")) else "checkpoint"
        return tuple(
            b for e in self.engines.values() if artifact in e.default_for for b in e.backends
        )

    def ports(self, stage: StageConfig) -> Ports:
        """``text`` → ``text``; an Omni sub-model's own types (``MODEL_STAGE_PORTS``) for
        ``model_stage: thinker`` (also yields hidden states) and ``talker``."""
        sub = MODEL_STAGE_PORTS.get(getattr(stage, "model_stage", None) or "")
        if sub is None:
            return super().ports(stage)
        return Ports(parse_payloads(sub[0]), parse_payloads(sub[1]))

    @classmethod
    def resolve_paths(cls, stage: StageConfig, base_dir: Path) -> StageConfig:
        """A relative path made absolute against the config's directory; a ``package://``
        location kept; a Hub id (``orchestrator.core.hub.parse_hub_ref``) kept when no path
        of that name exists there (a path wins over an id)."""
        assert isinstance(stage, ArDecodeConfig)
        if is_package_location(stage.model):
            return stage
        path = Path(stage.model).expanduser()
        if not path.is_absolute():
            if parse_hub_ref(stage.model) is not None and not (base_dir / path).exists():
                return stage
            path = (base_dir / path).resolve()
        return stage.model_copy(update={"model": str(path)})

    def not_downloaded(self, stage: StageConfig) -> list[str]:
        """The stage's model when it is named by Hub id and the HF cache lacks a file it reads."""
        assert isinstance(stage, ArDecodeConfig)
        ref = hub_ref(stage)
        where = f"stages.{stage.name}.model"
        if ref is None or cached_model(ref, stage.model_stage, where) is not None:
            return []
        return [ref.text]

    def needs(self, stage: StageConfig, *, online: bool = True) -> list[Need]:
        """The model: named by Hub id, from the HF cache (here, its files' size) or, when
        ``online``, the Hub's listing (its size, not here); a path, from its metadata (here
        when its weights are, not for a metadata-only directory)."""
        assert isinstance(stage, ArDecodeConfig)
        ref = hub_ref(stage)
        if ref is None:
            return local_need(self._local_path(stage, None), stage.model)
        where = f"stages.{stage.name}.model"
        cached = cached_model(ref, stage.model_stage, where)
        if cached is not None:
            return [Need(ref.text, sum(f.size for f in cached.files), True, str(cached.run_path))]
        if not online or hub.offline():
            return [Need(ref.text, None, False, "not in the Hugging Face cache")]
        try:
            snapshot = hub.remote_snapshot(ref, where)
            files = wanted_files(snapshot, stage.model_stage, where)
        except errors.ConfigError as exc:
            return [Need(ref.text, None, False, exc.problems[0].what)]
        size = sum(f.size for f in files)
        return [Need(ref.text, size, False, f"not downloaded ({snapshot.commit[:12]} on the Hub)")]

    # -- planning --------------------------------------------------------------
    def describe(self, stage: StageConfig) -> ArtifactInfo:
        """What the model says of itself, read from its metadata: a checkpoint directory, a
        GGUF, or a model named by Hub id (``stages.ar_decode.hub_model``: the HF cache's snapshot,
        else the Hub's metadata — then ``details["hub"]`` says so, what a run downloads, and the
        plan's path is where the run will find it once pulled)."""
        assert isinstance(stage, ArDecodeConfig)
        ref = hub_ref(stage)
        model = (
            hub_model(ref, stage.model_stage, f"stages.{stage.name}.model")
            if ref is not None
            else None
        )
        header_only = model is not None and not model.present and model.snapshot.ref.select
        info = self._describe_at(
            stage,
            self._local_path(stage, model),
            file_bytes=model.files[0].size if model is not None and header_only else None,
        )
        if model is None:
            return info
        manifest = info.details["manifest"]
        note = model.note()
        if note:
            manifest = {**manifest, "notes": [*(manifest.get("notes") or ()), note]}
        return replace(
            info,
            path=str(model.run_path),
            details={**info.details, "manifest": manifest, "hub": model.record()},
        )

    @staticmethod
    def _local_path(stage: ArDecodeConfig, model: HubModel | None) -> Path:
        if model is not None:
            return model.read_path
        ref = stage.model
        return resolve_package_location(ref) if is_package_location(ref) else Path(ref)

    def _describe_at(
        self, stage: ArDecodeConfig, path: Path, file_bytes: int | None = None
    ) -> ArtifactInfo:
        """``describe`` of the model's files at ``path`` (``file_bytes``: a GGUF's whole size
        when ``path`` holds its header alone)."""
        if path.suffix == ".gguf":
            materialize = stage.dtype if stage.dtype != "auto" else "bfloat16"
            manifest = read_gguf(path, materialize_dtype=materialize, file_bytes=file_bytes)
            kind = "gguf"
        else:
            manifest = read_checkpoint(path, digest=stage.digest)
            kind = "checkpoint"
        tcfg = _checked_text_config(stage, manifest, path, kind)
        summary = manifest.summary()
        weight_bytes, evidence = manifest.weight_bytes, "D"
        sub = (
            _sub_model_weights(stage, path, manifest.source, manifest.weight_format, tcfg)
            if kind == "checkpoint"
            else None
        )
        own = (
            _sub_model_header_bytes(stage.model_stage, path, manifest.files)
            if kind == "checkpoint" and stage.model_stage and manifest.source == "safetensors"
            else None
        )
        if own is not None:
            weight_bytes = own[0]
            summary = {
                **summary,
                "weight_bytes": weight_bytes,
                "notes": [*(summary.get("notes") or ()), own[1]],
            }
        if sub is not None:
            weight_bytes, evidence = sub[0], "E"
            summary = {
                **summary,
                "weight_bytes": weight_bytes,
                "notes": ["weights not present and the index does not list them", sub[1]],
            }
        return ArtifactInfo(
            kind=kind,
            path=str(path),
            weight_bytes=weight_bytes,
            weight_format=manifest.weight_format,
            details={"manifest": summary, "source": stage.model},
            internal={"text_config": tcfg, "weights_evidence": evidence},
        )

    def kv(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        max_model_len: int | None = None,
        backend: str | None = None,
    ) -> KVBudget:
        """The KV cache's layout and bytes, as ``backend``'s engine allocates it
        (``DecodeEngine.kv_layout``: llama.cpp's cells and cache type); with no backend, the
        stage's ``kv_cache_dtype`` over the model's layout (what the plan reports)."""
        length = max_model_len or stage.max_model_len
        cells, kv_dtype = (
            self.engine(backend).kv_layout(stage, info, length)
            if backend is not None
            else kv_layout(stage, info, length)
        )
        return kv_budget(
            info.internal["text_config"],
            max_model_len=cells,
            max_num_seqs=stage.max_num_seqs,
            kv_dtype=kv_dtype,
        )

    def check(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        """The first reason this backend cannot run the stage on ``device``: a context longer than
        the model's; else its engine's own (``DecodeEngine.check``: an Omni sub-model, a weight
        format, a cache type or a layout it cannot run)."""
        assert isinstance(stage, ArDecodeConfig)
        too_long = _context_refusal(stage, info, device)
        if too_long is not None:
            return [too_long]
        return self.engine(backend).check(stage, info, device, backend)

    def reservations(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        *,
        max_model_len: int | None = None,
    ) -> list[Reservation]:
        """What ``backend``'s engine holds (``DecodeEngine.reservations``), with its KV cache
        laid out as it allocates it."""
        assert isinstance(stage, ArDecodeConfig)
        kv = self.kv(stage, info, max_model_len, backend)
        return self.engine(backend).reservations(
            stage, info, kv, device, backend, pool, max_model_len
        )

    def engine_kwargs(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        assert isinstance(stage, ArDecodeConfig)
        return self.engine(backend).engine_kwargs(
            stage, info, device, backend, reservations, pool_capacity
        )

    def plan_details(self, stage: StageConfig, info: ArtifactInfo) -> dict[str, Any]:
        """The KV cache as the plan reports it: bytes per token and in total, by layer kind."""
        assert isinstance(stage, ArDecodeConfig)
        kv = self.kv(stage, info)
        return {
            "kv_cache": {
                "bytes_per_token": kv.bytes_per_token,
                "bytes_total": kv.bytes_total,
                "bytes_total_flat": kv.bytes_total_flat,
                "full_attention_layers": kv.full_attention_layers,
                "sliding_window_layers": kv.sliding_window_layers,
                "recurrent_layers": kv.recurrent_layers,
                "sliding_window": kv.sliding_window,
                "dtype": kv.dtype,
                "max_model_len": kv.max_model_len,
                "max_num_seqs": kv.max_num_seqs,
            }
        }

    def remedy_for_budget(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> str:
        assert isinstance(stage, ArDecodeConfig)
        fits = self.longest_context_that_fits(stage, info, device, backend, pool, available)
        if fits >= 16:
            return (
                f"max_model_len {fits} (instead of {stage.max_model_len}) would fit in {fmt_bytes(available)}; "
                "set it in the config — omni-edge never shortens a context on its own — or free memory on "
                f"{pool}, or use a smaller or more compressed build"
            )
        return (
            f"the weights and fixed costs alone leave no room for a usable context in {fmt_bytes(available)} on {pool}: "
            "use a smaller or more compressed build, or a device with a larger pool"
        )

    def longest_context_that_fits(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> int:
        """Largest max_model_len (multiple of 16) whose whole stage budget fits ``available``."""

        def need(length: int) -> int:
            return holder_peak(
                self.reservations(stage, info, device, backend, pool, max_model_len=length), pool
            )

        limit = model_context_limit(info.internal["text_config"])
        longest = min(stage.max_model_len, limit) if limit is not None else stage.max_model_len
        lo, hi = 0, longest // 16
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if need(mid * 16) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo * 16

    # -- runtime -----------------------------------------------------------------
    def prepare(self, stage_plan: StagePlan, progress: Progress | None = None) -> Path | None:
        """What the placement's engine makes loadable first (``DecodeEngine.prepare``: a GGUF
        converted once into a cached checkpoint for an engine that loads one)."""
        return self.engine(stage_plan.backend or "").prepare(stage_plan, progress)

    def actor_env(self, stage_plan: StagePlan) -> dict[str, str]:
        """The engine's environment (``DecodeEngine.actor_env``: vLLM in the actor's own process
        with the plan's CPU threads as OpenMP's; telemetry off on every engine)."""
        return self.engine(stage_plan.backend or "").actor_env(stage_plan)

    def cpu_thread_pool(self, stage_plan: StagePlan) -> str | None:
        """The engine's shared pool, if any (torch's for vLLM's and transformers' CPU engines)."""
        return self.engine(stage_plan.backend or "").cpu_thread_pool(stage_plan)

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        return self.engine(stage_plan.backend or "").runner(stage_plan, stage)

    def turn_scorer(self, stage_plan: StagePlan, stage: StageConfig) -> TurnScorer | None:
        """The placement's engine's scorer of a spoken utterance's end (``DecodeEngine.turn_scorer``)."""
        return self.engine(stage_plan.backend or "").turn_scorer(stage_plan, stage)

    def warm_request_check(self, stage_plan: StagePlan) -> None:
        """Load what ``validate_request`` needs (the engine's tokenizer: seconds, once per
        process) now, so the first request does not pay for it."""
        self.engine(stage_plan.backend or "").request_tokenizer(stage_plan)

    def tool_family(self, stage_plan: StagePlan) -> Family:
        """The tool syntax of the chat template the placement's engine reads (``tool_grammar.
        family_of`` of its ``request_tokenizer``'s ``chat_template``; ``chatml`` without one):
        what a request's tools, calls and results are written in, here and by the server."""
        tokenizer = self.engine(stage_plan.backend or "").request_tokenizer(stage_plan)
        return family_of(getattr(tokenizer, "chat_template", None))

    def validate_request(self, stage_plan: StagePlan, stage: StageConfig, request: Request) -> None:
        """A request checked before it reaches the engine (``BadRequest``): a prompt that is text
        and not blank, sampling in range and honoured by the engine
        (``DecodeEngine.unserved_sampling``), and prompt + max_tokens within max_model_len by the
        tokenizer the engine reads (``DecodeEngine.request_tokenizer``; ``prompt.check_request``).
        The request is read as the runner reads it, its item (an unrecognized value as it came,
        so the refusal says which field is wrong)."""
        engine = self.engine(stage_plan.backend or "")
        tokenizer = engine.request_tokenizer(stage_plan)
        value = request.item()
        backend = stage_plan.backend or engine.name
        check_request(stage, tokenizer, value, lambda s: engine.check_sampling(s, backend))
