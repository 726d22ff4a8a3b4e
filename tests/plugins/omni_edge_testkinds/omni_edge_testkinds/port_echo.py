"""``port_echo``: a weightless stage kind with two output ports, for output-port tests.

``mode: source`` stands in for an Omni thinker: it produces ``text`` and
``tensor:hidden_states`` (ports ``text`` and ``hidden_states``). It reads its
input to the end, then for i = 0 … ``count`` - 1 yields, each tagged with its
port (``stages.payloads.on_port``), the hidden states of step i — a float32
array ``[[i, i, i, i]]`` — and the sentence ``"Sentence i. "`` (``delay_s``
before each pair), so a test knows exactly which item is on which port and in
which order.

``mode: report`` stands in for a talker: it consumes ``tensor:hidden_states``
and ``text``, takes a join, and for every item it receives yields
``{"got": <what it received, made plain>}``, where an array becomes
``{"array": [[...]], "dtype": "float32"}`` — so a test sees exactly what reached
it on each input.

Registered by this distribution's entry point (``port_echo =
"omni_edge_testkinds.port_echo:PortEchoKind"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import StagePlan
from orchestrator.core.profile import Route
from orchestrator.core.units import MiB
from stages.base import ArtifactInfo, StageConfig, StageKind, StageRunner
from stages.payloads import Ports, on_port, parse_payloads


class PortEchoConfig(StageConfig):
    """A weightless two-port source, or a sink of both ports."""

    kind: Literal["port_echo"] = Field(description="Always 'port_echo'.")
    mode: Literal["source", "report"] = Field(
        "report", description="source: text and hidden states; report: a sink."
    )
    count: int = Field(
        3, ge=0, description="Steps a source yields (one item on each port per step)."
    )
    delay_s: float = Field(
        0.0, ge=0, description="Pause before each step (source) or item (report)."
    )
    bad_port: bool = Field(
        False, description="A source tags its first item with a port it does not have."
    )


def plain(item: Any) -> Any:
    """``item`` with arrays spelled out, so a test compares plain lists."""
    if isinstance(item, np.ndarray):
        return {"array": item.tolist(), "dtype": str(item.dtype)}
    if isinstance(item, dict):
        return {k: plain(v) for k, v in item.items()}
    if isinstance(item, list):
        return [plain(v) for v in item]
    return item


class PortEchoRunner(StageRunner):
    def __init__(self, cfg: PortEchoConfig) -> None:
        self.cfg = cfg

    def load(self) -> None:
        pass

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        if self.cfg.mode == "source":
            async for _ in inputs:
                pass
            for i in range(self.cfg.count):
                await asyncio.sleep(self.cfg.delay_s)
                port = "codes" if self.cfg.bad_port and i == 0 else "hidden_states"
                yield on_port(port, np.full((1, 4), float(i), dtype=np.float32))
                yield on_port("text", f"Sentence {i}. ")
            return
        async for item in inputs:
            await asyncio.sleep(self.cfg.delay_s)
            yield {"got": plain(item)}


class PortEchoKind(StageKind):
    kind = "port_echo"
    config_model = PortEchoConfig
    backends = ("ort-cpu",)
    consumes: ClassVar[tuple[str, ...]] = ("text", "tensor:hidden_states")
    produces: ClassVar[tuple[str, ...]] = ("text", "tensor:hidden_states", "event")
    takes_join = True

    def ports(self, stage: StageConfig) -> Ports:
        """A source: text in, its two ports out; a sink: both ports in, events out."""
        assert isinstance(stage, PortEchoConfig)
        if stage.mode == "source":
            return Ports(
                parse_payloads(("text",)), parse_payloads(("text", "tensor:hidden_states<float32>"))
            )
        return Ports(parse_payloads(self.consumes), parse_payloads(("event",)))

    def describe(self, stage: StageConfig) -> ArtifactInfo:
        return ArtifactInfo("exported", "<none>", 0, "fp32")

    def check(self, stage: StageConfig, info: ArtifactInfo, device: Any, backend: str) -> list[Any]:
        return []

    def reservations(
        self, stage: StageConfig, info: ArtifactInfo, device: Any, backend: str, pool: str
    ) -> list[Reservation]:
        return [
            Reservation(pool, "weights", 1 * MiB, "session", "D", "what the port_echo stage holds")
        ]

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        assert isinstance(stage, PortEchoConfig)
        return PortEchoRunner(stage)
