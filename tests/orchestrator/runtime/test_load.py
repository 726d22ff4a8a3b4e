"""Under load: admission is bounded, a full pipeline answers "busy" at once, nothing stalls.

Each request holds two ``stream`` calls on the device actor for its whole
life plus the ``feed`` calls that carry text to the voice; with only the
actor's own ``max_concurrency`` (64) in the way, 33 requests filled it with
``stream`` calls and no ``feed`` ever ran: every request waited forever."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import PipelineBusy
from orchestrator.runtime.admission import (
    CONTROL_CALLS,
    Admission,
    calls_per_request,
    in_flight_limit,
)
from orchestrator.runtime.device_actor import ACTOR_OPTIONS
from orchestrator.runtime.events import collect
from orchestrator.runtime.runtime import Runtime
from stages.requests import as_request
from tests.helpers.echo import echo_pipeline
from tests.helpers.waiting import await_until

STALL_BOUND_S = 60.0


def test_the_limit_counts_every_call_a_request_holds_on_each_device() -> None:
    # words → tone on one device: two streams and one feed at a time
    calls = calls_per_request(
        {"thinker": "cpu", "voice": "cpu"}, {"thinker": None, "voice": "thinker"}
    )
    assert calls == {"cpu": 3}
    assert in_flight_limit(calls, 64) == (64 - CONTROL_CALLS) // 3
    split = calls_per_request(
        {"thinker": "cpu", "voice": "igpu:0"}, {"thinker": None, "voice": "thinker"}
    )
    assert split == {"cpu": 1, "igpu:0": 2}
    assert in_flight_limit(split, 64) == (64 - CONTROL_CALLS) // 2


def test_a_full_queue_is_refused_as_busy_with_the_numbers() -> None:
    adm = Admission(2, max_waiting=1, wait_timeout_s=30)

    async def main() -> None:
        await adm.acquire()
        await adm.acquire()
        waiter = asyncio.create_task(adm.acquire())
        await await_until(lambda: adm.waiting == 1, "the third acquire waiting")
        with pytest.raises(PipelineBusy) as info:
            await adm.acquire()
        e = info.value
        assert (e.limit, e.in_flight, e.waiting, e.max_waiting) == (2, 2, 1, 1)
        assert "busy" in str(e) and "limit 2" in str(e)
        adm.release()  # the slot passes to the waiter, first come first served
        await asyncio.wait_for(waiter, 5)
        assert adm.in_flight == 2 and adm.waiting == 0
        adm.release()
        adm.release()
        assert adm.in_flight == 0

    asyncio.run(main())


def test_a_wait_past_the_timeout_is_busy_and_gives_nothing_away() -> None:
    adm = Admission(1, max_waiting=4, wait_timeout_s=0.1)

    async def main() -> None:
        await adm.acquire()
        with pytest.raises(PipelineBusy, match=r"within 0\.1 s"):
            await adm.acquire()
        assert adm.waiting == 0 and adm.in_flight == 1
        adm.release()
        await adm.acquire()  # the slot came back

    asyncio.run(main())


def test_slots_pass_between_event_loops_in_threads() -> None:
    adm = Admission(1, max_waiting=8, wait_timeout_s=10)
    done: list[int] = []

    def worker(i: int) -> None:
        async def main() -> None:
            await adm.acquire()
            await asyncio.sleep(0.01)
            done.append(i)
            adm.release()

        asyncio.run(main())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert sorted(done) == list(range(6)) and adm.in_flight == 0


@pytest.fixture(scope="module")
def one_device(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    # Both stages on one device actor: the case that stalled at 33 requests.
    plan, config = echo_pipeline(
        tmp_path_factory.mktemp("load"), thinker={"delay_s": 0.002}, voice={"delay_s": 0.002}
    )
    rt = Runtime(plan, config)
    rt.start()
    yield rt
    rt.close()


@pytest.mark.ray
def test_64_concurrent_requests_all_complete_or_are_refused_as_busy_never_stall(
    one_device: Runtime, tmp_path: Path
) -> None:
    rt = one_device
    assert (
        rt.admission.limit * rt.calls_per_request["cpu"] + CONTROL_CALLS
        <= ACTOR_OPTIONS["max_concurrency"]
    )

    # Each request's last delta waits for ``gate``, opened only once every one of the 64 is
    # in flight, waiting or refused: none can end (and free a slot for a later one) before all
    # were placed, so the split below is the admission's, not the machine's speed.
    gate = tmp_path / "all-placed"
    refused: list[PipelineBusy] = []

    def script(i: int) -> dict[str, Any]:
        return {"script": [f"Number {i}.", " And done."], "gate_file": str(gate)}

    async def one(i: int) -> Any:
        try:
            events = [e async for e in rt.stream(as_request(script(i)), request_id=f"load-{i}")]
        except PipelineBusy as exc:
            refused.append(exc)
            return exc
        return collect(f"load-{i}", f"p{i}", events, 0.0)

    async def open_when_placed() -> None:
        adm = rt.admission
        await await_until(
            lambda: adm.in_flight + adm.waiting + len(refused) == 64,
            "every request in flight, waiting or refused",
        )
        gate.touch()

    async def main() -> list[Any]:
        opener = asyncio.create_task(open_when_placed())
        results = await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(64))), STALL_BOUND_S
        )
        await opener
        return results

    t0 = time.perf_counter()
    results = asyncio.run(main())
    assert time.perf_counter() - t0 < STALL_BOUND_S
    busy = [r for r in results if isinstance(r, PipelineBusy)]
    done = [(i, r) for i, r in enumerate(results) if not isinstance(r, PipelineBusy)]
    # admitted: the limit in flight plus as many waiting; the rest refused at once
    assert 0 < len(done) == rt.admission.limit + rt.admission.max_waiting < 64
    assert len(busy) == 64 - len(done)
    assert all(b.limit == rt.admission.limit for b in busy)
    for i, r in done:
        assert r.text == f"Number {i}. And done." and r.chunks == [f"Number {i}.", "And done."]
    assert rt.admission.in_flight == 0 and rt.admission.waiting == 0
    # and the pipeline still answers afterwards
    after = asyncio.run(main_one(rt, "p99"))
    assert after.text.startswith("You said p99.")


async def main_one(rt: Runtime, prompt: str) -> Any:
    events = [e async for e in rt.stream(as_request(prompt))]
    return collect("after", prompt, events, 0.0)


@pytest.mark.ray
def test_requests_admitted_one_after_another_never_need_a_busy_answer(one_device: Runtime) -> None:
    rt = one_device

    async def main() -> int:
        n = 0
        for i in range(3):
            n += len([e async for e in rt.stream(as_request(f"s{i}"))]) > 0
        return n

    assert asyncio.run(main()) == 3


def test_the_api_passes_the_queue_bound_to_the_runtime(tmp_path: Any) -> None:
    from orchestrator.api import Pipeline

    plan, config = echo_pipeline(tmp_path)
    p = Pipeline(plan, config, record=None, max_waiting=0)
    assert p.runtime.admission.max_waiting == 0
    assert p.runtime.admission.limit == (ACTOR_OPTIONS["max_concurrency"] - CONTROL_CALLS) // 3
