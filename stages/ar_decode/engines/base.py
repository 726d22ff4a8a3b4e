"""The decode engine interface: what an engine can load, what it holds, what it refuses, how it runs.

An ``ar_decode`` stage is planned and run by its kind (``stages.ar_decode.kind``), which
reads the artifact, checks the context against the model and asks the engine of the
placement's backend for the rest — as vLLM's executors or Olive's passes, one class per
engine behind one interface, registered by the name of its row in the engine table
(``orchestrator.core.engines``):

* planning, without loading anything: its refusals (:meth:`DecodeEngine.check`: an
  Omni sub-model it cannot run, a weight format or cache type it lacks), the KV cache's
  layout (:meth:`~DecodeEngine.kv_layout`), every byte it holds
  (:meth:`~DecodeEngine.reservations`) and its settings (:meth:`~DecodeEngine.engine_kwargs`);
* the run: what the caller's process prepares (:meth:`~DecodeEngine.prepare`), the device
  actor's environment (:meth:`~DecodeEngine.actor_env`) and CPU thread pool
  (:meth:`~DecodeEngine.cpu_thread_pool`), its runner (:meth:`~DecodeEngine.runner`, a
  ``StageRunner``: most are ``stages.ar_decode.engines.threaded.ThreadedEngineRunner``) and
  the tokenizer a request is counted with before it reaches the actor
  (:meth:`~DecodeEngine.request_tokenizer`).

The helpers below are what engines that load a checkpoint share (its weights as the manifest
counts them, the load's transient, a GPU engine's host process, a cache type only llama.cpp has,
the checkpoint made loadable before the run). An engine module imports nothing heavy: its
runner imports its engine inside the device actor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.core import engines as engine_table
from orchestrator.core import errors
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import RefusalCode
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import Refusal
from orchestrator.core.profile import HOST_RAM
from orchestrator.core.units import GiB
from stages.ar_decode import formats, model_cache
from stages.ar_decode.checkpoint import FORMAT_DTYPE, read_checkpoint, weights_missing
from stages.ar_decode.config import ArDecodeConfig
from stages.ar_decode.formats import FormatRule
from stages.ar_decode.kv import KV_BLOCK_TYPES, KVBudget
from stages.ar_decode.prompt import check_served, checkpoint_tokenizer
from stages.base import ArtifactInfo, Progress, StageConfig, StageRunner, TurnScorer

if TYPE_CHECKING:
    from orchestrator.core.engines import DecodeEngineRow
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device
    from stages.requests import Sampling

NO_TELEMETRY_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
"""vLLM's usage statistics off, on every engine's actor: nothing leaves the machine."""
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_CONFIGURE_LOGGING": "1",
    "TOKENIZERS_PARALLELISM": "false",
    **NO_TELEMETRY_ENV,
}
"""vLLM logs every engine setting at INFO; the run's own report says what matters.
The tokenizer's own thread pool stays off (it warns and deadlocks across forks).
Usage statistics off (``NO_TELEMETRY_ENV``)."""

# ---- estimates (evidence E) the engines that load a checkpoint share ---------------
ACTIVATION_LIVE_TENSORS = 12
"""[tokens, hidden]-sized tensors charged as live at once during a prefill chunk.
Generous: a gated MLP with a 4× intermediate is the widest point, and 12 covers it
with the attention workspace."""
HOST_PROCESS_BYTES_FOR_GPU = int(1.5 * GiB)
"""Host RAM held by the process that drives a GPU engine: Python, torch, the CUDA
runtime and pinned staging buffers. Charged to host_ram, not to the GPU's VRAM."""
LOAD_TRANSIENT_FRACTION = 0.10
"""Peak above the resident weights while loading, as a fraction of them; the larger
of this and one average shard is charged, since safetensors are copied shard by shard."""


