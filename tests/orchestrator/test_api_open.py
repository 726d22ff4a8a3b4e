"""``Pipeline.open``: the async way in. Planning, preparation and the start run in
a worker thread, so the caller's event loop keeps running; a refused plan, a
finished ``async with`` and a cancelled open each leave nothing started."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import Pipeline
from orchestrator.core.errors import PlanRefused
from orchestrator.core.units import GiB
from tests.helpers.profiles import make_profile
from tests.helpers.waiting import await_until


def write(tmp_path: Path, voice: str = "", ram: int = 8 * GiB) -> tuple[Path, Path]:
    cfg = tmp_path / "echo.yaml"
    cfg.write_text(
        "name: echo-open\n"
        "stages:\n"
        "  - {name: thinker, kind: echo, mode: words, devices: [cpu], final_output: true, final_output_type: text}\n"
        "  - {name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [cpu], final_output: true,"
        f" final_output_type: audio{voice}}}\n"
    )
    prof = tmp_path / "profile.json"
    prof.write_text(make_profile(ram_available=ram).model_dump_json())
    return cfg, prof


@pytest.mark.ray
def test_the_loop_keeps_running_while_the_pipeline_starts_and_async_with_closes_it(
    ray_cluster: Any, tmp_path: Path
) -> None:
    # the voice's load() waits for ``gate``, which only this test's event loop opens once it
    # sees the load under way: a start that blocked the loop would find it closed until the
    # gate timed out (load_info["gate"] == "timed out"), however fast the machine
    loading, gate = tmp_path / "voice-loading", tmp_path / "voice-may-finish"
    cfg, prof = write(tmp_path, voice=f", loading_file: {loading}, load_gate_file: {gate}")

    async def main() -> tuple[str, dict[str, Any], Pipeline]:
        opening = Pipeline.open(cfg, profile=prof, record=None)
        entering = asyncio.ensure_future(opening.__aenter__())
        await await_until(loading.exists, "the voice's load() began")
        assert not entering.done()  # the start is held inside the voice's load
        gate.touch()
        pipeline = await entering
        try:
            result = await pipeline.arun("hello")
            load_info = pipeline.runtime.load_results["voice"]["load_info"]
        finally:
            await opening.__aexit__(None, None, None)
        return result.text, load_info, pipeline

    text, load_info, pipeline = asyncio.run(main())
    assert load_info["gate"] == "opened", load_info  # by the loop, while the start ran
    assert text.startswith("You said hello.")
    assert pipeline.final_ledger is not None and pipeline.final_ledger["held_bytes"] == 0


@pytest.mark.ray
def test_an_awaited_open_returns_a_started_pipeline(ray_cluster: Any, tmp_path: Path) -> None:
    cfg, prof = write(tmp_path)

    async def main() -> str:
        pipeline = await Pipeline.open(cfg, profile=prof, record=None)
        try:
            return (await pipeline.arun("again")).text
        finally:
            await asyncio.to_thread(pipeline.close)

    assert asyncio.run(main()).startswith("You said again.")


def test_a_refused_plan_raises_from_the_await_before_anything_starts(tmp_path: Path) -> None:
    cfg, prof = write(tmp_path, voice=", hold_bytes: 4000000000", ram=2 * GiB)

    async def main() -> None:
        async with Pipeline.open(cfg, profile=prof, record=None):
            pytest.fail("a refused plan must not start")

    with pytest.raises(PlanRefused) as info:
        asyncio.run(main())
    assert not info.value.plan.admitted


@pytest.mark.ray
def test_a_cancelled_open_closes_the_pipeline_once_its_start_finishes(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading, gate = tmp_path / "voice-loading", tmp_path / "voice-may-finish"
    cfg, prof = write(tmp_path, voice=f", loading_file: {loading}, load_gate_file: {gate}")
    closed: list[dict[str, Any]] = []
    close = Pipeline.close

    def spy(self: Pipeline) -> dict[str, Any]:
        closed.append(close(self))
        return closed[-1]

    monkeypatch.setattr(Pipeline, "close", spy)

    async def main() -> None:
        task = asyncio.create_task(Pipeline.open(cfg, profile=prof, record=None).__aenter__())
        # the start is under way: Ray joined, the voice inside its load (held at the gate)
        await await_until(loading.exists, "the voice's load() began")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert closed == []  # the start has not finished: nothing to close yet
        gate.touch()  # now it may: the start thread, finishing last, closes what it started

    asyncio.run(main())  # returns once the start thread is done (asyncio.run joins it)
    assert len(closed) == 1 and closed[0]["held_bytes"] == 0
