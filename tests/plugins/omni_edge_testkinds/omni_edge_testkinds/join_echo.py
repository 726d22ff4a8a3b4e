"""``join_echo``: a weightless stage kind for fan-in tests; it takes a join.

``mode: count`` is a source: it reads its input to the end, then yields
``count`` events ``{"source": <stage>, "i": i, "t": <time.time()>}`` (with
``delay_s`` before each), so a test knows exactly how many items each input
of a join gets, in which order, and when each was produced.

``mode: report`` is a sink: for every item it receives (a joined item: a
dict keyed by source stage name) it yields ``{"got": item, "t": <time.time()>}``
with ``delay_s`` before each, so a test sees what the join handed over and
can make the consumer slow.

Registered by this distribution's entry point (``join_echo =
"omni_edge_testkinds.join_echo:JoinEchoKind"``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from pydantic import Field

from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import StagePlan
from orchestrator.core.profile import Route
from orchestrator.core.units import MiB
from stages.base import ArtifactInfo, StageConfig, StageKind, StageRunner


class JoinEchoConfig(StageConfig):
    """A weightless source or sink for fan-in tests."""

    kind: Literal["join_echo"] = Field(description="Always 'join_echo'.")
    mode: Literal["count", "report"] = Field(
        "report", description="count: a source of numbered events; report: a sink."
    )
    count: int = Field(4, ge=0, description="Events a count stage yields.")
    delay_s: float = Field(0.0, ge=0, description="Pause before each output item.")
    fail_at: int | None = Field(
        None, ge=0, description="A count stage raises instead of yielding item fail_at."
    )


class JoinEchoRunner(StageRunner):
    def __init__(self, plan: StagePlan, cfg: JoinEchoConfig) -> None:
        self.plan, self.cfg = plan, cfg

    def load(self) -> None:
        pass

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        if self.cfg.mode == "count":
            async for _ in inputs:
                pass
            for i in range(self.cfg.count):
                await asyncio.sleep(self.cfg.delay_s)
                if i == self.cfg.fail_at:
                    raise RuntimeError(f"join_echo told to fail at item {i}")
                yield {"source": self.plan.name, "i": i, "t": time.time()}
            return
        async for item in inputs:
            await asyncio.sleep(self.cfg.delay_s)
            yield {"got": item, "t": time.time()}


class JoinEchoKind(StageKind):
    kind = "join_echo"
    config_model = JoinEchoConfig
    backends = ("ort-cpu",)
    consumes: ClassVar[tuple[str, ...]] = ("text", "audio", "event")
    produces: ClassVar[tuple[str, ...]] = ("event",)
    takes_join = True

    def describe(self, stage: StageConfig) -> ArtifactInfo:
        return ArtifactInfo("exported", "<none>", 0, "fp32")

    def check(self, stage: StageConfig, info: ArtifactInfo, device: Any, backend: str) -> list[Any]:
        return []

    def reservations(
        self, stage: StageConfig, info: ArtifactInfo, device: Any, backend: str, pool: str
    ) -> list[Reservation]:
        return [
            Reservation(pool, "weights", 1 * MiB, "session", "D", "what the join_echo stage holds")
        ]

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        assert isinstance(stage, JoinEchoConfig)
        return JoinEchoRunner(stage_plan, stage)
