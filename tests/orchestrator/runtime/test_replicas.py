"""Stage replicas at run time (``replicas: N``, docs/runtime.md "Replicas"): each replica in
its own device actor, requests balanced to the least-loaded live one, a dead replica taken
out while its siblings serve. The voice is the echo kind with a fixed work time under one
work slot (``work_s``, ``work_slots: 1``): one replica serves at most ``1 / WORK_S`` items a
second whatever the machine, so the throughput bound holds by construction (sleeps, no CPU)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import StageFailed
from orchestrator.runtime import record
from orchestrator.runtime.admission import CONTROL_CALLS
from orchestrator.runtime.balance import Balancer, ReplicaRef
from orchestrator.runtime.events import AudioChunk, collect
from orchestrator.runtime.runtime import Runtime
from stages.requests import as_request
from tests.helpers.echo import echo_pipeline

WORK_S = 0.1
"""Seconds of work per voice item (one at a time per replica)."""
TEXT = "One sentence here. Another one there. A third to speak. And the last."
SENTENCES = 4
CONCURRENT = 8
USABLE = 64 - CONTROL_CALLS
"""A device actor's calls left to requests (``ACTOR_OPTIONS["max_concurrency"]`` = 64)."""
WAIT_S = 30.0
"""The longest a test waits for a state it polls."""


def _start(
    tmp_path: Path, replicas: tuple[str, ...], work_s: float = WORK_S, restart: Any = None
) -> Runtime:
    voice = {"work_s": work_s, "work_slots": 1, **({"restart": restart} if restart else {})}
    plan, config = echo_pipeline(tmp_path, voice=voice, voice_replicas=replicas)
    rt = Runtime(plan, config)
    rt.start()
    return rt


async def _one(rt: Runtime, rid: str) -> list[Any]:
    return [e async for e in rt.stream(as_request(TEXT), request_id=rid, entry="voice")]


async def _load(rt: Runtime, n: int = CONCURRENT) -> tuple[float, list[list[Any]]]:
    """``n`` concurrent requests entering at the voice: seconds from first to last, events."""
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(_one(rt, f"r{i}") for i in range(n)))
    return time.perf_counter() - t0, list(outs)


def _audio(events: list[Any]) -> int:
    return sum(isinstance(e, AudioChunk) for e in events)


@pytest.mark.slow
def test_two_replicas_serve_eight_concurrent_requests_side_by_side(
    ray_cluster: Any, tmp_path: Path
) -> None:
    one = _start(tmp_path / "one", ())
    try:
        t1, outs1 = asyncio.run(_load(one))
    finally:
        one.close()
    two = _start(tmp_path / "two", ("cpu", "igpu:0"))
    try:
        assert two.actor_keys() == ["cpu", "igpu:0"]
        t2, outs2 = asyncio.run(_load(two))
        results = [collect(f"r{i}", TEXT, o, 0.0) for i, o in enumerate(outs2)]
        doc = record.build(two, results, measured=two.measure())
        ledger = two.ledger_snapshot()
    finally:
        two.close()
    assert [_audio(o) for o in outs1] == [SENTENCES] * CONCURRENT
    assert [_audio(o) for o in outs2] == [SENTENCES] * CONCURRENT
    # one replica: 32 items one at a time, at least 3.2 s by construction; two: half each, and
    # side by side: an item's work on one replica overlapped an item's work on the other (the
    # spans are each runner's own perf_counter readings, one monotonic clock on one machine).
    # How much faster that makes them is a benchmark's figure (bench/replicas.py), not a test's.
    assert t1 >= CONCURRENT * SENTENCES * WORK_S
    spans: dict[str, list[list[float]]] = {"voice#0": [], "voice#1": []}
    for r in results:
        spans[r.stages["voice"]["holder"]] += r.stages["voice"]["work_spans"]
    assert sum(len(x) for x in spans.values()) == CONCURRENT * SENTENCES
    assert any(
        max(a0, b0) < min(a1, b1) for a0, a1 in spans["voice#0"] for b0, b1 in spans["voice#1"]
    ), f"the replicas never worked at once: {spans}"
    print(f"2 replicas {t2:.2f} s vs 1 replica {t1:.2f} s")
    rows = [r for r in doc["stages"] if r["stage"] == "voice"]
    assert [(r["replica"], r["holder"], r["device"]) for r in rows] == [
        (1, "voice#0", "cpu"),
        (2, "voice#1", "igpu:0"),
    ]
    assert all(r["requests"] > 0 for r in rows)  # both served
    assert sum(r["requests"] for r in rows) == CONCURRENT
    assert {"voice#0", "voice#1"} <= set(ledger["holders"])
    # each request's figures name the replica that served it and its device, and each row's
    # figures come from its own replica's requests
    by = {r.stages["voice"]["holder"]: r.stages["voice"]["device"] for r in results}
    assert by == {"voice#0": "cpu", "voice#1": "igpu:0"}, by
    served = [
        sum(r.stages["voice"]["holder"] == h for r in results) for h in ("voice#0", "voice#1")
    ]
    assert served == [r["requests"] for r in rows]
    for row in rows:
        mine = [r.stages["voice"] for r in results if r.stages["voice"]["holder"] == row["holder"]]
        assert row["time_to_first_output_s"] == mine[-1]["time_to_first_output_s"], row


