"""A stage stream's closing message is one typed record, ``("stats", StageStats)``, written by
the device actor and read by the runtime's pump: the figures (the actor's own, then the
runner's ``request_stats``) apart from the stamps the first-audio trace reads. Before, it was a
dict whose ``stamps`` entry the reader popped out by name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from orchestrator.core.plan import StagePlan
from orchestrator.runtime.device_actor import DeviceActor
from orchestrator.runtime.metering import Hosted
from orchestrator.runtime.pump import _StagePump
from orchestrator.runtime.stage_stats import NO_STAMPS, StageStats
from stages.base import StageRunner


class Echo(StageRunner):
    def load(self) -> None:
        pass

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in inputs:
            yield item

    def request_stats(self, request_id: str) -> dict[str, Any]:
        return {"prompt_tokens": 7, "stamps": {"session_run": 1.5}}


def _actor() -> DeviceActor:
    plan = StagePlan(
        name="s",
        kind="exported_graph",
        admitted=True,
        device="cpu",
        backend="ort-cpu",
        route="this-process",
        reservations=(),
        refusals=(),
        engine_kwargs={},
        artifact={},
    )
    actor = DeviceActor("cpu", ledger=None)
    actor.stages["s"] = Hosted(
        plan=plan, runner=Echo(), load_s=0.0, load_info={}, tree_load_peak=0, tree_resident=0
    )
    return actor


async def _messages(actor: DeviceActor) -> list[tuple[str, Any]]:
    return [m async for m in actor.stream("s", "r1", ["one ", "two"])]


def test_the_stream_closes_with_one_stage_stats_record() -> None:
    messages = asyncio.run(_messages(_actor()))
    assert [kind for kind, _ in messages] == ["out", "out", "stats"]
    closing = messages[-1][1]
    assert isinstance(closing, StageStats)
    assert closing.figures["items"] == 2 and closing.figures["chars"] == len("one two")
    assert closing.figures["prompt_tokens"] == 7  # the runner's figures, merged
    assert "stamps" not in closing.figures  # the stamps never sit among the figures
    assert len(closing.stamps["emitted"]) == 2
    assert closing.stamps["runner"] == {"session_run": 1.5}
    assert closing.stamps["first_fed"] is None  # the request came as `initial`, nothing was fed


def test_the_pump_reads_the_record_the_actor_sends() -> None:
    messages = asyncio.run(_messages(_actor()))
    closing = messages[-1][1]

    class Pump:  # _StagePump.read's state; the outputs themselves are counted, not routed
        def __init__(self) -> None:
            self.stats: dict[str, Any] = {}
            self.stamps = NO_STAMPS
            self.outputs: list[Any] = []

        async def _output(self, item: Any) -> None:
            self.outputs.append(item)

    async def gen() -> AsyncIterator[Any]:
        for m in messages:
            yield asyncio.sleep(0, m)  # what Ray's streaming generator yields: awaitables

    pump = Pump()
    asyncio.run(_StagePump.read(pump, gen()))  # type: ignore[arg-type]
    assert pump.outputs == ["one ", "two"]
    assert pump.stats == closing.figures and pump.stats["items"] == 2
    assert pump.stamps == closing.stamps and len(pump.stamps["emitted"]) == 2
