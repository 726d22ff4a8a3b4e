"""The echo kind's fixed work time (``work_s`` under ``work_slots``): what stage replicas
are measured against. One runner serves at most ``work_slots / work_s`` items per second
however many requests it holds; the bounds here hold by construction (sleeps under a
semaphore), never by the machine's speed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import ConfigError
from stages.registry import get_kind
from stages.requests import as_request
from tests.helpers.echo import REPLY, EchoRunner, echo_pipeline

WORK_S = 0.2
ITEMS = 3  # output items per request
REQUESTS = 4


def _runner(tmp_path: Path, **thinker: Any) -> EchoRunner:
    """The ``thinker`` (a ``words`` echo stage) of the test pipeline, built by its kind."""
    plan, config = echo_pipeline(tmp_path, thinker=thinker)
    runner = get_kind("echo").runner(plan.stages[0], config.stages[0])
    assert isinstance(runner, EchoRunner)
    runner.load()
    return runner


async def _one(item: Any) -> AsyncIterator[Any]:
    yield item


async def _serve(runner: EchoRunner) -> tuple[float, list[list[str]]]:
    """``REQUESTS`` concurrent requests of ``ITEMS`` scripted deltas each: elapsed s, outputs."""

    async def request(i: int) -> list[str]:
        script = {"script": [f"r{i}d{j} " for j in range(ITEMS)]}
        return [d async for d in runner.stream(f"r{i}", _one(script))]

    t0 = time.perf_counter()
    outs = await asyncio.gather(*(request(i) for i in range(REQUESTS)))
    return time.perf_counter() - t0, list(outs)


def test_one_work_slot_serves_one_item_at_a_time_over_all_requests(tmp_path: Path) -> None:
    runner = _runner(tmp_path, work_s=WORK_S, work_slots=1)
    elapsed, outs = asyncio.run(_serve(runner))
    assert outs == [[f"r{i}d{j} " for j in range(ITEMS)] for i in range(REQUESTS)]
    assert runner.worked == REQUESTS * ITEMS
    assert runner.work_peak == 1
    # a lower bound by construction: 12 items of 0.2 s, one at a time
    assert elapsed >= REQUESTS * ITEMS * WORK_S


def test_work_slots_are_taken_at_once_by_concurrent_requests(tmp_path: Path) -> None:
    runner = _runner(tmp_path, work_s=WORK_S, work_slots=REQUESTS)
    elapsed, outs = asyncio.run(_serve(runner))
    assert [len(o) for o in outs] == [ITEMS] * REQUESTS
    assert runner.worked == REQUESTS * ITEMS
    assert runner.work_peak == REQUESTS  # every slot in use at once, never more
    assert elapsed >= ITEMS * WORK_S


def test_two_slots_are_never_exceeded_by_four_requests(tmp_path: Path) -> None:
    runner = _runner(tmp_path, work_s=WORK_S, work_slots=2)
    elapsed, _ = asyncio.run(_serve(runner))
    assert runner.work_peak == 2
    assert elapsed >= REQUESTS * ITEMS * WORK_S / 2


def test_no_work_time_by_default(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    assert (runner.cfg.work_s, runner.cfg.work_slots) == (0, 1)
    _, outs = asyncio.run(_serve(runner))
    assert [len(o) for o in outs] == [ITEMS] * REQUESTS
    assert (runner.worked, runner.work_peak) == (0, 0)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("work_s", -0.1, "greater than or equal to 0"),
        ("work_slots", 0, "greater than or equal to 1"),
    ],
)
def test_bad_work_settings_are_refused_naming_the_field(
    tmp_path: Path, field: str, value: float, rule: str
) -> None:
    with pytest.raises(ConfigError) as err:
        echo_pipeline(tmp_path, thinker={field: value})
    text = str(err.value)
    assert f"stages[0].{field}: Input should be {rule} (got {value})" in text


@pytest.mark.ray
def test_the_slots_are_shared_by_every_request_of_a_stage_in_its_device_actor(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Through the runtime: one runner per stage in its device actor, so 4 concurrent
    requests to a one-slot thinker take at least the sum of their items' work times."""
    from orchestrator.runtime.events import collect
    from orchestrator.runtime.runtime import Runtime

    work_s = 0.05
    plan, config = echo_pipeline(tmp_path, thinker={"work_s": work_s, "work_slots": 1})
    prompts = [f"p{i}" for i in range(REQUESTS)]
    words = sum(len(f"You said {p}. {REPLY}".split(" ")) for p in prompts)
    rt = Runtime(plan, config)
    rt.start()
    try:

        async def one(p: str) -> Any:
            return collect(p, p, [e async for e in rt.stream(as_request(p))], 0.0)

        async def main() -> tuple[float, list[Any]]:
            t0 = time.perf_counter()
            results = await asyncio.gather(*(one(p) for p in prompts))
            return time.perf_counter() - t0, list(results)

        elapsed, results = asyncio.run(main())
    finally:
        rt.close()
    assert [r.text for r in results] == [f"You said {p}. {REPLY}" for p in prompts]
    assert elapsed >= words * work_s  # a lower bound by construction