@pytest.mark.slow
def test_a_dead_replica_fails_only_its_requests_and_the_others_keep_serving(
    ray_cluster: Any, tmp_path: Path
) -> None:
    # the voice alone on its devices, so its replicas set the admission limit: each actor
    # holds one stream and the thinker's feed per request
    rt = _start(tmp_path, ("igpu:0", "npu:0"), work_s=0.25, restart="never")
    try:
        assert rt.admission.limit == 2 * (USABLE // 2)
        routed, outs = asyncio.run(_kill_mid_load(rt))
        failed = {rid for rid, o in outs.items() if isinstance(o, BaseException)}
        assert routed["voice#1"] and routed["voice#0"]
        assert failed == routed["voice#1"]  # exactly the requests routed to replica 2
        for rid in failed:
            e = outs[rid]
            assert isinstance(e, StageFailed), e
            assert (e.stage, e.device, e.code) == ("voice", "npu:0", "device_actor_died")
            assert "replica 2 of 2 (voice#1) on npu:0" in e.cause
        for rid in routed["voice#0"]:
            assert _audio(outs[rid]) == SENTENCES
        assert rt.admission.limit == USABLE // 2  # the live replica's cap
        holders = _wait_for_holders(rt, lambda h: "voice#1" not in h)
        assert {"voice#0", "thinker"} <= set(holders) and "voice#1" not in holders
        later = asyncio.run(_one(rt, "later"))  # a later request goes to the live replica
        assert _audio(later) == SENTENCES
    finally:
        rt.close()
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0


async def _kill_mid_load(rt: Runtime) -> tuple[dict[str, set[str]], dict[str, Any]]:
    """Eight requests; once every one is routed and an audio chunk came, replica 2's actor is
    killed. Returns the requests routed to each replica and each one's events (or error)."""
    first = asyncio.Event()

    async def one(rid: str) -> list[Any]:
        events = []
        async for e in rt.stream(as_request(TEXT), request_id=rid, entry="voice"):
            events.append(e)
            if isinstance(e, AudioChunk):
                first.set()
        return events

    rids = [f"r{i}" for i in range(CONCURRENT)]
    tasks = [asyncio.create_task(one(rid)) for rid in rids]
    deadline = time.monotonic() + WAIT_S
    while len(rt.picks) < CONCURRENT and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    routed: dict[str, set[str]] = {"voice#0": set(), "voice#1": set()}
    for rid in rids:
        routed[rt.picks[rid]["voice"].holder].add(rid)
    await asyncio.wait_for(first.wait(), WAIT_S)
    rt.kill_replica("voice", 1)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return routed, dict(zip(rids, results, strict=True))


def _wait_for_holders(rt: Runtime, ok: Any) -> list[str]:
    deadline = time.monotonic() + WAIT_S
    holders = list(rt.ledger_snapshot()["holders"])
    while not ok(holders) and time.monotonic() < deadline:
        time.sleep(0.05)
        holders = list(rt.ledger_snapshot()["holders"])
    return holders


@pytest.mark.slow
def test_every_replica_dead_refuses_the_request_naming_the_stage(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = _start(tmp_path, ("igpu:0", "npu:0"), work_s=0.0, restart="never")
    try:
        rt.kill_replica("voice", 0)
        rt.kill_replica("voice", 1)
        # no request is needed to notice: the supervisor's watch on each actor fails at once
        deadline = time.monotonic() + WAIT_S
        while not all(rt.devices[k].dead for k in ("igpu:0", "npu:0")):
            assert time.monotonic() < deadline, "the deaths were not noticed"
            time.sleep(0.01)
        for i in (0, 1):  # refused before anything is sent, naming both replicas' devices
            with pytest.raises(StageFailed) as info:
                asyncio.run(_one(rt, f"k{i}"))
            assert (info.value.stage, info.value.code) == ("voice", "device_actor_died")
            assert "the device actors of all 2 replicas died earlier (igpu:0, npu:0)" in (
                info.value.cause
            )
    finally:
        rt.close()


def test_the_least_loaded_replica_is_picked_ties_in_turn_and_a_dead_one_never() -> None:
    refs = [ReplicaRef("voice", i, 3, f"voice#{i}", d, d) for i, d in enumerate("abc")]
    b = Balancer({"voice": refs}, {"a": 2, "b": 2, "c": 2})
    picks = [b.pick(["voice"]) for _ in range(3)]
    assert [p["voice"].holder for p in picks] == ["voice#0", "voice#1", "voice#2"]
    b.release(picks[1])  # voice#1 is now the least loaded
    assert b.pick(["voice"])["voice"].holder == "voice#1"
    b.mark_dead("c")
    held = [b.pick(["voice"])["voice"].holder for _ in range(2)]
    assert "voice#2" not in held
    assert b.in_flight == {"voice#0": 2, "voice#1": 2, "voice#2": 1}
    b.mark_dead("a")
    b.mark_dead("b")
    assert b.pick(["voice"]) == {}  # none live: the runtime refuses the request first


def test_a_conversation_stays_on_its_replica_of_a_sticky_stage_while_it_lives() -> None:
    refs = [ReplicaRef("talker", i, 2, f"talker#{i}", d, d) for i, d in enumerate("ab")]
    b = Balancer({"talker": refs, "voice": refs}, {"a": 4, "b": 4}, sticky=["talker"])
    first = b.pick(["talker"], "sess-1")["talker"]
    b.release({"talker": first})
    b.in_flight[first.holder] += 3  # three other requests on it: the busier one
    for _ in range(3):  # the session stays anyway
        turn = b.pick(["talker"], "sess-1")
        assert turn["talker"] == first
        b.release(turn)
    b.mark_dead(first.key)  # its replica died: the next turn goes to a live one, and stays
    moved = b.pick(["talker"], "sess-1")["talker"]
    assert moved != first and b.pick(["talker"], "sess-1")["talker"] == moved


def test_only_a_sticky_stage_keeps_a_conversation_and_the_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.runtime import balance

    monkeypatch.setattr(balance, "CONVERSATIONS", 3)
    refs = [ReplicaRef("voice", i, 2, f"voice#{i}", d, d) for i, d in enumerate("ab")]
    b = Balancer({"voice": refs}, {"a": 4, "b": 4})  # no sticky stage: every turn balanced
    assert [b.pick(["voice"], "sess")["voice"].index for _ in range(2)] == [0, 1]
    s = Balancer({"voice": refs}, {"a": 4, "b": 4}, sticky=["voice"])
    for i in range(5):
        s.pick(["voice"], f"sess-{i}")
    assert [c for _, c in s.conversations] == ["sess-2", "sess-3", "sess-4"]


def test_an_omni_talker_keeps_its_conversation_on_one_replica_and_other_stages_do_not() -> None:
    from types import SimpleNamespace

    from stages.registry import get_kind

    kind = get_kind("ar_decode")
    assert kind.replica_affinity(SimpleNamespace(model_stage="talker")) == "conversation"  # type: ignore[arg-type]
    assert kind.replica_affinity(SimpleNamespace(model_stage="thinker")) == "request"  # type: ignore[arg-type]
    assert kind.replica_affinity(SimpleNamespace(model_stage=None)) == "request"  # type: ignore[arg-type]
    assert get_kind("echo").replica_affinity(SimpleNamespace()) == "request"  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_config_with_replicas_plans_and_runs_two_processes_on_one_device(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``Pipeline.from_config`` (the planner, ``admit_plan``): the echo kind runs on
    the CPU only, so both replicas land there, the second in its own actor (``cpu#1``); a
    conversation's turns stay on one replica of a sticky stage; their one calibration key
    records the larger of their peaks."""
    from orchestrator import calibration as cal
    from orchestrator.api import Pipeline
    from orchestrator.core.units import GiB, MiB
    from tests.helpers.profiles import make_profile

    (tmp_path / "voice.yaml").write_text(
        "name: echo-replicas\n"
        "stages:\n"
        "  - {name: voice, kind: echo, mode: tone, inputs: [request], devices: [cpu],\n"
        f"     replicas: 2, work_s: {WORK_S}, work_slots: 1,\n"
        "     final_output: true, final_output_type: audio}\n"
    )
    (tmp_path / "profile.json").write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    store = cal.CalibrationStore(tmp_path / "cal")
    p = Pipeline.from_config(
        tmp_path / "voice.yaml", profile=tmp_path / "profile.json", record=None, calibration=store
    )
    try:
        assert [(r.holder, r.device) for r in p.plan.stage("voice").placements()] == [
            ("voice#0", "cpu"),
            ("voice#1", "cpu"),
        ]
        p.start()
        assert p.runtime.actor_keys() == ["cpu", "cpu#1"]
        pids = {dev.info["pid"] for dev in p.runtime.devices.values()}
        assert len(pids) == 2  # two processes

        async def load() -> list[Any]:
            return list(await asyncio.gather(*(p.arun(TEXT) for _ in range(4))))

        results = asyncio.run(load())
        assert all(r.audio is not None and r.audio.size for r in results)
        assert p.runtime.balancer.served == {"voice#0": 2, "voice#1": 2}
        assert {"voice#0", "voice#1"} <= set(p.ledger_snapshot()["holders"])
        # a stage that keeps state across turns (StageKind.replica_affinity "conversation",
        # an Omni talker's) serves every turn of a conversation on one replica
        monkeypatch.setattr(p.runtime.balancer, "sticky", frozenset({"voice"}))
        before = dict(p.runtime.balancer.served)

        async def turns(conversation: str) -> None:
            for _ in range(3):
                await p.arun(TEXT, conversation=conversation)

        asyncio.run(turns("c1"))
        took = {h: n - before[h] for h, n in p.runtime.balancer.served.items()}
        assert sorted(took.values()) == [0, 3]  # all three turns on one replica
        # one calibration key (same device, backend, engine): one sample, the larger peak
        measured = p.runtime.measure()
        assert set(measured) == {"voice#0", "voice#1"}
        peaks = {"voice#0": 100 * MiB, "voice#1": 150 * MiB}
        fixed = {h: {**m, "measured_peak_bytes": peaks[h]} for h, m in measured.items()}
        monkeypatch.setattr(p.runtime, "measure", lambda: fixed)
        recorded = [r for r in p.record_calibration() if r["stage"] == "voice"]
        assert [r["peak_bytes"] for r in recorded] == [150 * MiB]
    finally:
        monkeypatch.undo()
        final = p.close()
    assert not final.get("held_bytes")
