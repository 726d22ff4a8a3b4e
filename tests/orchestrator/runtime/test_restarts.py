"""A dead device actor comes back: restarted on its placement by the runtime's supervisor,
bounded by its stage's ``restart``, the ledger exact after each (``runtime/supervisor.py``).

Real Ray, real processes killed with SIGKILL (what the OOM killer sends). The echo pipeline's
voice runs alone in its actor (``igpu:0``), so killing it leaves the thinker's untouched.
Every step is ordered by construction: the voice's ``gate_file`` holds a request mid-reply, its
``load_waiting_file`` says a load has begun (and in which process), its ``crash_file`` makes
every load crash, and the supervisor's hooks run at a restart's steps. Waits poll for a state
with generous deadlines; no wall-clock bound is asserted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import StageFailed
from orchestrator.runtime.events import AudioChunk
from orchestrator.runtime.runtime import Runtime
from stages.requests import as_request
from tests.helpers.echo import echo_pipeline

pytestmark = pytest.mark.ray

WAIT_S = 90.0
"""The longest a restart may take here: a new actor's start and a load, on a loaded 2-core box."""
FAST = {"backoff_s": 0.2, "backoff_max_s": 0.5}
"""A short back-off: these tests wait for restarts, not for the default's seconds."""


def _start(tmp_path: Path, **voice: Any) -> Runtime:
    plan, config = echo_pipeline(
        tmp_path,
        voice={"restart": {"max": 5, "window_s": 600, **FAST}, **voice},
        voice_device="igpu:0",
    )
    rt = Runtime(plan, config)
    rt.start()
    return rt