class DecodeEngine(ABC):
    """One decode engine (see the module docstring). Subclasses set ``name`` — their row's in
    ``orchestrator.core.engines``, whose backends they run — and implement the planning and
    the runner; the defaults are an engine that needs nothing prepared, no environment and no
    shared thread pool, and whose requests are counted by the runner alone."""

    name: ClassVar[str]
    """The engine's row in ``orchestrator.core.engines`` (and its module's name here)."""
    default_for: ClassVar[tuple[str, ...]] = ()
    """The artifacts (``gguf``, ``checkpoint``) a plain decoder whose config names no backend
    is tried on this engine for, in table order; empty: only a stage that names it."""
    format_rules: ClassVar[tuple[FormatRule, ...]] = ()
    """The weight formats its backends execute, each with its reason (``stages.ar_decode.formats``)."""
    unserved_sampling: ClassVar[dict[str, str]] = {}
    """Sampling keys (``stages.requests.Sampling``) this engine cannot honour → the remedy. A
    request whose sampling (its own, or the config's) asks for one is refused naming the key
    and the backend (``prompt.check_served``), never decoded without it."""

    def __init__(self) -> None:
        row = engine_table.row(self.name)
        if row is None:
            raise LookupError(
                f"decode engine {self.name!r} has no row in orchestrator.core.engines "
                "(orchestrator.core.engines.register it first)"
            )
        self.row: DecodeEngineRow = row
        """Its row, kept: the engine travels to its device actors with the kind."""

    @property
    def backends(self) -> tuple[str, ...]:
        return self.row.backend_names

    def on_cpu(self, backend: str) -> bool:
        """Whether ``backend`` is this engine's CPU backend."""
        found = self.row.backend(backend)
        return found is not None and "cpu" in found.drives

    # -- planning --------------------------------------------------------------------
    def check(
        self, stage: ArDecodeConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        """Why this engine cannot run ``stage`` on ``device`` whatever the memory (the kind has
        checked the context against the model's); [] when it can."""
        return []

    def kv_layout(self, stage: ArDecodeConfig, info: ArtifactInfo, length: int) -> tuple[int, str]:
        """``(tokens per sequence, dtype)`` of the KV cache this engine allocates for ``length``
        tokens (default: :func:`kv_layout`)."""
        return kv_layout(stage, info, length)

    @abstractmethod
    def reservations(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        kv: KVBudget,
        device: Device,
        backend: str,
        pool: str,
        max_model_len: int | None,
    ) -> list[Reservation]:
        """Every byte it holds on ``pool`` (and the host's RAM) for ``stage`` on ``device``:
        ``kv`` is its cache as :meth:`kv_layout` laid it out; ``max_model_len`` a shorter
        context the kind is trying (the remedy's search), or None for the stage's own."""

    @abstractmethod
    def engine_kwargs(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        """What its runner is handed: the plan's ``engine_kwargs``."""

    def format_refusal(self, backend: str, device: Device, weight_format: str) -> str | None:
        """None when ``backend`` executes ``weight_format`` on ``device``, else the reason."""
        return formats.format_refusal(self.format_rules, backend, device, weight_format)

    def supported_formats(self, backend: str, device: Device) -> list[str]:
        return formats.supported_formats(self.format_rules, backend, device)

    # -- the run ---------------------------------------------------------------------
    def prepare(self, stage_plan: StagePlan, progress: Progress | None = None) -> Path | None:
        """Make the weights loadable in the caller's process, before any actor starts; None
        when there is nothing to do (the default)."""
        return None

    def actor_env(self, stage_plan: StagePlan) -> dict[str, str]:
        """The environment the device actor needs before anything is imported in it."""
        return {}

    def cpu_thread_pool(self, stage_plan: StagePlan) -> str | None:
        """A process-wide CPU thread pool the engine shares with other stages in its actor
        (``StageKind.cpu_thread_pool``), or None when its threads are its own."""
        return None

    @abstractmethod
    def runner(self, stage_plan: StagePlan, stage: StageConfig) -> StageRunner:
        """The runtime object of an admitted placement (inside the device actor)."""

    def check_sampling(self, sampling: Sampling, backend: str) -> str | None:
        """``BadRequest`` for what of a request's ``sampling`` (the config's merged with its own)
        this engine cannot honour on ``backend`` (``unserved_sampling``); what its runner is to
        decode under (llama.cpp: the grammar of ``json_schema``), else None."""
        check_served(sampling, self.unserved_sampling, backend)
        return None

    def request_tokenizer(self, stage_plan: StagePlan) -> Any | None:
        """The tokenizer a request is counted with before it reaches the actor (the one the
        engine reads; loaded once per process), or None: the runner's own check stays."""
        return None

    def turn_scorer(self, stage_plan: StagePlan, stage: StageConfig) -> TurnScorer | None:
        """A scorer of how complete a spoken utterance is, from this stage's own model, for a
        realtime session's semantic turn detection (run in the server, not loaded yet); None
        when the engine has none (the default)."""
        return None


class CheckpointEngine(DecodeEngine):
    """An engine that loads a checkpoint directory with torch (vLLM, transformers): a GGUF is
    converted once before the run (:func:`prepare_checkpoint`), a request is counted with the
    checkpoint's own tokenizer (``prompt.checkpoint_tokenizer``), and on the CPU it computes on
    torch's intra-op pool — one thread count per process, shared with every torch engine in
    its actor."""

    def prepare(self, stage_plan: StagePlan, progress: Progress | None = None) -> Path | None:
        return prepare_checkpoint(stage_plan, progress)

    def cpu_thread_pool(self, stage_plan: StagePlan) -> str | None:
        return "torch" if self.on_cpu(stage_plan.backend or "") else None

    def request_tokenizer(self, stage_plan: StagePlan) -> Any | None:
        return checkpoint_tokenizer(stage_plan)


# ---- what the engines that load a checkpoint share ---------------------------------------
def kv_layout(stage: ArDecodeConfig, info: ArtifactInfo, length: int) -> tuple[int, str]:
    """``(length, dtype)`` of a KV cache of ``length`` tokens per sequence in the stage's
    ``kv_cache_dtype``, auto being the model's dtype (a block type no engine but llama.cpp has is
    planned as the model's: ``check`` refuses it)."""
    if stage.kv_cache_dtype == "auto" or stage.kv_cache_dtype in KV_BLOCK_TYPES:
        return length, effective_dtype(stage, info)
    return length, stage.kv_cache_dtype


def effective_dtype(stage: ArDecodeConfig, info: ArtifactInfo) -> str:
    """The stage's dtype; auto: the checkpoint's own (bfloat16 where its format names none)."""
    if stage.dtype != "auto":
        return stage.dtype
    return FORMAT_DTYPE.get(info.weight_format, "bfloat16")


def weights_reservation(info: ArtifactInfo, pool: str) -> Reservation:
    """The weights as the manifest counts them (vLLM's and transformers' own loaders)."""
    manifest = info.details["manifest"]
    shards = max(int(manifest.get("shards", 1)), 1)
    return Reservation(
        pool,
        "weights",
        info.weight_bytes,
        "session",
        info.internal.get("weights_evidence", "D"),
        f"{info.weight_format}; {'; '.join(manifest.get('notes') or ()) or f'{shards} safetensors file(s)'}",
    )


def shard_transient(info: ArtifactInfo) -> int:
    """The load's peak above the resident weights: ``LOAD_TRANSIENT_FRACTION`` of them, or one
    average shard when that is more (safetensors are copied shard by shard)."""
    shards = max(int(info.details["manifest"].get("shards", 1)), 1)
    return int(max(info.weight_bytes * LOAD_TRANSIENT_FRACTION, info.weight_bytes / shards))


def kv_reservation(pool: str, kv: KVBudget, note: str) -> Reservation:
    """The KV cache, allocated after the load (``note``: the arithmetic, as the plan says it)."""
    return Reservation(pool, "kv_cache", kv.bytes_total, "session", "E", note, at_load=False)


def workspace_reservation(pool: str, nbytes: int, note: str) -> Reservation:
    """The engine's own workspace for the session (``note``: what it is, the figure's source)."""
    return Reservation(pool, "backend_workspace", nbytes, "session", "E", note)


def host_process_reservation(note: str) -> Reservation:
    """A GPU engine's host process in host RAM (``HOST_PROCESS_BYTES_FOR_GPU``)."""
    return Reservation(HOST_RAM, "host_process", HOST_PROCESS_BYTES_FOR_GPU, "session", "E", note)


def kv_block_refusal(stage: ArDecodeConfig, device: Device, backend: str) -> Refusal:
    """A llama.cpp block type (q8_0) asked of a backend that has no such cache."""
    return Refusal(
        RefusalCode.KV_CACHE_DTYPE_UNSUPPORTED,
        device.id,
        f"kv_cache_dtype {stage.kv_cache_dtype}: {backend} has no {stage.kv_cache_dtype} KV cache "
        "(it is llama.cpp's block type)",
        f"list llamacpp-cpu in stages.{stage.name}.backends for a {stage.kv_cache_dtype} cache, or set "
        f"stages.{stage.name}.kv_cache_dtype to auto (or fp8 on vLLM)",
    )


def format_refusals(
    engine: DecodeEngine, stage: ArDecodeConfig, info: ArtifactInfo, device: Device, backend: str
) -> list[Refusal]:
    """A weight format ``engine``'s ``backend`` cannot execute on ``device``."""
    reason = engine.format_refusal(backend, device, info.weight_format)
    if not reason:
        return []
    usable = engine.supported_formats(backend, device)
    return [
        Refusal(
            RefusalCode.WEIGHT_FORMAT_UNSUPPORTED,
            device.id,
            f"the checkpoint is {info.weight_format} and {device.id} ({device.name}) through {backend} cannot run it: {reason}",
            f"use a {' or '.join(usable)} build of this model on {device.id}, or let the stage run on a device whose backend executes {info.weight_format}",
        )
    ]


def prepare_checkpoint(stage_plan: StagePlan, progress: Progress | None = None) -> Path | None:
    """A GGUF model converted once into a cached safetensors checkpoint (the engine loads that);
    a checkpoint directory needs nothing, but must hold its weights. Finding a cached
    conversion imports nothing heavy."""
    model = stage_plan.engine_kwargs.get("model")
    if model and not str(model).lower().endswith(".gguf"):
        # planning needs metadata only; loading needs the weights: say so before anything starts
        missing = weights_missing(read_checkpoint(model))
        if missing:
            raise errors.ConfigError.single(
                f"stages.{stage_plan.name}.model",
                f"{model} holds no weights to load: {missing}",
                "put the checkpoint's safetensors files in that directory, or point model: at a directory that has "
                "them (a metadata-only directory plans, it does not run)",
            )
    if not model or not str(model).lower().endswith(".gguf"):
        return None
    dtype = stage_plan.engine_kwargs.get("dtype")
    return model_cache.ensure_checkpoint(
        model,
        dtype=dtype if dtype not in (None, "auto") else model_cache.DEFAULT_DTYPE,
        progress=progress,
    )
