"""``Pipeline.open``: the async way in. Planning, preparation and the start run in
a worker thread, so the caller's event loop keeps running; a refused plan, a
finished ``async with`` and a cancelled open each leave nothing started."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import Pipeline
from orchestrator.core.errors import PlanRefused
from orchestrator.core.units import GiB
from tests.helpers.profiles import make_profile

LOAD_S = 3.0
"""The echo voice's load time: long enough that a blocked event loop shows."""


def write(
    tmp_path: Path, voice: str = f", load_s: {LOAD_S}", ram: int = 8 * GiB
) -> tuple[Path, Path]:
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


async def _ticking(work: Any) -> tuple[Any, float, float]:
    """Await ``work`` while a ticker runs on the same loop: (its result, seconds it
    took, the longest the loop went without a tick)."""
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.02)

    task = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    ticks.append(t0)
    try:
        result = await work
    finally:
        task.cancel()
    took = time.perf_counter() - t0
    ticks.append(time.perf_counter())
    return result, took, max(b - a for a, b in itertools.pairwise(ticks))


@pytest.mark.ray
def test_the_loop_keeps_running_while_the_pipeline_starts_and_async_with_closes_it(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cfg, prof = write(tmp_path)

    async def main() -> tuple[float, float, str, Pipeline]:
        opening = Pipeline.open(cfg, profile=prof, record=None)
        (pipeline, took, longest_gap) = await _ticking(opening.__aenter__())
        try:
            result = await pipeline.arun("hello")
        finally:
            await opening.__aexit__(None, None, None)
        return took, longest_gap, result.text, pipeline

    took, longest_gap, text, pipeline = asyncio.run(main())
    assert took >= LOAD_S  # the start really waited for the slow load ...
    assert longest_gap < 1.0, (
        f"the event loop stood still for {longest_gap:.2f} s while the pipeline started"
    )  # ... off the loop
    assert text.startswith("You said hello.")
    assert pipeline.final_ledger is not None and pipeline.final_ledger["held_bytes"] == 0


@pytest.mark.ray
def test_an_awaited_open_returns_a_started_pipeline(ray_cluster: Any, tmp_path: Path) -> None:
    cfg, prof = write(tmp_path, voice="")

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
    cfg, prof = write(tmp_path)
    closed: list[dict[str, Any]] = []
    close = Pipeline.close

    def spy(self: Pipeline) -> dict[str, Any]:
        closed.append(close(self))
        return closed[-1]

    monkeypatch.setattr(Pipeline, "close", spy)

    async def main() -> None:
        task = asyncio.create_task(Pipeline.open(cfg, profile=prof, record=None).__aenter__())
        await asyncio.sleep(LOAD_S / 3)  # the start is under way: Ray joined, the voice loading
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())  # returns once the start thread is done (asyncio.run joins it)
    assert len(closed) == 1 and closed[0]["held_bytes"] == 0