def _until(what: str, ok: Any, wait_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + wait_s
    while not ok():
        assert time.monotonic() < deadline, f"not within {wait_s:g} s: {what}"
        time.sleep(0.02)


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _voice_pid(rt: Runtime) -> int:
    return int(rt.devices["igpu:0"].info["pid"])


def _state(rt: Runtime) -> Any:
    assert rt.supervisor is not None
    return rt.supervisor.states["igpu:0"]


def _held(rt: Runtime) -> tuple[int, dict[str, int]]:
    """The ledger's held bytes, and each holder's bytes."""
    snap = rt.ledger_snapshot()
    held = {h: sum(int(r["bytes"]) for r in rs) for h, rs in snap["holders"].items()}
    return int(snap["held_bytes"]), held


async def _events(rt: Runtime, prompt: str) -> list[Any]:
    return [e async for e in rt.stream(as_request(prompt))]


def _served_with_audio(rt: Runtime, prompt: str = "again") -> list[Any]:
    events = asyncio.run(_events(rt, prompt))
    assert any(isinstance(e, AudioChunk) for e in events), events
    return events


def test_an_idle_device_actor_killed_is_restarted_and_the_ledger_is_exact(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = _start(tmp_path)
    try:
        _served_with_audio(rt, "first")
        before = _held(rt)
        old, thinker = _voice_pid(rt), int(rt.devices["cpu"].info["pid"])
        _kill(old)
        # noticed with no request: the supervisor's watch on the actor fails at once
        _until("the death noticed", lambda: rt.devices["igpu:0"].dead is not None)
        assert rt.devices["igpu:0"].code == "stage_restarting"
        _until("restarted", lambda: _state(rt).state == "up" and _state(rt).revived == 1)
        assert _voice_pid(rt) != old and int(rt.devices["cpu"].info["pid"]) == thinker
        assert _held(rt) == before  # released once at the death, taken once again
        events = _served_with_audio(rt)
        done = {e.stage: e.stats for e in events if getattr(e, "kind", "") == "done"}
        assert done["voice"]["restarted"]["restarts"] == 1 and "restarted" not in done["thinker"]
        assert rt.supervisor is not None
        assert dict(rt.supervisor.counts) == {("voice", "device_actor_died"): 1}
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0


def test_a_request_in_flight_on_the_dead_actor_ends_at_once_and_frees_its_slot(
    ray_cluster: Any, tmp_path: Path
) -> None:
    gate, waiting = tmp_path / "gate", tmp_path / "waiting"
    rt = _start(tmp_path, gate_file=str(gate), waiting_file=str(waiting))
    try:

        async def doomed() -> BaseException | None:
            try:
                async for _ in rt.stream(as_request("doomed")):
                    if waiting.exists() and not rt.devices["igpu:0"].dead:
                        _kill(_voice_pid(rt))  # the voice holds its last chunk: mid-reply
            except StageFailed as exc:
                return exc
            return None

        exc = asyncio.run(doomed())
        assert isinstance(exc, StageFailed), exc
        assert (exc.stage, exc.device, exc.code) == ("voice", "igpu:0", "stage_restarting")
        assert "is being restarted" in exc.cause
        assert rt.admission.in_flight == 0 and not rt.picks  # its slot is free
        gate.touch()
        _served_with_audio(rt)  # waits for the voice to come back, then is served
    finally:
        rt.close()


def test_a_request_waits_for_a_stage_coming_back_and_past_the_admission_wait_is_refused(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rt = _start(tmp_path)
    held = threading.Event()
    release = threading.Event()
    assert rt.supervisor is not None

    def hold(key: str, info: dict[str, Any]) -> None:  # the restart waits here
        held.set()
        assert release.wait(WAIT_S)

    rt.supervisor.hooks["actor_ready"] = hold
    try:
        _kill(_voice_pid(rt))
        assert held.wait(WAIT_S), "the restart never began"
        rt.admission.wait_timeout_s = 0.5
        with pytest.raises(StageFailed) as info:  # no slot held; refused past the wait
            asyncio.run(_events(rt, "too soon"))
        assert info.value.code == "stage_restarting" and "not back within" in info.value.cause
        rt.admission.wait_timeout_s = WAIT_S
        done: list[Any] = []
        waiter = threading.Thread(target=lambda: done.append(_served_with_audio(rt, "patient")))
        waiter.start()
        _until("the request waits for the voice", lambda: rt.waiting_for_stages == 1)
        assert rt.admission.in_flight == 0  # it waits holding no slot
        release.set()
        waiter.join(WAIT_S)
        assert done and rt.waiting_for_stages == 0
    finally:
        release.set()
        rt.close()


@pytest.mark.parametrize("step", ["actor_ready", "retaken"])
def test_an_actor_killed_between_the_release_and_the_retake_is_held_exactly_once(
    ray_cluster: Any, tmp_path: Path, step: str
) -> None:
    """The dead actor's holders were released at its death; the restart's new actor is killed
    before the ledger takes them again (``actor_ready``) or right after (``retaken``). The
    attempt gives back what it took, the next one takes it again: the ledger ends as before."""
    rt = _start(tmp_path)
    killed: list[int] = []
    assert rt.supervisor is not None

    def kill_once(key: str, info: dict[str, Any]) -> None:
        if not killed:
            killed.append(int(info["pid"]))
            _kill(int(info["pid"]))

    rt.supervisor.hooks[step] = kill_once
    try:
        before = _held(rt)
        _kill(_voice_pid(rt))
        _until("restarted after the failed attempt", lambda: _state(rt).revived == 1)
        st = _state(rt)
        assert killed and st.restarts == 2 and len(st.deaths) == 2
        assert "restart attempt 1 failed" in st.cause
        assert _held(rt) == before
        # killed before the retake, the attempt never took it; killed after, it had, and gave
        # it back: either way the next attempt's retake is the one that holds
        events = [e["event"] for e in rt.ledger_snapshot()["events"] if e["holder"] == "voice"]
        assert events.count("retake") == {"actor_ready": 1, "retaken": 2}[step], events
        _served_with_audio(rt)
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0


def test_an_actor_killed_while_it_loads_again_is_restarted_once_more(
    ray_cluster: Any, tmp_path: Path
) -> None:
    loading = tmp_path / "loading"
    rt = _start(tmp_path, load_s=3.0, load_waiting_file=str(loading))
    try:
        before = _held(rt)
        loading.unlink()
        _kill(_voice_pid(rt))
        _until("the restart's load began", loading.exists)
        _kill(int(loading.read_text()))  # the new actor, while it loads the voice again
        _until("restarted on the second attempt", lambda: _state(rt).revived == 1)
        st = _state(rt)
        assert st.restarts == 2 and "restart attempt 1 failed" in st.cause
        assert "died" in st.cause
        assert _held(rt) == before
        _served_with_audio(rt)
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0


def test_a_crash_loop_reaches_its_limit_and_stays_down_named(
    ray_cluster: Any, tmp_path: Path
) -> None:
    crash = tmp_path / "crash"
    plan, config = echo_pipeline(
        tmp_path,
        voice={"restart": {"max": 2, "window_s": 600, **FAST}, "crash_file": str(crash)},
        voice_device="igpu:0",
    )
    rt = Runtime(plan, config)
    rt.start()
    try:
        thinker_held = _held(rt)[1]["thinker"]
        crash.touch()  # from now on every load of the voice crashes its process
        _kill(_voice_pid(rt))
        _until("the crash loop", lambda: _state(rt).state == "crash_loop")
        st = _state(rt)
        assert st.restarts == 2 and len(st.deaths) == 3 and st.revived == 0
        assert "restart attempt 2 failed" in st.cause
        assert rt.supervisor is not None
        assert dict(rt.supervisor.counts) == {("voice", "device_actor_died"): 2}
        with pytest.raises(StageFailed) as info:  # at once: it is not coming back
            asyncio.run(_events(rt, "anyone?"))
        assert (info.value.stage, info.value.code) == ("voice", "crash_loop")
        held = _held(rt)[1]
        assert "voice" not in held and held["thinker"] == thinker_held
        assert rt.waiting_for_stages == 0 and rt.admission.in_flight == 0
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0


def _fallback(tmp_path: Path, devices: list[str], **voice: Any) -> Runtime:
    """The voice on ``igpu:0`` with ``on_device_loss: fallback`` over ``devices``, and a
    profile to plan it again on (this machine's CPU, as ``make_profile`` writes it)."""
    from orchestrator.core.units import GiB
    from orchestrator.runtime.fallback import replanner
    from tests.helpers.profiles import make_profile

    plan, config = echo_pipeline(
        tmp_path,
        voice={"devices": devices, "on_device_loss": "fallback", "restart": {**FAST}, **voice},
        voice_device="igpu:0",
    )
    rt = Runtime(plan, config, replan=replanner(config, make_profile(ram_available=8 * GiB)))
    rt.start()
    return rt


def test_a_device_masked_away_after_load_moves_its_stage_to_the_next_device(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """The voice runs on ``igpu:0``; then the device is gone (masked away, as a probe that no
    longer finds it says) and its actor dies: the voice is planned again alone, onto ``cpu``,
    the next device of its list, in an actor of its own, through the live ledger; said."""
    rt = _fallback(tmp_path, ["igpu:0", "cpu"])
    try:
        _served_with_audio(rt, "first")
        before = _held(rt)
        rt.lose_device("igpu:0", "masked away: the probe no longer finds it")
        _kill(_voice_pid(rt))
        assert rt.supervisor is not None
        _until("the move", lambda: len(rt.supervisor.moves) == 1)  # type: ignore[union-attr]
        (moved,) = rt.supervisor.moves
        assert (moved["stage"], moved["from"], moved["to"]) == ("voice", "igpu:0", "cpu")
        assert "masked away" in moved["why"]
        assert rt.plan.stage("voice").device == "cpu" and rt.refs["voice"].key == "cpu#1"
        assert not rt.devices["cpu#1"].dead and rt.devices["igpu:0"].dead
        assert _state(rt).state == "lost" and _state(rt).restarts == 0  # never restarted there
        assert _held(rt) == before  # the same reservations, now on the CPU's actor
        events = _served_with_audio(rt)
        done = {e.stage: e.stats for e in events if getattr(e, "kind", "") == "done"}
        assert done["voice"]["device"] == "cpu"
        assert done["voice"]["restarted"]["moved_from"] == "igpu:0"
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0


def test_a_fallback_that_fits_nowhere_is_refused_named_and_holds_nothing(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """The next device of the list is one this machine does not have: the stage is refused
    with the planner's code, stays down, and the ledger holds nothing of it."""
    rt = _fallback(tmp_path, ["igpu:0", "npu:0"])
    try:
        rt.lose_device("igpu:0", "masked away")
        _kill(_voice_pid(rt))
        assert rt.supervisor is not None
        _until("the fallback refused", lambda: "the fallback failed" in _state(rt).cause)
        assert "no other device of its list takes it" in _state(rt).cause
        assert "npu:0: no_runnable_device" in _state(rt).cause
        assert not rt.supervisor.moves and not rt.supervisor.moving
        with pytest.raises(StageFailed) as info:
            asyncio.run(_events(rt, "anyone?"))
        assert (info.value.stage, info.value.code) == ("voice", "device_actor_died")
        assert "voice" not in _held(rt)[1]
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0


def test_stages_that_fit_again_only_one_at_a_time_are_taken_and_loaded_one_at_a_time(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Both stages on one actor; the pool is filled (a holder of the test's own) so that, once
    they are released at the death, they fit again each at its load peak one after another but
    not both at their load peaks at once. The restart takes and loads them in turn (as a
    start that needed two waves), never refusing what fits."""
    from orchestrator.core.units import MiB

    plan, config = echo_pipeline(
        tmp_path,
        thinker={"restart": {"max": 5, "window_s": 600, **FAST}},
        voice={"restart": {"max": 5, "window_s": 600, **FAST}},
        voice_device="cpu",
    )
    rt = Runtime(plan, config)
    rt.start()
    try:
        import ray

        (pool,) = [p for p in rt.ledger_snapshot()["pools"] if p["id"] == "host_ram"]
        # after the death both stages' steady bytes are free again; leave 24 MiB beyond them:
        # one load transient (16 MiB) fits, two (32 MiB) do not
        squat = pool["capacity_bytes"] - pool["peak_bytes"] - 24 * MiB
        squatter = {"pool": "host_ram", "purpose": "test", "bytes": squat, "lifetime": "session"}
        assert ray.get(rt.ledger.admit.remote("squatter", [{**squatter, "evidence": "E"}]))["ok"]
        before = _held(rt)
        _kill(int(rt.devices["cpu"].info["pid"]))
        assert rt.supervisor is not None
        _until("restarted", lambda: rt.supervisor.states["cpu"].revived == 1)  # type: ignore[union-attr]
        assert rt.supervisor.states["cpu"].restarts == 1  # no failed attempt
        events = [(e["event"], e["holder"]) for e in rt.ledger_snapshot()["events"]]
        assert events[-8:] == [
            ("release:all", "thinker"),  # the death
            ("release:all", "voice"),
            ("refuse", "thinker"),  # both at their load peaks: no
            ("refuse", "voice"),
            ("retake", "thinker"),  # one, loaded, its transient released
            ("release:load", "thinker"),
            ("retake", "voice"),  # then the other
            ("release:load", "voice"),
        ], events[-10:]
        assert _held(rt) == before
        _served_with_audio(rt)
        ray.get(rt.ledger.release.remote("squatter"))
    finally:
        final = rt.close()
    assert final["held_bytes"] == 0
