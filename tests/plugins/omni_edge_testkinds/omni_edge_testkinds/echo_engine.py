"""``echo``: a decode engine that "decodes" by echoing the prompt, word by word — a new engine
is one module and one table row.

The row (:data:`ROW`) is what the layers below the stage kinds read: the backend ``echo-cpu``
on any CPU, found in no machine's probe (a recorded profile lists it). The engine
(:class:`EchoEngine`) is what the ``ar_decode`` kind asks: it runs unquantized checkpoints'
metadata (it reads no weights), holds a fixed workspace, and its runner
(:class:`EchoEngineRunner`) is a :class:`~stages.ar_decode.engines.threaded.ThreadedEngineRunner`
whose engine thread hands the prompt's words back, up to the request's ``max_tokens``.

Not registered by importing this module: a test registers the row
(``orchestrator.core.engines.register``), then the engine
(``stages.ar_decode.engines.register``), and takes both out when it is done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from orchestrator.core.engines import DecodeEngineRow, EngineBackend
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import Refusal, StagePlan
from orchestrator.core.profile import Device
from orchestrator.core.units import MiB
from stages.ar_decode.config import ArDecodeConfig
from stages.ar_decode.engines.base import DecodeEngine, format_refusals, workspace_reservation
from stages.ar_decode.engines.threaded import EngineRequest, ThreadedEngineRunner
from stages.ar_decode.formats import FormatRule
from stages.ar_decode.kv import KVBudget
from stages.ar_decode.prompt import request_parts
from stages.base import ArtifactInfo, StageConfig

ROW = DecodeEngineRow(
    engine="echo",
    title="echo",
    backends=(EngineBackend("echo-cpu", {"cpu": ()}),),
    found="recorded",
)
WORKSPACE_BYTES = 8 * MiB
"""What the echo engine holds: its words in flight, generously."""


class EchoEngineRunner(ThreadedEngineRunner):
    """The echo engine's runner: one engine thread that hands each prompt's words back."""

    title = "echo"
    stopped = "its echo engine stopped (code engine_failed); restart the server"

    def load(self) -> None:
        self._meter.start()
        self._loaded = True
        self._started()
        self.load_info = {"in_process": True, "engine": "echo"}

    def _ready(self) -> bool:
        return getattr(self, "_loaded", False)

    def _release(self) -> None:
        self._loaded = False

    async def _accept(
        self, request_id: str, inputs: AsyncIterator[Any]
    ) -> tuple[EngineRequest, tuple[Any, ...]]:
        messages, sampling = request_parts(self.stage, [item async for item in inputs])
        words = messages[-1]["content"].split()
        req = self._new_request(request_id, len(words))
        return req, ("add", req, words, int(sampling["max_tokens"]))

    def _serve_engine(self) -> None:
        while True:
            for cmd in self._take(block=True):
                if cmd[0] == "stop":
                    return
                if cmd[0] == "add":
                    self._echo(cmd[1], cmd[2], cmd[3])

    def _echo(self, req: EngineRequest, words: list[str], max_tokens: int) -> None:
        self._busy()
        for i, word in enumerate(words[:max_tokens]):
            if req.cancel.is_set():
                break
            req.produced()
            req.put(word if i == 0 else f" {word}")
        self._idle()
        req.end("length" if len(words) > max_tokens else "stop")


class EchoEngine(DecodeEngine):
    """The echo engine (see the module docstring)."""

    name = "echo"
    format_rules = tuple(
        FormatRule("echo-cpu", f, True, "echo reads no weights") for f in ("bf16", "fp16", "fp32")
    )

    def check(
        self, stage: ArDecodeConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        return format_refusals(self, stage, info, device, backend)

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
        return [workspace_reservation(pool, WORKSPACE_BYTES, "the echo engine's words in flight")]

    def engine_kwargs(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> dict[str, Any]:
        return {"model": info.path, "max_model_len": stage.max_model_len}

    def runner(self, stage_plan: StagePlan, stage: StageConfig) -> EchoEngineRunner:
        return EchoEngineRunner(stage_plan, stage)
